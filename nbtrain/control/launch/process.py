"""The one spawner for every process nbtrain starts (training workers and their launchers, servers, one-off
jobs, TensorBoard), and identity-checked liveness and stop of the process groups it started.

A process is started from an argv list (``sys.executable -m ...`` for ours) in a new session, so it leads
its own process group and no terminal or kernel signal reaches it; stdin is closed and its output is
appended to a log file, never sent to a pipe nobody reads. The leader's start time (psutil create_time)
is recorded with its pid (launch.json, serve.json, tensorboard.json): the system may give an exited
process's pid to another one, so every liveness check and every killpg first checks that the process
behind the number is still ours. A record without the start time (written before it was kept, or by
someone else) names no live group: nothing is signalled on its word.

One registry holds the children this process started; every call into the spawner collects the ones
that have exited, so none is left a zombie.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nbtrain.contract import warmproto
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.jobs import JOBS, Job
from nbtrain.contract.rundir import MAX_JSON_BYTES, RunPaths, atomic_write_json, read_json, tail_text
from nbtrain.control.launch import warmclient
from nbtrain.hardware.clock import same_start, start_record, started_before

# The children this process started, kept until their exit status is collected (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Launched:
    """A process started by this spawner: the leader of its own process group (``pgid == pid``)."""

    pid: int
    pgid: int
    argv: list[str]
    create_time: float | None = None
    log: Path | None = None
    log_offset: int = 0  # where this process's output begins in ``log`` (earlier output is kept)
    _proc: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)
    _warm: warmclient.WarmChild | None = field(default=None, compare=False, repr=False)
    boot_time: float | None = None  # what create_time was computed with (hardware/clock.py)

    @property
    def record(self) -> dict[str, Any]:
        """What identifies the group for liveness and stop, as launch.json and serve.json keep it."""
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "create_time": self.create_time,
            "boot_time": self.boot_time,
        }

    def exit_code(self) -> int | None:
        """The exit status once the process has ended (collecting it), None while it runs."""
        if self._warm is not None:
            return self._warm.exit_code()
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end; raises subprocess.TimeoutExpired after ``timeout`` seconds."""
        if self._warm is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while (code := self._warm.exit_code()) is None:
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(self.argv, timeout or 0)
                time.sleep(0.02)
            return code
        if self._proc is None:
            raise ValueError("only the process that started it can wait for it")
        code = self._proc.wait(timeout)
        reap()
        return code

    def alive(self) -> bool:
        return group_alive(self.record)

    def stop(self, grace: float = 10.0) -> str:
        """SIGTERM the process's own group, SIGKILL it after ``grace`` seconds; returns what it took."""
        return terminate_group(self.record, grace)


@dataclass(frozen=True)
class LaunchFailed:
    reason: str


LaunchResult = Launched | LaunchFailed


def job_env() -> dict[str, str]:
    """Environment overrides for any Python process nbtrain starts: output unbuffered (the log is read
    live), no tokenizer thread pools forked into data workers, no progress bars filling the log."""
    return {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def worker_env(gpus: list[int]) -> dict[str, str]:
    """Environment overrides for a training worker (recorded in launch.json): the plan's GPUs only."""
    return {**job_env(), "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


# ------------------------------------------------------------------------------------------- starting
def start_process(
    argv: list[str],
    *,
    log: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
    replace_env: bool = False,
    warm: bool = True,
) -> LaunchResult:
    """Start ``argv`` in a new session with stdin closed and stdout+stderr appended to ``log``.

    ``env`` overrides entries of this process's environment (``replace_env``: is the whole environment);
    ``cwd`` None keeps this one's directory; ``pass_fds`` stay open in the child (every other descriptor
    is closed). A process the warm process serves (control.launch.warm) is forked by it when it can
    (``warm``), else started cold, with one line in ``log`` saying why.
    """
    reap()
    full_env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            offset = out.tell()
            if warm and warmclient.serves(argv):
                child = warmclient.try_warm(
                    argv, log_fd=out.fileno(), cwd=cwd, env=full_env, pass_fds=pass_fds
                )
                if isinstance(child, warmclient.WarmChild):
                    return Launched(child.pid, child.pid, list(argv), child.create_time, log, offset,
                                    _warm=child, boot_time=child.boot_time)  # fmt: skip
                out.write(f"nbtrain: cold start: {child}\n".encode())
                out.flush()
                if child.start_one:
                    start_warm(full_env)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=cwd, env=full_env, close_fds=True, pass_fds=pass_fds,
            )  # fmt: skip
    except OSError as e:
        return LaunchFailed(f"could not start {argv[0]}: {e}")
    _CHILDREN[proc.pid] = proc
    try:
        # Readable even if it has exited already: an uncollected child keeps its pid and /proc entry.
        began: dict[str, float | None] = dict(start_record(psutil.Process(proc.pid)))
    except psutil.Error:
        began = {"create_time": None, "boot_time": None}
    return Launched(proc.pid, proc.pid, list(argv), began["create_time"], log, offset, proc,
                    boot_time=began["boot_time"])  # fmt: skip


def start_warm(env: Mapping[str, str] | None = None) -> bool:
    """Start a warm process (nbtrain.worker.warm) for ``env`` (default: this process's) in the background
    unless one answers or this process started one in the last minute; True when one was started now.
    None starts while the machine's available memory is below the warm processes' floor
    (contract.warmproto.memory_short): it would exit again at its first look."""
    env = dict(os.environ if env is None else env)
    if not warmproto.enabled(env):
        return False
    vm = psutil.virtual_memory()
    if warmproto.memory_short(int(vm.available), int(vm.total), env) is not None:
        return False
    env = {**env, **job_env()}
    key = warmproto.env_key(env)
    folder = warmproto.warm_dir(env)
    env[warmproto.ENV_DIR] = str(folder)  # as resolved here: the warm process starts in another folder
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if warmproto.folder_problem(folder) is not None:
        return False  # another user's, or open to others: the next start says why, and starts cold
    if warmproto.held(folder / f"{key}.lock"):
        return False  # one is running, or still importing
    argv = [sys.executable, "-m", "nbtrain.worker.warm"]
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the warm process never touches a GPU; children get the plan's
    result = start_process(argv, log=folder / f"{key}.log", cwd=folder, env=env, replace_env=True, warm=False)
    return not isinstance(result, LaunchFailed)


def spawn(
    paths: RunPaths,
    commands: list[tuple[str, list[str]]],
    env_overrides: dict[str, str],
    *,
    port: int | None = None,
    pass_fds: tuple[int, ...] = (),
) -> LaunchResult:
    """Start each ``(log name, argv)`` of a run in its own session; record them all in launch.json.

    One command for a single node (the worker itself, or its launcher); one per node otherwise. If
    any fails to start, the ones already started are stopped again: nothing is left half-started.
    """
    started: list[tuple[str, Launched]] = []
    for log_name, argv in commands:
        result = start_process(
            argv, log=paths.logs / log_name, cwd=paths.root, env=env_overrides, pass_fds=pass_fds
        )
        if isinstance(result, LaunchFailed):
            for _, p in started:
                signal_group(p.record, signal.SIGKILL)
            return result
        started.append((log_name, result))
    procs = [{**p.record, "argv": p.argv, "log": log_name} for log_name, p in started]
    first = started[0][1]
    atomic_write_json(paths.launch, {
        "argv": first.argv, "env": env_overrides, "pid": first.pid, "pgid": first.pgid,
        "create_time": first.create_time, "boot_time": first.boot_time, "procs": procs,
        "host": socket.gethostname(), "port": port, "start_time": time.time(),
    })  # fmt: skip
    return first


def reap() -> None:
    """Collect the exit status of every child of ours that has ended."""
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


# ------------------------------------------------------------------------------------- running to the end
def run_to_end(
    argv: list[str],
    *,
    log: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    grace: float = 10.0,
    progress: str | None = None,
    say: Callable[[str], None] | None = None,
) -> int:
    """Start ``argv`` as start_process does, with job_env (as the warm process has it), and wait for it;
    returns its exit code. ``progress``: the lines its log gains that start with this are printed as
    they come (what a long job says it is doing), or handed to ``say`` (a widget's status line).

    After ``timeout`` seconds its process group is stopped (SIGTERM, ``grace`` s, SIGKILL) and
    subprocess.TimeoutExpired is raised. Anything else that ends the wait (KeyboardInterrupt from the
    notebook's stop button) stops the group too before it goes on: nothing keeps running behind the
    user's back.
    """
    offset = log.stat().st_size if log.exists() else 0
    started = start_process(argv, log=log, cwd=cwd, env={**job_env(), **(env or {})})
    if isinstance(started, LaunchFailed):
        raise NbtrainError(started.reason)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            step = 0.5 if progress else None
            if deadline is not None:
                step = max(0.0, min(step or timeout or 0.0, deadline - time.monotonic()))
            try:
                code = started.wait(step)
            except subprocess.TimeoutExpired:
                if progress:
                    offset = _print_progress(log, offset, progress, say)
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                continue
            if progress:
                _print_progress(log, offset, progress, say)
            return code
    except BaseException:
        started.stop(grace)
        raise


def _print_progress(log: Path, offset: int, prefix: str, say: Callable[[str], None] | None) -> int:
    """Print (or ``say``) the whole lines ``log`` gained after ``offset`` that start with ``prefix``; the
    new offset."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            chunk = f.read(1 << 20)
    except OSError:
        return offset
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].decode("utf-8", "replace").splitlines():
        if line.startswith(prefix):
            if say is None:
                print(line, flush=True)
            else:
                say(line)
    return offset + end


def run_job(
    job: str | Job,
    args: list[str],
    *,
    log: Path,
    result: Path,
    cwd: Path,
    what: str | None = None,
    timeout: float | None = None,
    timeout_hint: str = "",
    env: dict[str, str] | None = None,
    progress: str | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Run one-off job ``job`` (a name in ``contract.jobs.JOBS``, or a Job) to the end:
    ``python -m MODULE *args --result RESULT``; returns (exit code, the JSON it wrote to ``result``).

    Raises NbtrainError when it runs past ``timeout`` (it is stopped; ``timeout_hint`` says what to
    change) and, with the log's tail, when it died without writing its result. ``what`` names it in
    those errors (default: the table's).
    """
    spec = JOBS[job] if isinstance(job, str) else job
    what = what or spec.what
    argv = [sys.executable, "-m", spec.module, *args, "--result", str(result)]
    result.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:  # one log for every run of the job: each starts with what ran when
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
    # No GPU is hidden from the job (unlike a training worker's plan): it uses what the machine has.
    try:
        code = run_to_end(argv, log=log, cwd=cwd, env=env, timeout=timeout, progress=progress, say=say)
    except subprocess.TimeoutExpired:
        hint = f"; {timeout_hint}" if timeout_hint else ""
        raise NbtrainError(
            f"{what} did not finish in {timeout:.0f} s and was stopped; see {log}{hint}"
        ) from None
    try:
        data: dict[str, Any] = read_json(result)
    except (FileNotFoundError, ValueError):
        raise NbtrainError(
            f"{what} failed (exit code {code}) without a result; last lines of {log}:\n{tail_text(log, 30)}"
        ) from None
    return code, data


# ------------------------------------------------------------------------------ liveness and stopping
class NotALaunchRecord(NbtrainError, ValueError):
    """A launch.json that is there but is not a record nbtrain wrote (not JSON, or not of its shape): the
    processes of the run cannot be found from it."""


def load_launch(paths: RunPaths) -> dict[str, Any] | None:
    """launch.json, checked to be of the shape the spawner (or notebook_launch) writes; None while there
    is none. Raises NotALaunchRecord saying what is wrong with one that is not (NotRegularFile for a FIFO
    or a link)."""
    try:
        data = read_json(paths.launch, max_bytes=MAX_JSON_BYTES)
    except FileNotFoundError:
        return None
    except ValueError as e:  # not JSON, not UTF-8, too large, nested too deep
        raise NotALaunchRecord(f"{paths.launch} is not a launch record nbtrain wrote: {e}") from None
    if why := _launch_problem(data):
        raise NotALaunchRecord(f"{paths.launch} is not a launch record nbtrain wrote: {why}")
    record: dict[str, Any] = data
    return record


def read_launch(paths: RunPaths) -> dict[str, Any] | None:
    """launch.json, or None when there is none or it is no launch record (``load_launch`` says why)."""
    try:
        return load_launch(paths)
    except NotALaunchRecord:
        return None


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _launch_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a launch record, or None. Older records lack ``create_time``,
    ``boot_time`` or ``procs``; what is there has its type."""
    if not isinstance(data, dict):
        kinds = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        return f"it holds {kinds.get(type(data), 'null')}, not a JSON object"
    if not isinstance(data.get("host"), str):
        return "it names no host"
    if data.get("notebook"):
        if not (_whole(data.get("kernel_pid")) and _number(data.get("start_time"))):
            return "a notebook_launcher record names no kernel pid and start time"
        return None
    procs = data.get("procs", [])
    if not isinstance(procs, list):
        return "its procs is not a list"
    for rec in [data, *procs]:
        if not isinstance(rec, dict) or not _whole(rec.get("pid")):
            return "it names no process id"
        if not all(_whole(rec[k]) for k in ("pgid",) if k in rec) or not all(
            rec[k] is None or _number(rec[k]) for k in ("create_time", "boot_time") if k in rec
        ):
            return "its process group or start time is not a number"
    return None


def is_local(launch: dict[str, Any]) -> bool:
    return bool(launch.get("host") == socket.gethostname())


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes in process group ``pgid``, whoever started them."""
    reap()
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _procs(launch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The group records of a launch.json (one per node) or of a single record (serve.json, ...)."""
    procs: list[Mapping[str, Any]] = launch.get("procs") or [launch]
    return procs


def _identity(rec: Mapping[str, Any]) -> tuple[int, int, float | None]:
    """(leader pid, pgid, leader create_time or None) of a record; tensorboard.json keeps no pgid."""
    pid = int(rec["pid"])
    ct = rec.get("create_time")
    return pid, int(rec.get("pgid", pid)), None if ct is None else float(ct)


def _is(p: psutil.Process, create_time: float, rec: Mapping[str, Any]) -> bool:
    """Whether ``p`` is the recorded process: started when the record says, by this user. A record naming
    another user's process (whoever wrote it) names nothing of ours to wait for or signal."""
    return bool(p.uids().real == os.getuid() and same_start(p, create_time, rec.get("boot_time")))


def leader_alive(rec: Mapping[str, Any]) -> bool:
    """Whether the recorded leader still runs: the same process, recognised by its start time."""
    reap()
    try:
        pid, _, ct = _identity(rec)
        leader = psutil.Process(pid)
        return bool(ct is not None and _is(leader, ct, rec) and leader.status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _members(rec: Mapping[str, Any]) -> list[psutil.Process]:
    """The live processes of the recorded group, or [] when the group is gone and its number now
    belongs to other processes."""
    try:
        pid, pgid, ct = _identity(rec)
    except (KeyError, TypeError, ValueError):
        return []
    if ct is None:
        # a record without its leader's start time (written before it was kept, or by someone else): the
        # number cannot be checked against the process now holding it, so nothing is signalled
        return []
    members = group_members(pgid)
    if not members:
        return members
    try:
        return members if _is(psutil.Process(pid), ct, rec) else []  # the number was given to another
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:  # there, but not to be looked at: not ours
        return []

    # The leader has exited while processes of the group remain (a launcher's ranks, say). Processes
    # can only join a group inside its session, that is, be descendants of the leader: any member
    # older than our leader shows that the number now names somebody else's group.
    for m in members:
        try:
            if started_before(m, ct, rec.get("boot_time")):
                return []
        except psutil.NoSuchProcess:
            continue  # ended while we looked
    return members


def group_alive(launch: Mapping[str, Any]) -> bool:
    """Whether any process of the recorded process groups still runs (on this host)."""
    procs = _procs(launch)
    if any(leader_alive(p) for p in procs):
        return True  # the fast path: a leader is there
    return any(_members(p) for p in procs)  # a leader's children may outlive it


def run_alive(launch: dict[str, Any]) -> bool:
    """Whether something can still finish this run: its process groups, or for a notebook_launcher run
    the kernel whose thread supervises the ranks (it writes the final state)."""
    if launch.get("notebook"):
        try:
            kernel = psutil.Process(int(launch["kernel_pid"]))
            return bool(
                kernel.uids().real == os.getuid()
                and kernel.status() != psutil.STATUS_ZOMBIE
                and kernel.create_time() <= launch["start_time"]
            )
        except (psutil.Error, KeyError, TypeError, ValueError):
            return False
    return group_alive(launch)


def signal_group(launch: Mapping[str, Any], sig: int) -> bool:
    """Send ``sig`` to the recorded process groups that are still ours; False when none is left."""
    sent = False
    for p in _procs(launch):
        if not _members(p):  # the identity check, right before every killpg
            continue
        try:
            os.killpg(int(p.get("pgid", p["pid"])), sig)
            sent = True
        except ProcessLookupError:
            continue
    return sent


def wait_group_gone(launch: Mapping[str, Any], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(launch):
            return True
        time.sleep(interval)
    return not group_alive(launch)


def terminate_group(launch: Mapping[str, Any], grace: float) -> str:
    """SIGTERM the recorded groups, wait ``grace`` seconds, then SIGKILL them. Returns what it took."""
    if not signal_group(launch, signal.SIGTERM):
        how = "gone"
    elif wait_group_gone(launch, grace):
        how = "terminated"
    else:
        signal_group(launch, signal.SIGKILL)
        wait_group_gone(launch, 10)
        how = "killed"
    reap()  # a leader of ours that just ended is collected now, not at the next call
    return how
