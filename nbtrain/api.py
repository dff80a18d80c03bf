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
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbtrain import __version__, registry, rewards, trainargs
from nbtrain.config import Resolved, load_config, planned_problems, problems_error
from nbtrain.distributed import (
    deepspeed_config,
    free_port,
    node_argv,
    read_hostfile,
    slurm_script,
    write_launch_files,
)
from nbtrain.errors import NbtrainError
from nbtrain.hardware import Hardware
from nbtrain.hardware import probe as probe_hardware
from nbtrain.launch import LaunchFailed, spawn, worker_env
from nbtrain.plan import Plan, make_plan, train_args
from nbtrain.preset import find_preset
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
    rewards: bytes | None = None  # GRPO: the reward functions, cloudpickled; start() writes rewards.pkl

    @property
    def name(self) -> str:
        cfg = self.resolved.config
        objective = "" if cfg.objective == "sft" else f"-{cfg.objective}"
        return cfg.name or f"{Path(cfg.model).name}-{cfg.method}{objective}"

    def to_dict(self) -> dict[str, Any]:
        r = self.resolved
        return {
            "nbtrain_version": __version__,
            "name": self.name,
            "config": r.config.model_dump(mode="json"),
            "model_kind": r.model_kind,
            "data": {
                "train": asdict(r.train_data),
                "eval": asdict(r.eval_data) if r.eval_data else None,
                "sources": [asdict(s) for s in r.train_sources or [r.train_data]],
            },
            "train_args": self.train_args,
            "plan": self.plan.to_dict(),
            "hardware": self.hardware.to_dict(),
            "estimate": self.plan.estimate,
            "notes": r.notes,
        }

    def summary(self) -> str:
        cfg = self.resolved.config
        lines = [
            f"nbtrain dry run: {self.name} (nothing started)",
            f"  model:     {cfg.model} ({self.resolved.model_kind})",
            f"  method:    {cfg.method}",
            f"  objective: {cfg.objective}"
            + (f" (rewards: {', '.join(cfg.rewards)})" if cfg.rewards else ""),
            f"  data:      {self.resolved.train_data.location} "
            f"[{self.resolved.train_data.kind}, {self.resolved.train_data.format}]",
            f"  plan:      {self.plan.nodes} node(s) x {self.plan.num_processes} process(es) on "
            f"{self.plan.device}, strategy {self.plan.strategy}, {self.plan.precision}, "
            f"launcher {self.plan.launcher}",
        ]
        lines += [f"    - {r}" for r in self.plan.reasons]
        lines += [f"  warning:   {w}" for w in self.plan.warnings]
        est = self.plan.estimate
        if est is not None:
            parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in est["parts"].items() if v)
            where = "per GPU" if est["device"] == "cuda" else "of RAM"
            lines.append(f"  memory:    ~{est['per_device_bytes'] / 2**30:.2f} GiB {where} of "
                         f"{est['capacity_bytes'] / 2**30:.1f} GiB ({parts} GiB)")  # fmt: skip
            if est.get("cpu_bytes"):
                lines.append(f"             host RAM ~{est['cpu_bytes'] / 2**30:.2f} GiB per node")
        if not self.plan.fits:
            lines.append(f"  DOES NOT FIT: {self.plan.fit_advice}")
        lines.append("  resolved config:")
        lines += ["    " + ln for ln in json.dumps(self.to_dict()["config"], indent=2).splitlines()]
        if self.plan.deepspeed is not None:
            lines.append("  deepspeed.json:")
            lines += ["    " + ln for ln in json.dumps(self.plan.deepspeed, indent=2).splitlines()]
        lines.append(f"  train args ({trainargs.config_name(cfg.objective)}):")
        lines += [f"    {k}: {v!r}" for k, v in sorted(self.train_args.items())]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.summary())}</pre>"


def prepare(
    config: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    hardware: Hardware | None = None,
    namespace: Mapping[str, Any] | None = None,
    capture_rewards: bool = True,
    enforce_preset: bool = True,
) -> Prepared:
    """Validate ``config`` (YAML text, a dict, or a .yaml path) and plan it. Raises ConfigError.

    A lab preset (nbtrain.preset) in force is applied; with ``enforce_preset=False`` (the estimate, which
    students use to find what fits) the rules only the plan shows, such as the memory cap, become
    warnings instead of errors.

    For objective: grpo the functions named in ``rewards:`` are looked up in ``namespace`` (default:
    the notebook's) and serialised now, so a bad name fails here, before anything starts.
    """
    preset = find_preset()  # instructor mode: nbtrain.lab.yaml here or above, or $NBTRAIN_PRESET
    res = load_config(config, name=name, preset=preset)
    payload = rewards.capture_for(res, namespace) if capture_rewards else None
    hw = hardware or probe_hardware()
    plan = make_plan(res, hw)
    if preset is not None:
        violations = preset.plan_problems(res, plan)
        if violations and enforce_preset:
            raise problems_error(res.text, violations)
        plan.warnings += [message for _, message in violations]
        res.notes.append(f"lab preset: {preset.source}")
    if res.config.method != plan.method:  # method: auto, decided by the planner
        res.config = res.config.model_copy(update={"method": plan.method})
    args = train_args(res, plan)
    planned_problems(res, args, plan.world_size)
    if plan.strategy.startswith("zero"):
        plan.deepspeed = deepspeed_config(res, plan, args)
    return Prepared(res, plan, hw, args, rewards=payload)


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
    checkpoint, that run is resumed instead of starting over. A run the estimate says cannot fit is
    refused before anything is written, naming the smallest change that would fit.
    """
    if not prep.plan.fits:
        raise NbtrainError(f"not started: {prep.plan.fit_advice}. (--dry-run shows the whole estimate.)")
    if prep.resolved.config.resume == "auto":
        earlier = _resumable(prep.name)
        if earlier is not None:
            print(f"nbtrain: resume: auto -> resuming {earlier.id} from its last complete checkpoint")
            return resume(earlier)
    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict())
    if prep.rewards is not None:  # before the worker starts: it loads them from there
        (run.dir / rewards.REWARDS_FILE).write_bytes(prep.rewards)
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
    # The run directory keeps the rewards captured at start; the notebook may no longer define them.
    prep = prepare(resolved["config"], name=run.name, capture_rewards=False)
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


@dataclass
class EstimateReport:
    """``nbtrain.estimate``: the plan's estimate, and every method x strategy on this hardware."""

    prepared: Prepared
    table: list[dict[str, Any]]

    def figure(self) -> Any:
        from nbtrain.memory import estimate_for, load_model_config
        from nbtrain.ui.estimate_chart import estimate_figure

        mc = load_model_config(self.prepared.resolved.config.model)
        if mc is None or self.prepared.plan.estimate is None:
            return None
        est = estimate_for(self.prepared.resolved.config, self.prepared.plan, mc)
        return estimate_figure(est, self.prepared.plan.estimate["capacity_bytes"])

    def text(self) -> str:
        lines = [self.prepared.summary().split("\n  resolved config:")[0]]
        if self.table:
            lines.append("  method x strategy on this machine:")
            for r in self.table:
                off = f"+{r['offload']}" if r["offload"] != "none" else ""
                verdict = "fits" if r["fits"] else "NO"
                gib = r["per_device_bytes"] / 2**30
                lines.append(
                    f"    {verdict:<5} {r['method']:<5} {r['strategy'] + off:<22} x{r['world_size']:<3} "
                    f"{gib:7.2f} GiB  {r['why']}"
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text())}</pre>"


def estimate(config: str | Path | dict[str, Any], *, hardware: Hardware | None = None) -> EstimateReport:
    """Will it fit? The memory estimate of ``config`` as planned here, and the alternatives."""
    from nbtrain import memory

    prep = prepare(config, hardware=hardware, enforce_preset=False)
    mc = memory.load_model_config(prep.resolved.config.model)
    table: list[dict[str, Any]] = []
    if mc is not None:
        req = memory.Request.from_config(
            prep.resolved.config.model_copy(update={"train": {**prep.resolved.config.train, **{
                "per_device_train_batch_size": prep.train_args.get("per_device_train_batch_size", 8)}}}),
            prep.plan.precision, mc,
        )  # fmt: skip
        table = memory.compare_table(mc, prep.hardware, req)
    return EstimateReport(prep, table)


@dataclass
class ProbeReport:
    """What a few real steps measured, against the estimate and projected to the whole run."""

    run: Run
    steps: int
    steps_per_s: float
    tokens_per_s: float | None
    peak_bytes: int  # GPU peak allocated where CUDA exists, else the worker's peak RSS
    peak_kind: str
    estimate_bytes: int | None
    total_steps: int | None

    @property
    def estimate_error(self) -> float | None:
        if not self.estimate_bytes:
            return None
        return (self.peak_bytes - self.estimate_bytes) / self.estimate_bytes

    def text(self) -> str:
        lines = [f"probe run {self.run.id}: {self.steps} steps at {self.steps_per_s:.2f} steps/s"
                 + (f", {self.tokens_per_s:.0f} tokens/s" if self.tokens_per_s else "")]  # fmt: skip
        lines.append(f"  measured peak ({self.peak_kind}): {self.peak_bytes / 2**30:.2f} GiB")
        if self.estimate_bytes:
            lines.append(f"  estimate: {self.estimate_bytes / 2**30:.2f} GiB; measured is "
                         f"{self.estimate_error:+.0%} of it")  # fmt: skip
        if self.total_steps:
            secs = self.total_steps / self.steps_per_s
            lines.append(f"  projected time for {self.total_steps} steps: {secs / 60:.1f} min")
        else:
            lines.append("  projected time: set train.max_steps to get one")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()


def probe(config: str | Path | dict[str, Any], *, name: str | None = None, steps: int = 5) -> ProbeReport:
    """A few real steps of ``config`` in a detached process: peak memory, speed, time for the whole run."""
    prep = prepare(config, name=name)
    cfg = prep.resolved.config.model_dump(mode="json")
    total = cfg["train"].get("max_steps")
    cfg["train"] = {**cfg["train"], "max_steps": steps, "save_strategy": "no", "eval_strategy": "no"}
    cfg["name"] = f"{prep.name}-probe"
    run = start(prepare(cfg))
    st = run.wait()
    m = run.metrics()
    system = read_jsonl(run.paths.system)
    gpu = [r["gpu_mem_peak"] for r in system if "gpu_mem_peak" in r]
    peak, kind = (max(gpu), "GPU max_memory_allocated") if gpu else (
        max((r["rss"] for r in system if "rss" in r), default=0), "worker RSS")  # fmt: skip
    tps = m["tokens_per_s"].dropna() if "tokens_per_s" in m else None
    est = prep.plan.estimate
    return ProbeReport(
        run, steps, float(st.summary.get("train_steps_per_second", 0.0)),
        float(tps.median()) if tps is not None and len(tps) else None, int(peak), kind,
        int(est["per_device_bytes"]) if est else None, int(total) if total and total > 0 else None,
    )  # fmt: skip


def finetune(
    config: str | Path | dict[str, Any],
    name: str | None = None,
    *,
    namespace: Mapping[str, Any] | None = None,
) -> Run:
    """Validate, plan and start a fine-tuning run in the background; returns its handle at once.
    ``namespace``: where ``rewards:`` names are looked up (default: the notebook's)."""
    return start(prepare(config, name=name, namespace=namespace))


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
