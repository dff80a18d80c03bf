"""Warm start, the kernel's side: ask this user's warm process (nbtrain.worker.warm) to fork a process that
would otherwise start cold, start one when there is none, and show or stop it.

``try_warm`` is called by the one spawner (control.process.start_process) for the processes a warm process
serves; any failure returns the reason, the spawner starts the process cold and the run's log says why in
one line. ``NBTRAIN_WARM=0`` turns it off. The warm process is started in the background the first time
nothing answers (and by ``%load_ext nbtrain``), so the start that found none is cold and later ones warm.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nbtrain.contract import warm as proto
from nbtrain.hardware.clock import same_start, start_record

CONNECT_TIMEOUT = 2.0
REPLY_TIMEOUT = 30.0


@dataclass
class WarmChild:
    """A process the warm process forked: not this process's child, so its exit status comes from the
    file it writes as it exits (``exit_file``)."""

    pid: int
    create_time: float | None
    exit_file: Path
    code: int | None = None
    boot_time: float | None = None  # what create_time was computed with (hardware/clock.py)

    def exit_code(self) -> int | None:
        """None while it runs; its exit status once it ended (-9 when it was killed before it could say)."""
        if self.code is not None:
            return self.code
        try:
            p = psutil.Process(self.pid)
            same = self.create_time is None or same_start(p, self.create_time, self.boot_time)
            if same and p.status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            pass
        try:
            code = int(self.exit_file.read_text())
        except (OSError, ValueError):
            code = -signal.SIGKILL
        self.exit_file.unlink(missing_ok=True)
        self.code = code
        return code


def serves(argv: list[str]) -> bool:
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in proto.SERVED


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(CONNECT_TIMEOUT)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        s.connect(f"/proc/self/fd/{dfd}/{path.name}")
    except BaseException:
        s.close()
        raise
    finally:
        os.close(dfd)
    return s


def try_warm(
    argv: list[str], *, log_fd: int, cwd: Path | None, env: Mapping[str, str], pass_fds: tuple[int, ...]
) -> WarmChild | str:
    """The child the warm process forked for ``argv``, or why it could not (start cold then)."""
    if not proto.enabled(env):
        return f"{proto.ENV_OFF}=0"
    key = proto.env_key(env)
    path = proto.socket_path(key, env)
    try:
        s = _connect(path)
    except OSError:
        start(env)
        return "no warm process was running yet (one is starting for the next run)"
    exits = proto.warm_dir(env) / "exit"
    exit_file = exits / f"{os.getpid()}-{time.monotonic_ns()}"
    try:
        exits.mkdir(exist_ok=True, mode=0o700)
        with s:
            request = {"argv": argv, "cwd": str(cwd or os.getcwd()), "env": dict(env), "fds": list(pass_fds),
                       "exit_file": str(exit_file)}  # fmt: skip
            proto.send_request(s, request, [log_fd, *pass_fds])
            s.settimeout(REPLY_TIMEOUT)
            reply = proto.recv_reply(s)
    except (OSError, ValueError) as e:
        return f"the warm process did not answer ({type(e).__name__}: {e})"
    if "pid" not in reply:
        why = str(reply.get("cold") or reply)
        if "changed since" in why:
            start(env)  # the stale one exits: a fresh one for the next run
        return why
    pid = int(reply["pid"])
    try:
        began: dict[str, float | None] = dict(start_record(psutil.Process(pid)))
    except psutil.Error:
        began = {"create_time": None, "boot_time": None}
    return WarmChild(pid, began["create_time"], exit_file, boot_time=began["boot_time"])


def start(env: Mapping[str, str] | None = None) -> bool:
    """Start a warm process for ``env`` (default: this process's) in the background unless one answers or
    this process started one in the last minute; True when one was started now."""
    from nbtrain.control.process import LaunchFailed, job_env, start_process

    env = dict(os.environ if env is None else env)
    if not proto.enabled(env):
        return False
    env = {**env, **job_env()}
    key = proto.env_key(env)
    folder = proto.warm_dir(env)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if _held(folder / f"{key}.lock"):
        return False  # one is running, or still importing
    argv = [sys.executable, "-m", "nbtrain.worker.warm"]
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the warm process never touches a GPU; children get the plan's
    result = start_process(argv, log=folder / f"{key}.log", cwd=folder, env=env, replace_env=True, warm=False)
    return not isinstance(result, LaunchFailed)


def _held(lock: Path) -> bool:
    """Whether a warm process holds ``lock`` (it takes it first thing and keeps it while it lives)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock this probe may have taken
    return False


def status(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every warm process of this user in the warm folder: pid, key, memory held, uptime, and whether it
    serves this process's environment."""
    env = os.environ if env is None else env
    mine = proto.env_key({**env, **_job_env()})
    out = []
    for info_file in sorted(proto.warm_dir(env).glob("*.json")):
        try:
            info = json.loads(info_file.read_text())
            proc = psutil.Process(int(info["pid"]))
            if abs(proc.create_time() - float(info["created"])) > 1:
                continue  # a reused pid
            rss = proc.memory_info().rss
        except (OSError, ValueError, KeyError, psutil.Error):
            continue
        out.append({
            "pid": info["pid"], "key": info["key"], "rss_bytes": rss, "ready_s": info.get("ready_s"),
            "uptime_s": round(time.time() - float(info["started"]), 1), "this_kernel": info["key"] == mine,
            "socket": info.get("socket"),
        })  # fmt: skip
    return out


def stop(env: Mapping[str, str] | None = None) -> int:
    """SIGTERM every warm process of this user in the warm folder, the ready ones and those still
    importing (found by the lock each holds, which names it); returns how many."""
    pids = {int(row["pid"]) for row in status(env)} | set(
        _starting(proto.warm_dir(os.environ if env is None else env))
    )
    n = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            psutil.Process(pid).send_signal(signal.SIGTERM)
            n += 1
    return n


def _starting(folder: Path) -> list[int]:
    """The warm processes holding a lock in ``folder``, from what each wrote in it ("PID CREATED"),
    checked against the process itself (a reused pid is left alone)."""
    out = []
    for lock in folder.glob("*.lock"):
        try:
            pid, created = lock.read_text().split()
            proc = psutil.Process(int(pid))
            if abs(proc.create_time() - float(created)) > 1 or not _held(lock):
                continue
            if "nbtrain.worker.warm" not in " ".join(proc.cmdline()):
                continue
        except (OSError, ValueError, psutil.Error):
            continue
        out.append(int(pid))
    return out


def _job_env() -> dict[str, str]:
    from nbtrain.control.process import job_env

    return job_env()
