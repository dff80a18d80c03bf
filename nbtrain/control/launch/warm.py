"""Warm start, the manager's side: start this user's warm process (nbtrain.worker.warm) for an environment,
list the running ones and stop them (``%finetune warm``, ``nbtrain warm``). Asking one to fork a process is
nbtrain.control.launch.warmclient; the spawner starts a warm process through ``start`` when none answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from nbtrain.contract import warm as proto
from nbtrain.control.launch.process import job_env, start_warm

start = start_warm  # the spawner's own: it also starts one when a start finds none


def status(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every warm process of this user in the warm folder: pid, key, memory held, uptime, and whether it
    serves this process's environment."""
    env = os.environ if env is None else env
    mine = proto.env_key({**env, **job_env()})
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
            if abs(proc.create_time() - float(created)) > 1 or not proto.held(lock):
                continue
            if "nbtrain.worker.warm" not in " ".join(proc.cmdline()):
                continue
        except (OSError, ValueError, psutil.Error):
            continue
        out.append(int(pid))
    return out
