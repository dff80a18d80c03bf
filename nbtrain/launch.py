"""Start training processes detached from the kernel, and stop exactly the process groups we started.

A worker is started with ``sys.executable`` and an argv list, in a new session (so it is the leader of
its own process group and no terminal or kernel signal reaches it), with stdin closed and output going
to a log file, never to a pipe. What was started is recorded in launch.json, so any process can find
and stop it later.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
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


def spawn_worker(paths: RunPaths, env_overrides: dict[str, str]) -> LaunchResult:
    argv = [sys.executable, "-m", "nbtrain.worker", str(paths.root)]
    env = {**os.environ, **env_overrides}
    paths.logs.mkdir(parents=True, exist_ok=True)
    try:
        with open(paths.rank_log(0), "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=paths.root,
                env=env,
                close_fds=True,
            )
    except OSError as e:
        return LaunchFailed(f"could not start {argv[0]}: {e}")
    _CHILDREN[proc.pid] = proc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = None
    atomic_write_json(
        paths.launch,
        {
            "argv": argv,
            "env": env_overrides,
            "pid": proc.pid,
            "pgid": proc.pid,
            "host": socket.gethostname(),
            "port": None,
            "start_time": time.time(),
            "create_time": create_time,
        },
    )
    return Launched(proc.pid, proc.pid, argv)


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


def group_alive(launch: dict[str, Any]) -> bool:
    """Whether any process of the launched group still runs (on this host)."""
    reap()
    # Fast path: the group leader itself, recognised by its start time so a reused pid does not count.
    try:
        leader = psutil.Process(int(launch["pgid"]))
        same = launch.get("create_time") is None or abs(leader.create_time() - launch["create_time"]) < 0.01
        if same and leader.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.Error:
        pass  # the leader is gone; its children may live on in the group
    return bool(group_members(int(launch["pgid"])))


def signal_group(launch: dict[str, Any], sig: int) -> bool:
    """Send ``sig`` to the run's own process group; False when it is already gone."""
    pgid = int(launch["pgid"])
    if not group_members(pgid):
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_group_gone(launch: dict[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(launch):
            return True
        time.sleep(0.1)
    return not group_alive(launch)


def terminate_group(launch: dict[str, Any], grace: float) -> str:
    """SIGTERM the group, wait ``grace`` seconds, then SIGKILL it. Returns what it took."""
    if not signal_group(launch, signal.SIGTERM):
        return "gone"
    if wait_group_gone(launch, grace):
        return "terminated"
    signal_group(launch, signal.SIGKILL)
    wait_group_gone(launch, 10)
    return "killed"
