"""The control core: every surface (magics, CLI, widgets, server) calls these functions.

prepare(config)   validate + plan, no side effects        -> Prepared  (what --dry-run shows)
start(prepared)   run directory + registry + detached worker -> Run
finetune(config)  both
"""

from __future__ import annotations

import html
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbtrain import __version__, registry
from nbtrain.config import Resolved, load_config
from nbtrain.distributed import (
    deepspeed_config,
    free_port,
    node_argv,
    read_hostfile,
    slurm_script,
    write_launch_files,
)
from nbtrain.errors import NbtrainError
from nbtrain.hardware import Hardware, probe
from nbtrain.launch import LaunchFailed, spawn, worker_env
from nbtrain.plan import Plan, make_plan, train_args
from nbtrain.rundir import METRICS_SCHEMA, atomic_write_json, atomic_write_text, read_jsonl, write_status
from nbtrain.runs import Run, all_runs, create_run_dir, get_run, last_checkpoint

_LAST: list[Run] = []


@dataclass
class Prepared:
    """A validated, planned run that has not started: what ``--dry-run`` prints."""

    resolved: Resolved
    plan: Plan
    hardware: Hardware
    train_args: dict[str, Any]

    @property
    def name(self) -> str:
        cfg = self.resolved.config
        return cfg.name or f"{Path(cfg.model).name}-{cfg.method}"

    def to_dict(self) -> dict[str, Any]:
        r = self.resolved
        return {
            "nbtrain_version": __version__,
            "name": self.name,
            "config": r.config.model_dump(mode="json"),
            "model_kind": r.model_kind,
            "data": {"train": asdict(r.train_data), "eval": asdict(r.eval_data) if r.eval_data else None},
            "train_args": self.train_args,
            "plan": self.plan.to_dict(),
            "hardware": self.hardware.to_dict(),
            "estimate": None,
            "notes": r.notes,
        }

    def summary(self) -> str:
        cfg = self.resolved.config
        lines = [
            f"nbtrain dry run: {self.name} (nothing started)",
            f"  model:     {cfg.model} ({self.resolved.model_kind})",
            f"  method:    {cfg.method}",
            f"  data:      {self.resolved.train_data.location} "
            f"[{self.resolved.train_data.kind}, {self.resolved.train_data.format}]",
            f"  plan:      {self.plan.nodes} node(s) x {self.plan.num_processes} process(es) on "
            f"{self.plan.device}, strategy {self.plan.strategy}, {self.plan.precision}, "
            f"launcher {self.plan.launcher}",
        ]
        lines += [f"    - {r}" for r in self.plan.reasons]
        lines += [f"  warning:   {w}" for w in self.plan.warnings]
        lines.append("  resolved config:")
        lines += ["    " + ln for ln in json.dumps(self.to_dict()["config"], indent=2).splitlines()]
        if self.plan.deepspeed is not None:
            lines.append("  deepspeed.json:")
            lines += ["    " + ln for ln in json.dumps(self.plan.deepspeed, indent=2).splitlines()]
        lines.append("  train args (SFTConfig):")
        lines += [f"    {k}: {v!r}" for k, v in sorted(self.train_args.items())]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.summary())}</pre>"


def prepare(
    config: str | Path | dict[str, Any], *, name: str | None = None, hardware: Hardware | None = None
) -> Prepared:
    """Validate ``config`` (YAML text, a dict, or a .yaml path) and plan it. Raises ConfigError."""
    res = load_config(config, name=name)
    hw = hardware or probe()
    plan = make_plan(res, hw)
    args = train_args(res, plan)
    if plan.strategy.startswith("zero"):
        plan.deepspeed = deepspeed_config(res, plan, args)
    return Prepared(res, plan, hw, args)


def _commands(prep: Prepared, run: Run, port: int) -> list[tuple[str, list[str]]]:
    """(log file, argv) for each process to start here: one per node this machine starts."""
    plan, d = prep.plan, prep.resolved.config.distributed
    if plan.launcher == "direct":
        return [(run.paths.rank_log(0).name, node_argv(plan, run.dir, port=port))]
    if plan.nodes == 1:
        return [("launcher.log", node_argv(plan, run.dir, port=port))]
    assert d.hostfile is not None  # validated: nodes > 1 has a hostfile or slurm
    hosts = read_hostfile(d.hostfile)
    if len(hosts) < plan.nodes:
        raise NbtrainError(f"nodes: {plan.nodes} but {d.hostfile} lists {len(hosts)} host(s)")
    master = d.master_addr or ("127.0.0.1" if hosts[0].local else hosts[0].name)
    cmds = []
    for rank, host in enumerate(hosts[: plan.nodes]):
        argv = node_argv(plan, run.dir, port=port, master_addr=master, node_rank=rank)
        if not host.local:
            # The run directory must be on a filesystem every node shares (as for any multi-node job).
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in worker_env(plan.gpus).items())
            remote = f"cd {shlex.quote(str(run.dir))} && env {env} {shlex.join(argv)}"
            argv = ["ssh", "-o", "BatchMode=yes", host.name, remote]
        cmds.append((f"node{rank}.log", argv))
    return cmds


def _submit_slurm(prep: Prepared, run: Run) -> Run:
    d = prep.resolved.config.distributed
    assert d.slurm is not None
    script = run.dir / "slurm.sbatch"
    script.write_text(slurm_script(prep.plan, run.dir, d.slurm.model_dump()), encoding="utf-8")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        write_status(run.paths, "queued", note=f"sbatch not found: submit {script} on the cluster")
        print(f"sbatch is not on PATH here; submit this script on the cluster:\n  sbatch {script}\n")
        print(script.read_text(encoding="utf-8"))
        return run
    out = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        write_status(run.paths, "failed", error={"type": "slurm", "message": out.stderr.strip()})
        raise NbtrainError(f"sbatch refused {script}: {out.stderr.strip()}")
    write_status(run.paths, "queued", slurm_job=out.stdout.strip())
    print(f"submitted SLURM job {out.stdout.strip()} ({script})")
    return run


def start(prep: Prepared) -> Run:
    """Create the run directory, register it and start the detached worker(s).

    With ``resume: auto`` and an earlier run of the same name that stopped or failed after saving a
    checkpoint, that run is resumed instead of starting over.
    """
    if prep.resolved.config.resume == "auto":
        earlier = _resumable(prep.name)
        if earlier is not None:
            print(f"nbtrain: resume: auto -> resuming {earlier.id} from its last complete checkpoint")
            return resume(earlier)
    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict())
    write_launch_files(prep.plan, run.dir)
    d = prep.resolved.config.distributed
    if prep.plan.nodes > 1 and d.slurm is not None and d.hostfile is None:
        _LAST.append(run)
        return _submit_slurm(prep, run)
    return _launch(prep, run)


def _launch(prep: Prepared, run: Run) -> Run:
    d = prep.resolved.config.distributed
    port = d.master_port or free_port()
    try:
        commands = _commands(prep, run, port)
    except NbtrainError as e:
        write_status(run.paths, "failed", error={"type": "launch", "message": str(e)})
        registry.update(run.id, state="failed")
        raise
    result = spawn(run.paths, commands, worker_env(prep.plan.gpus), port=port)
    if isinstance(result, LaunchFailed):
        write_status(run.paths, "failed", error={"type": "launch", "message": result.reason})
        registry.update(run.id, state="failed")
        raise NbtrainError(f"run {run.id} could not start: {result.reason}")
    registry.update(run.id, state="starting", pid=result.pid)
    _LAST.append(run)
    return run


def _resumable(name: str) -> Run | None:
    for row in reversed(registry.rows()):
        if row.name != name:
            continue
        run = Run(row.run_dir, run_id=row.id, name=row.name)
        if run.paths.root.is_dir() and run.status().state in ("stopped", "failed") and last_checkpoint(run):
            return run
        return None  # only the newest run of that name is a candidate
    return None


def resume(ref: str | Path | Run) -> Run:
    """Continue a stopped or failed run from its last *complete* checkpoint, in the same run directory.

    The Trainer restores weights, optimizer, scheduler, RNG state and the data position. Metrics the
    earlier attempt logged after that checkpoint are moved to ``metrics.attempt<N>.jsonl`` (kept,
    marked, not mixed into the curve). Incomplete checkpoints (killed while written) are deleted.
    """
    run = get_run(ref)
    st = run.status()
    if not st.done:
        raise NbtrainError(f"run {run.id} is {st.state}; stop it before resuming")
    if st.state == "completed":
        raise NbtrainError(f"run {run.id} completed; nothing to resume (start a new run to train further)")
    ckpt = last_checkpoint(run, prune=True)
    if ckpt is None:
        raise NbtrainError(f"run {run.id} has no complete checkpoint to resume from; start it again")
    step = int(ckpt.name.split("-")[1])
    resolved = run.resolved
    attempt = int(resolved.get("resume", {}).get("attempt", 1)) + 1
    _set_aside_metrics(run, step, attempt - 1)
    prep = prepare(resolved["config"], name=run.name)
    new_resolved = {**resolved, "resume": {"from": str(ckpt), "step": step, "attempt": attempt}}
    atomic_write_json(run.paths.resolved, new_resolved)
    write_launch_files(prep.plan, run.dir)
    for f in ("stop", "checkpoint"):
        run.paths.control_file(f).unlink(missing_ok=True)
    write_status(run.paths, "queued", step=step, resumed_from=step, attempt=attempt)
    return _launch(prep, run)


def _set_aside_metrics(run: Run, step: int, attempt: int) -> None:
    """Keep metrics up to ``step``; move later ones (the lost part of the attempt) to their own file."""
    keep: list[dict[str, Any]] = []
    later: list[dict[str, Any]] = []
    for rec in read_jsonl(run.paths.metrics):
        (later if rec.get("step", 0) > step else keep).append(rec)
    if later:
        with open(run.dir / f"metrics.attempt{attempt}.jsonl", "a", encoding="utf-8") as f:
            for rec in later:
                f.write(json.dumps({**rec, "superseded_by_resume_at": step}) + "\n")
    header = json.dumps({"schema": METRICS_SCHEMA, "kind": "metrics"})
    text = "\n".join([header, *(json.dumps(r) for r in keep)]) + "\n"
    atomic_write_text(run.paths.metrics, text)


def finetune(config: str | Path | dict[str, Any], name: str | None = None) -> Run:
    """Validate, plan and start a fine-tuning run in the background; returns its handle at once."""
    return start(prepare(config, name=name))


def runs() -> list[Run]:
    """All known runs, oldest first."""
    return all_runs()


def last_run() -> Run:
    """The run this process started most recently."""
    if not _LAST:
        raise NbtrainError("no run was started from this process yet")
    return _LAST[-1]


def make_tiny_model(path: str | Path = "tiny-llama") -> Path:
    """Build the tiny local model (see nbtrain.testing) in a subprocess, keeping torch out of the kernel."""
    out = Path(path).expanduser().resolve()
    if (out / "config.json").exists():
        return out
    proc = subprocess.run(
        [sys.executable, "-m", "nbtrain.testing", "model", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise NbtrainError(f"building the tiny model failed:\n{proc.stderr[-3000:]}")
    return out


def example_data(path: str | Path = "data/add.jsonl", fmt: str = "messages", n: int = 400) -> Path:
    """Write the addition dataset (the demo's data) in one of the supported formats."""
    import shutil
    from importlib import resources

    from nbtrain.testing import write_dataset

    out = Path(path)
    if (fmt, n) == ("messages", 400):  # the dataset shipped in the package
        out.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(resources.files("nbtrain").joinpath("assets/add.jsonl")) as src:
            shutil.copyfile(src, out)
        return out.resolve()
    return write_dataset(out, fmt, n).resolve()


__all__ = [
    "Prepared",
    "Run",
    "example_data",
    "finetune",
    "get_run",
    "last_run",
    "make_tiny_model",
    "prepare",
    "runs",
    "start",
]
