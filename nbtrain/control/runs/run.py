"""Runs: create a run directory, find runs, read their state and metrics, stop and wait for them.

``Run`` is the handle every surface returns. It holds only the run directory's path; every call reads
the directory again, so a handle made in another kernel (or after a restart) sees the same run.
"""

from __future__ import annotations

import contextlib
import errno
import html
import math
import os
import re
import secrets
import shutil
import signal
import sqlite3
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError, RunFailed, RunNotFound
from nbtrain.contract.paths import runs_root
from nbtrain.contract.rundir import (
    ACTIVE_STATES,
    MAX_JSON_BYTES,
    STATES,
    TERMINAL_STATES,
    NotRegularFile,
    RunPaths,
    atomic_write_json,
    checkpoint_step,
    latest_complete_checkpoint,
    lock_run,
    read_json,
    request_control,
    tail_text,
    write_status,
)
from nbtrain.control.launch import process
from nbtrain.control.runs import registry
from nbtrain.control.runs.follow import follow

EXIT_WAIT = 30.0  # seconds Run.wait gives a finished run's processes to exit (a GPU's teardown takes some)
# A stop waits for the step in progress (1.5 x the measured step time) and its checkpoint (this allowance),
# and never less than STOP_GRACE, before it kills the run's processes.
STOP_GRACE = 60.0
CHECKPOINT_ALLOWANCE = 60.0

if TYPE_CHECKING:
    import pandas as pd

LOST_MESSAGE = (
    "the run's processes ended without writing a final state (killed, out of memory, or the "
    "machine restarted)"
)


@dataclass
class RunStatus:
    state: str
    step: int = 0
    max_steps: int | None = None
    error: dict[str, Any] | None = None
    updated: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    # While starting: what the worker is doing ("downloading model", "loading model"), and for a download
    # {repo, done, total, rate (bytes/s), files}.
    phase: str | None = None
    download: dict[str, Any] | None = None
    # A SLURM run's job as SLURM has it (control/launch/slurm.py): job, state, reason, start, nodes, words...
    slurm: dict[str, Any] | None = None
    # A Ray run's job as Ray's Jobs API has it (control/launch/rayjobs.py): job, status, message, words...
    ray: dict[str, Any] | None = None
    # The worker's step timing (the median of its last steps' wall seconds, when the last one ended), and
    # whether a stop was asked for and is not done yet: what a stop waits for and says.
    step_seconds: float | None = None
    step_ended: float | None = None
    steps_timed: int = 0  # steps of this attempt the worker has timed (the time left needs two)
    stop_asked: bool = False
    stop_reason: str | None = None  # once stopped: who asked ("user", "sidebar", a signal's name)

    def stop_grace(self) -> float:
        """Seconds a stop waits for the step in progress and its checkpoint before it kills the run's
        processes: a slow step (a real model on a busy CPU: 70 s) is waited for, never thrown away."""
        floor = _env_float("NBTRAIN_STOP_GRACE") or STOP_GRACE
        floor = floor if floor > 0 else STOP_GRACE
        if self.step_seconds is None:
            return floor
        return max(floor, 1.5 * self.step_seconds + CHECKPOINT_ALLOWANCE)

    def stop_text(self, now: float | None = None) -> str | None:
        """A stop under way, for a person: "stopping after step 21, ~70 s"; None when none is."""
        if not self.stop_asked or self.state not in ("running", "stopping"):
            return None
        if self.state == "stopping":
            return f"stopping: saving a checkpoint at step {self.step}"
        if self.step_seconds is None or self.step_ended is None:
            return f"stopping after step {self.step + 1}"
        left = self.step_ended + self.step_seconds - (time.time() if now is None else now)
        return f"stopping after step {self.step + 1}, {_duration(left)}"

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    def phase_text(self) -> str | None:
        """What a starting run is doing, for a person: "downloading model org/x 3.1 / 15.2 GB, 40 MB/s";
        a queued SLURM run, what SLURM says: "SLURM job 12 pending (Resources)"; a stop under way: "stopping
        after step 21, ~70 s"."""
        if (stopping := self.stop_text()) is not None:
            return stopping
        if self.state == "queued" and self.slurm and self.slurm.get("words"):
            return str(self.slurm["words"])
        if self.state == "queued" and (self.phase or (self.ray and self.ray.get("words"))):
            return self.phase or str((self.ray or {})["words"])  # a Ray run: what its job waits for
        if self.state != "starting" or not self.phase:
            return None
        d = self.download or {}
        if d.get("unit") == "tensors" and d.get("total"):  # converting a GGUF file (worker/gguf.py)
            return f"{self.phase} {d.get('repo', '')}: {d.get('done', 0)}/{d['total']} tensors"
        if self.phase.startswith("downloading") and d.get("total"):
            return (f"{self.phase} {d.get('repo', '')} {_bytes(d.get('done', 0), d['total'])}, "
                    f"{_bytes(d.get('rate') or 0)}/s")  # fmt: skip
        return self.phase

    def describe(self) -> str:
        phase = self.phase_text()
        if phase is not None:
            return f"{self.state}: {phase}"
        prog = f"step {self.step:,}/{self.max_steps:,}" if self.max_steps else f"step {self.step:,}"
        s = f"{self.state} ({prog})"
        if self.error:
            s += f": {self.error.get('type', 'error')}: {self.error.get('message', '')}"
        return s


def _bytes(n: float, total: float | None = None) -> str:
    """Bytes for a person: "3.1 / 15.2 GB", "840 MB", in the unit of ``total`` when given."""
    scale = total if total is not None else n
    unit, div = next(((u, d) for u, d in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if scale >= d), ("B", 1.0))

    def fmt(v: float) -> str:
        return f"{v / div:.1f}" if v / div < 100 and div > 1 else f"{v / div:.0f}"

    return f"{fmt(n)} / {fmt(total)} {unit}" if total is not None else f"{fmt(n)} {unit}"


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ.get(name, ""))
    except ValueError:
        return None


def _duration(seconds: float) -> str:
    """Time left for a person: "~70 s", "~3 min", "any moment now"."""
    if seconds < 2:
        return "any moment now"
    return f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min"


def _count(v: Any) -> int | None:
    """A whole number of status.json, or None when the field holds something else."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _slug(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-._")
    return (s or "run")[:40]


def new_run_id(name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}-{secrets.token_hex(2)}"


class Run:
    """A handle on one run directory."""

    def __init__(self, run_dir: str | Path, *, run_id: str | None = None, name: str | None = None) -> None:
        self.dir = Path(run_dir)
        self.paths = RunPaths(self.dir)
        self.id = run_id or self.dir.name
        self._name = name

    # ------------------------------------------------------------------------------------ reading
    @property
    def name(self) -> str:
        if self._name is None:
            self._name = str(self.resolved.get("name") or self.id)
        return self._name

    @property
    def resolved(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = read_json(self.paths.resolved, max_bytes=MAX_JSON_BYTES)
            return data
        except FileNotFoundError:
            raise RunNotFound(f"{self.dir} is not a run directory (no resolved.json)") from None

    @property
    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = self.resolved["config"]
        return cfg

    @property
    def output_dir(self) -> Path:
        return self.paths.output

    def status(self) -> RunStatus:
        """The run's state; a run whose processes are gone without a final state reads as failed (lost)."""
        raw = self._read_status()
        if raw.get("state") in ACTIVE_STATES:
            unknown = None  # why launch.json names no processes to look for, when it is there but garbage
            try:
                info = process.load_launch(self.paths)
            except process.NotALaunchRecord as e:
                info, unknown = None, str(e)
            if unknown or (info is not None and process.is_local(info) and not process.run_alive(info)):
                raw = self._read_status()  # it may have finished between the two reads
                if raw.get("state") in ACTIVE_STATES:
                    raw = self._mark_lost(unknown)
        if raw.get("slurm_job"):  # SLURM's word on the job; its end if the worker wrote none
            from nbtrain.control.launch import slurm

            if slurm.consult(raw):
                raw = slurm.reconcile(self.paths, raw)
        if raw.get("ray_job"):  # Ray's word on the job; its end if the driver wrote none
            from nbtrain.control.launch import rayjobs

            if rayjobs.consult(raw):
                raw = rayjobs.reconcile(self.paths, raw)
        # status.json is read as it is found: a field of the wrong type (a hand edit, another tool) is
        # left out rather than crashing every view of the run
        error = raw.get("error")
        if error is not None and not isinstance(error, dict):
            error = {"type": "error", "message": str(error)[:500]}
        st = RunStatus(
            state=str(raw.get("state", "queued")),
            step=_count(raw.get("step")) or 0,
            max_steps=_count(raw.get("max_steps")),
            error=error,
            updated=_number(raw.get("updated")),
            summary=summary if isinstance(summary := raw.get("summary"), dict) else {},
            phase=raw.get("phase") if isinstance(raw.get("phase"), str) else None,
            download=raw.get("download") if isinstance(raw.get("download"), dict) else None,
            slurm=raw.get("slurm") if isinstance(raw.get("slurm"), dict) else None,
            ray=raw.get("ray") if isinstance(raw.get("ray"), dict) else None,
            step_seconds=_number(raw.get("step_seconds")),
            step_ended=_number(raw.get("step_ended")),
            steps_timed=_count(raw.get("steps_timed")) or 0,
            stop_asked=raw.get("state") in ACTIVE_STATES and self.paths.control_file("stop").exists(),
            stop_reason=str(raw["stop_reason"])[:100] if isinstance(raw.get("stop_reason"), str) else None,
        )
        return st

    def _mark_lost(self, unknown: str | None = None) -> dict[str, Any]:
        """The processes are gone and the state is still active: say failed, with the likeliest cause.
        A full disk is the one the worker cannot report itself (it cannot write status.json then).
        ``unknown``: launch.json is there but no launch record (why), so no process of the run can be
        found or stopped through it: the run is lost all the same, and says so."""
        tail = tail_text(self.paths.rank_log(0), 30, below=self.dir)
        try:
            full = shutil.disk_usage(self.dir).free < 8 * 2**20
        except OSError:
            full = False
        if full or "No space left on device" in tail or "[Errno 28]" in tail:
            err = {
                "type": "disk-full",
                "message": f"the run stopped: no space left on the device ({storage_hint(self.dir)}); "
                "free some space, then resume it",
                "log_tail": tail,
            }
        elif unknown:
            err = {
                "type": "lost",
                "message": f"{unknown}; nbtrain cannot tell from it which processes run this, so it "
                "reads as ended. Resume it from its last checkpoint, or start it again",
                "log_tail": tail,
            }
        else:
            err = {"type": "lost", "message": LOST_MESSAGE, "log_tail": tail}
        try:
            return write_status(self.paths, "failed", error=err)
        except OSError:  # the disk is still full: report it without writing
            return {"state": "failed", "error": err}

    def _read_status(self) -> dict[str, Any]:
        if not self.dir.is_dir():
            # Deleted (by hand, or its disk went away): the run is lost, and nothing may re-create it.
            err = {"type": "lost", "message": f"the run directory {self.dir} no longer exists (deleted?)"}
            return {"state": "failed", "error": err}
        for _ in range(3):
            try:
                data = read_json(self.paths.status, max_bytes=MAX_JSON_BYTES)
            except FileNotFoundError:
                return {"state": "queued"}
            except NotRegularFile as e:  # a FIFO would block every reader, a link could point anywhere
                return {"state": "failed", "error": {"type": "unreadable", "message": str(e)}}
            except (ValueError, OSError):
                time.sleep(0.05)  # replaced atomically, so this is only a reader on a strange filesystem
                continue
            ok = isinstance(data, dict) and data.get("state") in STATES
            if ok and isinstance(data.get("step", 0), int):
                return dict(data)
            break
        # A corrupt status.json (a disk error, an editor): this run says so; every other run still lists.
        err = {"type": "corrupt", "message": f"{self.paths.status} is not a valid status file"}
        return {"state": "failed", "error": err}

    def metrics(self) -> pd.DataFrame:
        """Every logged step from rank 0 as a DataFrame (one row per record in metrics.jsonl)."""
        import pandas as pd

        from nbtrain.control.runs.metrics import read_records  # numpy: only when metrics are asked for

        return pd.DataFrame(read_records(self.paths.metrics, below=self.dir))

    def system(self) -> pd.DataFrame:
        import pandas as pd

        from nbtrain.control.runs.metrics import read_records

        return pd.DataFrame(read_records(self.paths.system, below=self.dir))

    def checkpoint(self) -> None:
        """Ask the run to save a checkpoint after its current step, without stopping."""
        if self.status().done:
            raise NbtrainError(f"run {self.id} is not running")
        request_control(self.paths, "checkpoint")

    def logs(self, n: int = 40) -> str:
        """The last ``n`` lines of rank 0's log (bounded; a log that is a FIFO or a link says so instead)."""
        return tail_text(self.paths.rank_log(0), n, below=self.dir)

    # --------------------------------------------------------------------------------- controlling
    def stop(self, timeout: float | None = None, *, by: str = "user") -> RunStatus:
        """Ask the run to stop after its current step (it saves a checkpoint), then wait for it.

        After ``timeout`` seconds the run's own process group is killed; by default that is long enough
        for the step in progress and its checkpoint, from the run's measured step time
        (``RunStatus.stop_grace``). A shorter ``timeout`` is said to lose the steps since the last
        checkpoint before anything is done. Returns the final status. ``by`` (who asked: "user",
        "sidebar") becomes the run's ``stop_reason`` in status.json.
        """
        st = self.status()
        if st.done:
            return st
        if why := self.paths.not_yours():
            raise NbtrainError(f"not stopping run {self.id}: {why}")
        if timeout is None:
            timeout = st.stop_grace()
        elif st.step_seconds is not None and timeout < 1.5 * st.step_seconds + 5:  # the step, a quick save
            last = latest_complete_checkpoint(self.paths)
            since = checkpoint_step(last) if last is not None else None
            warnings.warn(
                f"run {self.id}: a stop with timeout={timeout:g} s may not see the step in progress end "
                f"(~{st.step_seconds:.0f} s a step, ~{st.stop_grace():.0f} s with its checkpoint): it would "
                f"lose the steps since {f'step {since}' if since is not None else 'the start'}; leave "
                "timeout out to wait for the step",
                stacklevel=2,
            )
        raw = self._read_status()
        if raw.get("slurm_job"):
            return self._stop_slurm(str(raw["slurm_job"]), timeout, by)
        if raw.get("ray_job"):
            return self._stop_ray(str(raw["ray_job"]), str(raw.get("ray_address") or "auto"), timeout, by)
        info = process.read_launch(self.paths)
        request_control(self.paths, "stop", by=by)
        if info is None:
            write_status(self.paths, "stopped", note="stopped before it was launched", stop_reason=by)
            return self.status()
        if not process.is_local(info):
            raise NbtrainError(f"run {self.id} runs on host {info.get('host')}; stop it from there")
        if info.get("notebook"):
            how = self._stop_notebook_ranks(info, timeout)
        else:
            how = process.terminate_group(info, grace=timeout)
        final = self._read_status()
        if final.get("state") in ACTIVE_STATES:
            write_status(
                self.paths,
                "stopped",
                note=f"stop: process group {how} before it wrote a final state",
                stop_reason=by,
            )
        st = self.status()
        return st

    def _stop_slurm(self, job_id: str, timeout: float, by: str) -> RunStatus:
        """A pending job is cancelled; a running one stops gracefully (the control file every rank reads,
        a checkpoint), and is cancelled after ``timeout`` seconds."""
        from nbtrain.control.launch import slurm

        request_control(self.paths, "stop", by=by)
        job = slurm.query(job_id, fresh=True)
        if job is None or job.pending:
            problem = slurm.cancel(job_id)
            if problem and job is not None:
                raise NbtrainError(f"scancel {job_id} failed: {problem}")
            write_status(self.paths, "stopped", note=f"SLURM job {job_id} cancelled before it started",
                         stop_reason=by)  # fmt: skip
            return self.status()
        try:
            return follow(self.status, timeout=timeout, interval=0.5, what=f"run {self.id}")
        except TimeoutError:
            pass
        problem = slurm.cancel(job_id)

        def job_ended(st: RunStatus) -> bool:
            job = slurm.query(job_id, fresh=True)
            return st.done or job is None or job.ended

        with contextlib.suppress(TimeoutError):
            follow(self.status, ended=job_ended, timeout=60, interval=0.5, what=f"SLURM job {job_id}")
        if self._read_status().get("state") in ACTIVE_STATES:
            note = f"stop: SLURM job {job_id} cancelled after {timeout:g} s" + (
                f" ({problem})" if problem else ""
            )
            write_status(self.paths, "stopped", note=note, stop_reason=by)
        return self.status()

    def _stop_ray(self, job_id: str, address: str, timeout: float, by: str) -> RunStatus:
        """A training Ray run stops gracefully (the control file its ranks read, a checkpoint); a job still
        pending or waiting for its workers, or one that has not ended after ``timeout`` seconds, is stopped
        through Ray's Jobs API."""
        from nbtrain.control.launch import rayjobs

        request_control(self.paths, "stop", by=by)
        job = rayjobs.query(address, job_id, fresh=True)
        training = self._read_status().get("state") in ("starting", "running", "stopping")
        if job is not None and not job.pending and not job.ended and training:  # else: nothing to checkpoint
            with contextlib.suppress(TimeoutError):
                return follow(self.status, timeout=timeout, interval=0.5, what=f"run {self.id}")
        problem = rayjobs.stop(address, job_id)

        def job_ended(st: RunStatus) -> bool:
            job = rayjobs.query(address, job_id, fresh=True)
            return st.done or job is None or job.ended

        with contextlib.suppress(TimeoutError):
            follow(self.status, ended=job_ended, timeout=60, interval=0.5, what=f"Ray job {job_id}")
        if self._read_status().get("state") in ACTIVE_STATES:
            note = f"stop: Ray job {job_id} stopped through Ray" + (f" ({problem})" if problem else "")
            write_status(self.paths, "stopped", note=note, stop_reason=by)
        return self.status()

    def _stop_notebook_ranks(self, info: dict[str, Any], timeout: float) -> str:
        """A notebook_launcher run has no process group of its own (its ranks are the kernel's children):
        the ranks see control/stop first; then SIGTERM, then SIGKILL, by the pids they recorded."""
        import psutil

        try:
            follow(self.status, timeout=timeout, interval=0.2, what=f"run {self.id}")
            return "finished"
        except TimeoutError:
            pass
        how = "terminated"
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            procs = []
            for pid in self.paths.rank_pids():
                if pid == info.get("kernel_pid"):
                    continue  # never the kernel itself
                try:
                    p = psutil.Process(pid)
                    # A process younger than the run is its rank; an older one merely reuses the pid.
                    if p.create_time() >= float(info.get("start_time", 0)) - 1:
                        p.send_signal(sig)
                        procs.append(p)
                except psutil.Error:
                    continue
            psutil.wait_procs(procs, timeout=wait)
            if sig == signal.SIGKILL and procs:
                how = "killed"
        # The kernel's supervising thread writes the final state once the ranks are gone.
        with contextlib.suppress(TimeoutError):
            follow(self.status, timeout=30, interval=0.2, what=f"run {self.id}")
        return how

    def wait(self, timeout: float | None = None, *, poll: float = 0.5, check: bool = True) -> RunStatus:
        """Block until the run ends and, for up to EXIT_WAIT more seconds, until its processes have exited:
        what they held (a GPU's memory above all) is then free for the next run's plan, which would
        otherwise count it as taken by others. With ``check`` (default) a failed run raises RunFailed."""
        started = time.monotonic()
        st = follow(self.status, timeout=timeout, interval=poll, what=f"run {self.id}")
        info = process.read_launch(self.paths)
        if info is not None and process.is_local(info) and not info.get("notebook"):
            left = EXIT_WAIT if timeout is None else min(EXIT_WAIT, timeout - (time.monotonic() - started))
            process.wait_group_gone(info, max(0.0, left), interval=0.02)
        if check and st.state == "failed":
            raise RunFailed(self.failure_report(st))
        return st

    def failure_report(self, st: RunStatus | None = None) -> str:
        st = st or self.status()
        err = st.error or {}
        tail = err.get("log_tail") or self.logs(20)
        return (
            f"run {self.id} failed: {err.get('type', 'error')}: {err.get('message', '')}\n"
            f"--- last lines of {self.paths.rank_log(0)} ---\n{tail}"
        )

    # ----------------------------------------------------------------------------------- display
    def __repr__(self) -> str:
        # No state here: a notebook keeps a repr forever, and a state in it would go stale.
        # What to type for it names the run, not a variable the reader may never have made.
        return f"<Run {self.name!r} {self.id} — %finetune status {self.name} for its state>"

    def _repr_html_(self) -> str:
        # No state here either (a cell's result stays as it was shown: "starting (step 0)" under a run that
        # completed long since); the cell's dashboard and run record follow the state.
        return (
            f"<b>nbtrain run</b> <code>{html.escape(self.id)}</code> {html.escape(self.name)} "
            f"<small>— <code>%finetune status {html.escape(self.name)}</code> for its state<br>"
            f"{html.escape(str(self.dir))}</small>"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.dir.resolve() == self.dir.resolve()

    def __hash__(self) -> int:
        return hash(str(self.dir.resolve()))


def create_run_dir(
    name: str,
    config_text: str,
    resolved: dict[str, Any],
    populate: Callable[[Path, Path], None] | None = None,
) -> Run:
    """Make the directory of a new run, whole or not at all, and register it (state ``queued``).

    It is built beside its final place as ``.<id>.partial`` (``populate(building, final)`` adds the run's
    other files there; paths written into them must name ``final``), registered, then renamed into place.
    Any failure (a full disk, an unwritable registry) removes what was built and names the cause.
    """
    root = runs_root()
    run_id = new_run_id(name)
    final = root / run_id
    building = root / f".{run_id}.partial"
    registered = False
    try:
        root.mkdir(parents=True, exist_ok=True)
        paths = RunPaths(building)
        building.mkdir(exist_ok=False)
        paths.make()
        paths.config.write_text(config_text, encoding="utf-8")
        atomic_write_json(paths.resolved, {**resolved, "id": run_id, "name": name, "run_dir": str(final)})
        write_status(paths, "queued")
        if populate is not None:
            populate(building, final)
        registry.add(run_id, name, final)  # first: a run directory that exists is always registered
        registered = True
        os.rename(building, final)
    except BaseException as e:
        shutil.rmtree(building, ignore_errors=True)
        if registered:
            with contextlib.suppress(Exception):
                registry.remove(run_id)
        if isinstance(e, OSError):
            raise NbtrainError(
                f"could not create the run directory {final}: {storage_problem(e, root)}"
            ) from e
        if isinstance(e, sqlite3.Error):
            db = registry.db_path()
            raise NbtrainError(
                f"could not register the run in {db}: {e}; {storage_hint(db.parent)} (NBTRAIN_HOME sets "
                "where the registry lives)"
            ) from e
        raise
    return Run(final, run_id=run_id, name=name)


def discard_run(run: Run) -> None:
    """Remove a run that never started (its start failed): its directory and its registry entry."""
    shutil.rmtree(run.dir, ignore_errors=True)
    registry.remove(run.id)


TRASH = ".trash"  # under the runs root: deleted runs, kept until the user empties it


def trash_run(run: Run) -> Path:
    """Delete a finished run from the list: its directory is moved to ``<runs root>/.trash/<id>`` (the
    folder it lives in; nothing is erased) and its registry entry removed. Returns where it went.

    Refused for a run that is not finished, or whose directory another process is writing (a resume
    holds its lock): the run is left as it was."""
    if why := run.paths.not_yours():
        raise NbtrainError(f"not deleting run {run.id}: {why}")
    st = run.status()
    if not st.done:
        raise NbtrainError(f"run {run.id} is {st.state}: stop it before deleting it")
    fd = lock_run(run.paths)
    if fd is None:
        raise NbtrainError(
            f"run {run.id} is being written by another process (a resume of it?); wait for it to finish"
        )
    try:
        st = run.status()  # under the lock: a resume that started meanwhile has made it active again
        if not st.done:
            raise NbtrainError(f"run {run.id} is {st.state}: stop it before deleting it")
        trash = run.dir.parent / TRASH
        trash.mkdir(exist_ok=True)
        dest = trash / run.dir.name
        if dest.exists() or dest.is_symlink():  # the same run deleted before (a copy put back)
            dest = trash / f"{run.dir.name}.{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        try:
            os.rename(run.dir, dest)
        except OSError as e:
            raise NbtrainError(f"could not move {run.dir} to {trash}: {storage_problem(e, run.dir)}") from e
        registry.remove(run.id)
    finally:
        os.close(fd)
    return dest


def storage_hint(path: Path) -> str:
    """What the disk holding ``path`` has left, for an error message."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return f"{path} cannot be read"
    return f"{free / 2**20:.0f} MiB free on the disk holding {path}"


def storage_problem(e: OSError, where: Path) -> str:
    """An OSError in words: ENOSPC / EDQUOT name the disk and its free space; others their message."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device ({storage_hint(where)}); free some space and try again"
    return f"{e.strerror or e} ({e.filename or where})"


def all_runs() -> list[Run]:
    """Every registered run whose directory still exists, oldest first."""
    return [Run(r.run_dir, run_id=r.id, name=r.name) for r in registry.rows() if Path(r.run_dir).is_dir()]


def get_run(ref: str | Path | Run) -> Run:
    """A run by id, unique id prefix, name (the newest run of that name) or run directory path."""
    if isinstance(ref, Run):
        return ref
    text = str(ref)
    if isinstance(ref, Path) or "/" in text or text.startswith("."):
        p = Path(text).expanduser()
        if (p / "resolved.json").exists():
            return Run(p.resolve())
        raise RunNotFound(f"no run directory at {p}")
    found = registry.find(text)
    if not found:
        known = ", ".join(r.id for r in registry.rows()[-5:]) or "none yet"
        raise RunNotFound(f"no run matches {text!r}; recent runs: {known} (list them with %finetune list)")
    ids = {r.id for r in found}
    if len(ids) > 1 and all(r.name != text for r in found):
        raise RunNotFound(f"{text!r} matches several runs ({', '.join(sorted(ids))}); give more of the id")
    r = found[0]
    return Run(r.run_dir, run_id=r.id, name=r.name)


def has_trained_weights(run: Run) -> bool:
    """Whether ``run`` has weights to load: its output/ (a model or an adapter) or a complete checkpoint."""
    out = run.paths.output
    return (
        (out / "adapter_config.json").exists()
        or (out / "config.json").exists()
        or (last_checkpoint(run) is not None)
    )


def last_checkpoint(run: Run, *, repair: bool = False) -> Path | None:
    """The newest complete checkpoint of ``run`` (``contract.rundir.latest_complete_checkpoint``); with
    ``repair`` (only while holding the run's writer lock) it is marked and remnants are deleted."""
    return latest_complete_checkpoint(run.paths, repair=repair)
