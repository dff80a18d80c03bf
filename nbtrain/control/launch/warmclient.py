"""Warm start, the client's side: ask this user's warm process (nbtrain.worker.warm) to fork a process that
would otherwise start cold.

``try_warm`` is called by the one spawner (control.launch.process.start_process) for the processes a warm
process serves; any failure returns the reason, the spawner starts the process cold (and, when none
answers, a warm process for the next run) and the run's log says why in one line. ``NBTRAIN_WARM=0``
turns it off. Starting, listing and stopping warm processes is nbtrain.control.launch.warm.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from nbtrain.contract import warmproto
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


@dataclass(frozen=True)
class Cold:
    """Why a process starts cold; ``start_one``: no warm process answers for this environment (none yet, or
    a stale one that exits), so the spawner starts one for the next run."""

    reason: str
    start_one: bool = False

    def __str__(self) -> str:
        return self.reason


def serves(argv: list[str]) -> bool:
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in warmproto.SERVED


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
) -> WarmChild | Cold:
    """The child the warm process forked for ``argv``, or why it could not (start cold then)."""
    if not warmproto.enabled(env):
        return Cold(f"{warmproto.ENV_OFF}=0")
    key = warmproto.env_key(env)
    path = warmproto.socket_path(key, env)
    if why := warmproto.folder_problem(warmproto.warm_dir(env)):
        return Cold(why)
    sweep_exit_files(warmproto.warm_dir(env) / "exit")  # at every start: the ones nobody will read
    try:
        s = _connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return Cold("no warm process was running yet (one is starting for the next run)", start_one=True)
    except OSError as e:  # its queue is full (BlockingIOError), or it took too long to take the call
        return Cold(f"the warm process is busy ({type(e).__name__}: {e})")
    creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # pid, uid, gid of who listens
    if (uid := int.from_bytes(creds[4:8], sys.byteorder)) != os.geteuid():
        s.close()
        return Cold(f"the warm socket {path} is served by uid {uid}, not by you: nothing was sent to it")
    exits = warmproto.warm_dir(env) / "exit"
    exit_file = exits / f"{os.getpid()}-{time.monotonic_ns()}"
    try:
        exits.mkdir(exist_ok=True, mode=0o700)
        with s:
            request = {"argv": argv, "cwd": str(cwd or os.getcwd()), "env": dict(env), "fds": list(pass_fds),
                       "exit_file": str(exit_file)}  # fmt: skip
            warmproto.send_request(s, request, [log_fd, *pass_fds])
            s.settimeout(REPLY_TIMEOUT)
            reply = warmproto.recv_reply(s)
    except (OSError, ValueError) as e:
        return Cold(f"the warm process did not answer ({type(e).__name__}: {e})")
    if "pid" not in reply:
        why = str(reply.get("cold") or reply)
        return Cold(
            why, start_one="changed since" in why
        )  # the stale one exits: a fresh one for the next run
    pid = int(reply["pid"])
    try:
        began: dict[str, float | None] = dict(start_record(psutil.Process(pid)))
    except psutil.Error:
        began = {"create_time": None, "boot_time": None}
    return WarmChild(pid, began["create_time"], exit_file, boot_time=began["boot_time"])


EXIT_FILE_DAYS = 1.0  # an exit file nobody read by then never will be


def sweep_exit_files(exits: Path) -> int:
    """Remove the exit files nobody will read: those of a process that asked for the child and is gone
    (each file is named after the pid that asked), and any older than EXIT_FILE_DAYS. Returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(exits))
    except OSError:
        return 0
    for e in entries:
        try:
            asker = int(e.name.split("-", 1)[0])
            stale = time.time() - e.stat(follow_symlinks=False).st_mtime > EXIT_FILE_DAYS * 86400
            if stale or not psutil.pid_exists(asker):
                os.unlink(e.path)
                removed += 1
        except (OSError, ValueError):
            continue
    return removed
