"""Start training processes detached from the kernel, and stop exactly the process groups we started.

A worker is started with ``sys.executable`` and an argv list, in a new session (so it is the leader of
its own process group and no terminal or kernel signal reaches it), with stdin closed and output going
to a log file, never to a pipe. What was started is recorded in launch.json, so any process can find
and stop it later.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nbtrain.rundir import RunPaths, atomic_write_json, read_json

# Workers this process started, kept so their exit status is collected (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Launched:
    pid: int
    pgid: int
    argv: list[str]


@dataclass(frozen=True)
class LaunchFailed:
    reason: str


LaunchResult = Launched | LaunchFailed


def worker_env(gpus: list[int]) -> dict[str, str]:
    """Environment overrides for a worker (recorded in launch.json)."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def _spawn(
    argv: list[str], log_path: Path, cwd: Path, env_overrides: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {**os.environ, **env_overrides}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=cwd, env=env, close_fds=True,
        )  # fmt: skip
    _CHILDREN[proc.pid] = proc
    return proc


def spawn(
    paths: RunPaths,
    commands: list[tuple[str, list[str]]],
    env_overrides: dict[str, str],
    *,
    port: int | None = None,
) -> LaunchResult:
    """Start each ``(log name, argv)`` in its own session; record them all in launch.json.

    One command for a single node (the worker itself, or its launcher); one per node otherwise. If
    any fails to start, the ones already started are stopped again: nothing is left half-started.
    """
    procs: list[dict[str, Any]] = []
    started: list[subprocess.Popen[bytes]] = []
    for log_name, argv in commands:
        try:
            proc = _spawn(argv, paths.logs / log_name, paths.root, env_overrides)
        except OSError as e:
            for p in started:
                _kill_group(p.pid)
            return LaunchFailed(f"could not start {argv[0]}: {e}")
        started.append(proc)
        try:
            create_time: float | None = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = None
        procs.append(
            {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "log": log_name, "create_time": create_time}
        )
    first = procs[0]
    atomic_write_json(paths.launch, {
        "argv": first["argv"], "env": env_overrides, "pid": first["pid"], "pgid": first["pgid"],
        "create_time": first["create_time"], "procs": procs,
        "host": socket.gethostname(), "port": port, "start_time": time.time(),
    })  # fmt: skip
    return Launched(first["pid"], first["pgid"], first["argv"])


def spawn_worker(paths: RunPaths, env_overrides: dict[str, str]) -> LaunchResult:
    """One training process, started directly (no launcher parent)."""
    argv = [sys.executable, "-m", "nbtrain.worker", str(paths.root)]
    return spawn(paths, [(paths.rank_log(0).name, argv)], env_overrides)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def reap() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def read_launch(paths: RunPaths) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = read_json(paths.launch)
        return data
    except (FileNotFoundError, ValueError):
        return None


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes in process group ``pgid``."""
    reap()
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def is_local(launch: dict[str, Any]) -> bool:
    return bool(launch.get("host") == socket.gethostname())


def _procs(launch: dict[str, Any]) -> list[dict[str, Any]]:
    procs: list[dict[str, Any]] = launch.get("procs") or [launch]
    return procs


def _leader_alive(proc: dict[str, Any]) -> bool:
    # Recognised by its start time, so a reused pid does not count.
    try:
        leader = psutil.Process(int(proc["pgid"]))
        ct = proc.get("create_time")
        same = ct is None or abs(leader.create_time() - ct) < 0.01
        return bool(same and leader.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def group_alive(launch: dict[str, Any]) -> bool:
    """Whether any process of the run's process groups still runs (on this host)."""
    reap()
    procs = _procs(launch)
    if any(_leader_alive(p) for p in procs):
        return True  # the fast path: a leader is there
    return any(group_members(int(p["pgid"])) for p in procs)  # a leader's children may outlive it


def run_alive(launch: dict[str, Any]) -> bool:
    """Whether something can still finish this run: its process groups, or for a notebook_launcher run
    the kernel whose thread supervises the ranks (it writes the final state)."""
    if launch.get("notebook"):
        try:
            kernel = psutil.Process(int(launch["kernel_pid"]))
            return bool(
                kernel.status() != psutil.STATUS_ZOMBIE and kernel.create_time() <= launch["start_time"]
            )
        except psutil.Error:
            return False
    return group_alive(launch)


def signal_group(launch: dict[str, Any], sig: int) -> bool:
    """Send ``sig`` to the run's own process groups; False when they are all gone already."""
    sent = False
    for p in _procs(launch):
        pgid = int(p["pgid"])
        if not group_members(pgid):
            continue
        try:
            os.killpg(pgid, sig)
            sent = True
        except ProcessLookupError:
            continue
    return sent


def wait_group_gone(launch: dict[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(launch):
            return True
        time.sleep(0.1)
    return not group_alive(launch)


def terminate_group(launch: dict[str, Any], grace: float) -> str:
    """SIGTERM the run's groups, wait ``grace`` seconds, then SIGKILL them. Returns what it took."""
    if not signal_group(launch, signal.SIGTERM):
        return "gone"
    if wait_group_gone(launch, grace):
        return "terminated"
    signal_group(launch, signal.SIGKILL)
    wait_group_gone(launch, 10)
    return "killed"
