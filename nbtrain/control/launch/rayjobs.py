"""The kernel's side of a Ray run: the job submitted through Ray's Jobs API (``JobSubmissionClient``), its
state read back as the run's, its stop, and the cluster's nodes for the plan. The job itself is
``python -m nbtrain.worker.rayjob RUN_DIR`` on the cluster, which trains through Ray Train.

Ray is imported here only when a Ray run is planned, started or read (``pip install 'nbtrain[ray]'``):
``%load_ext nbtrain`` imports none of it."""

from __future__ import annotations

import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nbtrain.contract.rundir import ACTIVE_STATES, RunPaths, reread_status, tail_text, write_status

CACHE_S = 2.0  # one Jobs API call per job per this many seconds, however often the status is read
DOWN_CACHE_S = 15.0  # after the cluster did not answer, how long status reads say so without asking again
ENDED = ("STOPPED", "SUCCEEDED", "FAILED")
DASHBOARD_PORT = 8265  # Ray's default dashboard port: the Jobs API and the state API are served there
ENTRY_MODULE = "nbtrain.worker.rayjob"


class RayUnavailable(Exception):
    """Ray is not installed here, or the cluster did not answer (the cause and the fix in the message)."""


@dataclass(frozen=True)
class RayJob:
    """A Ray job as the Jobs API has it."""

    id: str  # the submission id nbtrain gave it
    status: str  # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    message: str = ""
    error_type: str = ""
    exit_code: int | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def pending(self) -> bool:
        return self.status == "PENDING"

    def words(self) -> str:
        said = f": {self.message}" if self.message else ""
        return f"Ray job {self.id} {self.status.lower()}{said}"

    def shown(self) -> dict[str, Any]:
        return {"job": self.id, "status": self.status, "message": self.message}


def _ray_missing() -> RayUnavailable:
    return RayUnavailable(
        "distributed: ray: needs Ray's Jobs API here: pip install 'nbtrain[ray]' (ray[default])"
    )


def dashboard(address: str) -> str | None:
    """The HTTP address of the cluster's dashboard (the Jobs and state APIs) for a config's ``address``;
    None for ``auto`` (Ray finds the cluster this machine is in)."""
    if address == "auto":
        return None
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host = urlsplit(address if "://" in address else f"ray://{address}").hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{DASHBOARD_PORT}"  # a Ray Client or GCS address: its head's dashboard


_CLIENTS: dict[str, Any] = {}
_LOCK = threading.Lock()


def client(address: str) -> Any:
    """One ``JobSubmissionClient`` per cluster address; RayUnavailable naming the address when it does not
    answer."""
    with _LOCK:
        if address in _CLIENTS:
            return _CLIENTS[address]
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise _ray_missing() from None
    try:
        made = JobSubmissionClient(dashboard(address))
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
        raise RayUnavailable(
            f"the Ray cluster at {address} did not answer ({type(e).__name__}: {e})"
        ) from None
    with _LOCK:
        _CLIENTS[address] = made
    return made


def entrypoint(python: str | None, run_dir: Path) -> str:
    """The job's command line: the Ray job driver of nbtrain in the cluster's (or this) Python."""
    return shlex.join([python or sys.executable, "-m", ENTRY_MODULE, str(run_dir)])


def submission_id(run_id: str, attempt: int) -> str:
    return f"nbtrain-{run_id}-{attempt}"


def submit(paths: RunPaths, settings: dict[str, Any], *, run_id: str, attempt: int) -> str:
    """Submit the run's job; returns its submission id. RayUnavailable when the cluster refuses it."""
    c = client(settings["address"])
    sid = submission_id(run_id, attempt)
    try:
        return str(
            c.submit_job(
                entrypoint=entrypoint(settings.get("python"), paths.root),
                submission_id=sid,
                runtime_env=settings.get("runtime_env") or None,
                metadata={"nbtrain_run": run_id, "nbtrain_run_dir": str(paths.root)},
                entrypoint_num_cpus=0,  # the driver waits on its workers: it reserves nothing of theirs
            )
        )
    except Exception as e:  # noqa: BLE001 - a refused runtime_env, a dashboard that went away...
        raise RayUnavailable(f"the Ray cluster at {settings['address']} refused the job: {e}") from None


_CACHE: dict[str, tuple[float, RayJob | None]] = {}
_DOWN: dict[str, tuple[float, str]] = {}


def query(address: str, job_id: str, *, fresh: bool = False) -> RayJob | None:
    """The job as Ray has it (None: the cluster does not know it), at most one call per CACHE_S."""
    now = time.monotonic()
    if not fresh:
        hit = _CACHE.get(job_id)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        down = _DOWN.get(address)
        if down is not None and now - down[0] < DOWN_CACHE_S:
            raise RayUnavailable(down[1])
    try:
        info = client(address).get_job_info(job_id)
    except RayUnavailable as e:
        _DOWN[address] = (now, str(e))
        raise
    except Exception as e:  # noqa: BLE001 - a 404 for a job the cluster no longer has, a connection error
        if "does not exist" in str(e) or "404" in str(e):
            _CACHE[job_id] = (now, None)
            return None
        why = f"the Ray cluster at {address} did not answer ({type(e).__name__}: {e})"
        _DOWN[address] = (now, why)
        raise RayUnavailable(why) from None
    _DOWN.pop(address, None)
    status = getattr(info.status, "value", str(info.status))
    job = RayJob(
        job_id,
        str(status),
        str(info.message or ""),
        str(getattr(info, "error_type", "") or ""),
        getattr(info, "driver_exit_code", None),
    )
    _CACHE[job_id] = (now, job)
    return job


def logs(address: str, job_id: str) -> str:
    try:
        return str(client(address).get_job_logs(job_id))
    except Exception:  # noqa: BLE001 - the log is a help, never the cause of another error
        return ""


def stop(address: str, job_id: str) -> str:
    """Ask Ray to stop the job (its driver gets SIGTERM); '' when done, else why not."""
    try:
        client(address).stop_job(job_id)
    except Exception as e:  # noqa: BLE001
        return f"Ray did not stop job {job_id}: {e}"
    _CACHE.pop(job_id, None)
    return ""


def consult(raw: dict[str, Any]) -> bool:
    """Does this status need Ray's word? A Ray run's active state (is its job still going?)."""
    return bool(raw.get("ray_job")) and raw.get("state") in ACTIVE_STATES


def reconcile(paths: RunPaths, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (status.json of a Ray run that ``consult`` picks) as Ray has it now: with the job's ``ray``
    facts while it is pending or running; its final state written when the job has ended and its driver
    wrote none (stopped from outside, a driver that failed before training, a lost head). A cluster that
    cannot be asked leaves ``raw`` as it is, saying why."""
    job_id, address = str(raw["ray_job"]), str(raw.get("ray_address") or "auto")
    try:
        job = query(address, job_id)
    except RayUnavailable as e:
        return {**raw, "ray": {"job": job_id, "unavailable": str(e)}}
    if job is None:
        job = RayJob(job_id, "UNKNOWN", f"the Ray cluster at {address} no longer knows the job")
    elif not job.ended:
        shown = job.shown()
        if job.pending:
            shown["words"] = f"Ray job {job_id} pending: {job.message or 'waiting for the cluster'}"
            return {**raw, "state": "queued", "ray": shown}
        if raw.get("state") == "queued" and not raw.get("phase"):
            shown["words"] = f"Ray job {job_id} running: its driver is starting the workers"
        return {**raw, "ray": shown}
    now = reread_status(paths, raw)  # the driver may have written the final state meanwhile
    if now.get("state") not in ACTIVE_STATES:
        return {**now, "ray": job.shown()}
    return ended(paths, address, job)


def ended(paths: RunPaths, address: str, job: RayJob) -> dict[str, Any]:
    """Write the final state of a run whose job ended without its driver writing one."""
    shown = job.shown()
    if job.status == "STOPPED":
        asked = paths.control_file("stop").exists()
        note = f"{job.words()}: " + ("stopped as asked" if asked else "stopped in Ray (ray job stop), not by "
                                                                     "nbtrain")  # fmt: skip
        by = "user" if asked else "ray-job-stop"
        return write_status(paths, "stopped", note=note, stop_reason=by, ray=shown)
    tail = logs(address, job.id)[-6000:] or tail_text(paths.rank_log(0), 30, below=paths.root)
    if job.status == "SUCCEEDED":
        message = f"{job.words()}, but its driver wrote no final state for the run"
    else:
        message = job.words()
    error = {"type": "ray", "message": message[:4000], "log_tail": tail}
    return write_status(paths, "failed", error=error, ray=shown)


@dataclass(frozen=True)
class NodeFacts:
    """One alive node of the cluster, as Ray's state API lists it."""

    id: str
    ip: str
    head: bool
    resources: dict[str, float]
    labels: dict[str, str]


def nodes(address: str) -> list[NodeFacts]:
    """The cluster's alive nodes (Ray's state API on its dashboard); RayUnavailable when it cannot say."""
    try:
        from ray.util.state import list_nodes
    except ImportError:
        raise _ray_missing() from None
    try:
        listed = list_nodes(address=dashboard(address), filters=[("state", "=", "ALIVE")], detail=True,
                            raise_on_missing_output=False)  # fmt: skip
    except Exception as e:  # noqa: BLE001
        raise RayUnavailable(
            f"the Ray cluster at {address} did not answer ({type(e).__name__}: {e})"
        ) from None
    out = []
    for n in listed:
        get = n.get if isinstance(n, dict) else lambda k, d=None, n=n: getattr(n, k, d)
        out.append(NodeFacts(
            str(get("node_id", "")), str(get("node_ip", "")), bool(get("is_head_node", False)),
            {str(k): float(v) for k, v in (get("resources_total", {}) or {}).items()},
            {str(k): str(v) for k, v in (get("labels", {}) or {}).items()},
        ))  # fmt: skip
    return out
