"""SLURM's truth about a run's job: what ``scontrol show job`` says (``sacct`` once slurmctld has
forgotten the job, where accounting exists), turned into the run's state.

A run submitted with ``sbatch`` has ``slurm_job`` in its status.json. While SLURM holds the job pending,
the run is ``queued`` with SLURM's reason (``Resources``, ``Priority``...) and expected start; once SLURM
says the job ended and the worker wrote no final state (it died before it could, or never started), the
run takes the end SLURM gives within one status read: failed (exit code, nodes, reason, the job's log
tail), stopped (cancelled outside nbtrain, time limit, preemption) -- never ``queued`` or ``running`` for
ever. Stop of a pending job is ``scancel``; of a running one the graceful stop, then ``scancel``.

submitit was looked at for this and is not used: its job state comes from ``sacct`` alone, which a cluster
without accounting (slurmdbd) answers with nothing, and it submits pickled functions in its own job
folders, where nbtrain's jobs are its worker command in the run directory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import ACTIVE_STATES, RunPaths, reread_status, tail_text, write_status

PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
RUNNING_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "STAGE_OUT", "SIGNALING", "STOPPED")
CACHE_S = 2.0  # one scontrol call per job per this many seconds, however often the status is read
TIMEOUT_S = 20.0


class SlurmUnavailable(Exception):
    """SLURM's commands are missing or slurmctld does not answer: nothing can be said about the job."""


@dataclass(frozen=True)
class Job:
    id: str
    state: str  # SLURM's JobState: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str = ""  # Resources, Priority, NonZeroExitCode, ... ("None" is left out)
    exit_code: str = ""  # "3:0": the script's exit status : the signal that ended it
    nodes: str = ""
    start: str = ""  # when it started, or SLURM's expected start while pending ("" unknown)
    elapsed: str = ""
    limit: str = ""
    restarts: int = 0
    end: str = ""  # when it ends (or is due to end: start + time limit), SLURM's local time
    position: int = 0  # while pending: its place among its partition's pending jobs, by priority (1: next)

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def ended(self) -> bool:
        return self.state not in PENDING_STATES + RUNNING_STATES

    def shown(self) -> dict[str, Any]:
        """What a person is shown of it (status readers, the sidebar)."""
        out: dict[str, Any] = {"job": self.id, "state": self.state, "words": self.words()}
        for k in ("reason", "exit_code", "nodes", "start", "elapsed", "limit", "position"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        return out

    def words(self) -> str:
        """One line: "SLURM job 12 pending (Resources), expected to start 2026-12-05T08:00:00"."""
        if self.pending:
            why = f" ({self.reason})" if self.reason else ""
            place = f", position {self.position} in the queue" if self.position else ""
            when = f", expected to start {_when(self.start)}" if self.start else ""
            return f"SLURM job {self.id} pending{why}{place}{when}"
        if not self.ended:
            lim = f" of {self.limit}" if self.limit else ""
            return f"SLURM job {self.id} running on {self.nodes or '?'} for {self.elapsed or '?'}{lim}"
        code = f", exit code {self.exit_code}" if self.exit_code and self.exit_code != "0:0" else ""
        why = f", {self.reason}" if self.reason else ""
        on = f" on {self.nodes}" if self.nodes else ""
        return f"SLURM job {self.id} ended {self.state}{on}{code}{why}"


def _when(stamp: str) -> str:
    """SLURM's local time for a person: "at 08:10" today, "on 2026-12-06 at 08:10" another day."""
    from datetime import datetime

    try:
        t = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    at = f"at {t:%H:%M}"
    return at if t.date() == datetime.now().date() else f"on {t:%Y-%m-%d} {at}"


def _cmd(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmUnavailable(f"{name} is not on PATH")
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmUnavailable(f"{argv[0]}: {e}") from None


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=(\S*)")
_cache: dict[str, tuple[float, Job | None]] = {}
_down: dict[str, tuple[float, SlurmUnavailable]] = {}
DOWN_CACHE_S = 30.0  # after SLURM did not answer for a job, how long its status reads say so without asking


def _known(value: str) -> str:
    return "" if value in ("None", "(null)", "Unknown", "N/A") else value


def query(job_id: str, *, fresh: bool = False) -> Job | None:
    """The job as SLURM has it; None when neither slurmctld nor accounting knows it (any more).
    Raises SlurmUnavailable when SLURM cannot be asked."""
    now = time.monotonic()
    hit = _cache.get(job_id)
    if hit is not None and not fresh and now - hit[0] < CACHE_S:
        return hit[1]
    down = _down.get(job_id)
    if down is not None and not fresh and now - down[0] < DOWN_CACHE_S:
        raise down[1]  # slurmctld did not answer just now: the list and the sidebar do not wait on it again
    try:
        job = _scontrol(job_id)
        if job is None:
            job = _sacct(job_id)
    except SlurmUnavailable as e:
        _down[job_id] = (now, e)
        raise
    _down.pop(job_id, None)
    _cache[job_id] = (now, job)
    return job


def _scontrol(job_id: str) -> Job | None:
    out = _run([_cmd("scontrol"), "show", "job", "-o", job_id])
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return None  # forgotten (MinJobAge) or never known
        raise SlurmUnavailable(out.stderr.strip() or f"scontrol exited {out.returncode}")
    f = dict(_FIELD.findall(out.stdout.splitlines()[0] if out.stdout else ""))
    if "JobState" not in f:
        raise SlurmUnavailable(f"scontrol show job {job_id} said: {out.stdout[:200]!r}")
    state = f["JobState"]
    return Job(
        id=job_id,
        state=state,
        reason=_known(f.get("Reason", "")),
        exit_code=f.get("ExitCode", ""),
        nodes=_known(f.get("NodeList", "")),
        start=_known(f.get("StartTime", "")),
        elapsed=_known(f.get("RunTime", "")),
        limit=_known(f.get("TimeLimit", "")),
        restarts=int(f.get("Restarts", "0") or 0),
        end=_known(f.get("EndTime", "")),
        position=_position(job_id, f.get("Partition", "")) if state == "PENDING" else 0,
    )


def _position(job_id: str, partition: str) -> int:
    """The job's place among the pending jobs of its partition, highest priority first (0: unknown)."""
    argv = [_cmd("squeue"), "-h", "-t", "PD", "--sort=-p,i", "-o", "%i"]
    out = _run([*argv, "-p", partition] if partition else argv)
    ids = out.stdout.split() if out.returncode == 0 else []
    return ids.index(job_id) + 1 if job_id in ids else 0


def _sacct(job_id: str) -> Job | None:
    if shutil.which("sacct") is None:
        return None
    out = _run(
        [
            "sacct",
            "-j",
            job_id,
            "-X",
            "-n",
            "-P",
            "-o",
            "State,ExitCode,Reason,NodeList,Start,Elapsed,Timelimit",
        ]
    )
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    parts = line.split("|")
    if len(parts) < 7:
        return None  # accounting disabled ("Slurm accounting storage is disabled") or no record
    state = parts[0].split()[0]  # "CANCELLED by 1000" -> CANCELLED
    by = parts[0][len(state) :].strip()
    reason = " ".join(x for x in (_known(parts[2]), by) if x)
    return Job(job_id, state, reason, parts[1], _known(parts[3]), _known(parts[4]), parts[5], parts[6])


# ------------------------------------------------------------------------------------ the run's state
def consult(raw: dict[str, Any]) -> bool:
    """Does this status need SLURM's word? A SLURM run's active state (is its job still there?), and a
    stop the worker made on a signal nbtrain did not send (which SLURM sent, and why)."""
    if not raw.get("slurm_job"):
        return False
    if raw.get("state") in ACTIVE_STATES or requeuing(raw):
        return True
    signalled = str(raw.get("stop_reason") or "").startswith("SIG")
    return raw.get("state") == "stopped" and signalled and not raw.get("slurm")


def requeuing(raw: dict[str, Any]) -> bool:
    """Stopped at a checkpoint for the job's time limit: with ``requeue: auto`` the job requeues itself and
    the run goes on, so it reads queued while its job is still there."""
    return raw.get("state") == "stopped" and raw.get("stop_reason") == "slurm-time-limit"


def reconcile(paths: RunPaths, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (status.json of a run that ``consult`` picks) as SLURM has it now: with the job's ``slurm``
    facts while it is pending or running; its final state written when the job has ended and the worker
    wrote none, or why SLURM ended a run the worker stopped. SLURM that cannot be asked leaves ``raw`` as
    it is, saying why."""
    job_id = str(raw["slurm_job"])
    try:
        job = query(job_id)
    except SlurmUnavailable as e:
        return {**raw, "slurm": {"job": job_id, "unavailable": str(e)}}
    if requeuing(raw):
        if job is None or job.ended:
            return raw  # not requeued (max_requeues reached, or requeue: never): stopped it is
        words = f"SLURM job {job_id} stopped at its time limit and goes on in a requeued job ({job.state})"
        return {**raw, "state": "queued", "slurm": {**job.shown(), "words": words}}
    if job is not None and not job.ended and job.restarts > int(raw.get("slurm_restarts") or 0):
        # SLURM requeued the job itself (preempted, or a node failed): what the worker it killed wrote
        # (running, or stopped on SIGTERM) is an earlier start's, until the job's restart resumes the run
        if job.pending:
            why = f" ({job.reason})" if job.reason else ""
            words = (f"SLURM requeued job {job_id} (restart {job.restarts}), pending{why}: the run goes on "
                     "from its last complete checkpoint when the job starts again")  # fmt: skip
        else:
            words = f"SLURM job {job_id} started again (restart {job.restarts}): resuming"
        return {**raw, "state": "queued", "slurm": {**job.shown(), "words": words}}
    if raw.get("state") not in ACTIVE_STATES:  # stopped on a signal: say SLURM's side once it has ended
        if job is None or not job.ended:
            return raw
        how = "cancelled in SLURM (scancel), not by nbtrain" if job.state == "CANCELLED" else job.state
        note = f"{job.words()}: {how}; the worker stopped at a checkpoint ({raw.get('stop_reason')})"
        return write_status(
            paths, "stopped", note=note, stop_reason=f"slurm-{job.state.lower()}", slurm=job.shown()
        )
    if job is None:
        job = Job(job_id, "UNKNOWN", "slurmctld no longer knows the job and there is no accounting to ask")
    elif not job.ended:
        return {**raw, "slurm": job.shown()}
    now = reread_status(paths, raw)  # the worker may have written its final state meanwhile
    if now.get("state") not in ACTIVE_STATES:
        return {**now, "slurm": job.shown()}
    return ended(paths, job, now)


def ended(paths: RunPaths, job: Job, raw: dict[str, Any]) -> dict[str, Any]:
    """Write the final state of a run whose job ended without the worker writing one."""
    log = job_log(paths, job.id)
    tail = tail_text(log, 30, below=paths.root) if log is not None else ""
    if not tail:
        tail = tail_text(paths.rank_log(0), 30, below=paths.root)
    said = job.words()
    shown = job.shown()
    if job.state == "CANCELLED":
        asked = paths.control_file("stop").exists()
        note = f"{said}: " + ("stopped as asked" if asked else "cancelled in SLURM (scancel), not by nbtrain")
        return write_status(
            paths, "stopped", note=note, stop_reason=raw.get("stop_reason") or "slurm", slurm=shown
        )
    if job.state in ("TIMEOUT", "PREEMPTED", "DEADLINE"):
        what = {"TIMEOUT": f"hit its time limit ({job.limit or '?'})", "PREEMPTED": "was preempted",
                "DEADLINE": "reached its deadline"}[job.state]  # fmt: skip
        note = f"{said}: the job {what}; resume continues from the last complete checkpoint"
        return write_status(
            paths, "stopped", note=note, stop_reason=f"slurm-{job.state.lower()}", slurm=shown
        )
    causes = {
        "COMPLETED": "the job ended without the worker writing a final state",
        "FAILED": "the job failed before the worker wrote a final state",
        "NODE_FAIL": "a node of the job failed",
        "OUT_OF_MEMORY": "the job ran out of memory; raise slurm: mem, or lower the batch size",
        "BOOT_FAIL": "a node of the job failed to boot",
        "UNKNOWN": "SLURM has no record of the job any more",
    }
    cause = causes.get(job.state, f"the job ended {job.state}")
    killed = memory_killed(tail)
    if killed:  # a cluster without cgroups (jobacct_gather's OverMemoryKill) says so only in the log
        cause = f"the job ran out of memory ({killed}); raise slurm: mem, or lower the batch size"
    where = f"; its log: {log}" if log is not None else ""
    kind = "OutOfMemory" if killed or job.state == "OUT_OF_MEMORY" else "slurm"
    err = {"type": kind, "message": f"{said}: {cause}{where}", "log_tail": tail, "slurm": shown}
    return write_status(paths, "failed", error=err, slurm=shown)


_MEMORY_KILL = re.compile(r"(\S+ exceeded memory limit \(\d+ > \d+\))|(oom[-_ ]kill\S*)", re.IGNORECASE)


def memory_killed(log_tail: str) -> str:
    """What slurmstepd wrote when it killed the job for its memory ("StepId=3.0 exceeded memory limit
    (643149824 > 209715200)", or a cgroup's oom-kill), "" when it did not. A cluster without cgroups ends
    such a job FAILED, not OUT_OF_MEMORY: its log is where SLURM says why."""
    m = _MEMORY_KILL.search(log_tail)
    return "" if m is None else m.group(0)


def job_log(paths: RunPaths, job_id: str) -> Path | None:
    log = paths.root / "logs" / f"slurm-{job_id}.log"
    return log if log.exists() else None


# ------------------------------------------------------------------------------------ shared storage
LOCAL_FILESYSTEMS = {
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "tmpfs",
    "overlay",
    "zfs",
    "f2fs",
    "vfat",
    "ramfs",
}


def filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it in /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    real, best, kind = str(path.resolve()), "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, parts[2]
    return kind


def storage_note(run_dir: Path, nodes: int) -> str | None:
    """A warning when a run of several nodes keeps its directory on a filesystem only this machine has."""
    kind = filesystem(run_dir)
    if nodes < 2 or kind not in LOCAL_FILESYSTEMS:
        return None
    return (
        f"nbtrain: the run directory {run_dir} is on a local filesystem ({kind}); every node of the job must "
        "see it. Unless all the nodes are this machine, set NBTRAIN_RUNS_DIR to a folder on storage the "
        "nodes share (NFS, Lustre, GPFS, BeeGFS...)"
    )


# --------------------------------------------------------------------------------------- stopping
def cancel(job_id: str, *, signal: str | None = None) -> str:
    """``scancel`` the job (or send it ``signal``); returns what scancel said ("" when all went well)."""
    argv = [_cmd("scancel"), *([f"--signal={signal}", "--batch", "--full"] if signal else []), job_id]
    out = _run(argv)
    _cache.pop(job_id, None)
    return "" if out.returncode == 0 else (out.stderr.strip() or f"scancel exited {out.returncode}")


# ------------------------------------------------------------------------------------ inside the job
def seconds_left(job: Job) -> float | None:
    """Seconds until the job's end as SLURM has it (start + time limit); None: no limit."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(job.end).timestamp() - time.time()
    except ValueError:
        return None
