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

from nbtrain.contract import warmproto
from nbtrain.control.launch.process import job_env, start_warm

start = start_warm  # the spawner's own: it also starts one when a start finds none


def status(env: Mapping[str, str] | None = None, *, every_home: bool = False) -> list[dict[str, Any]]:
    """Every warm process of this user in the warm folder (``every_home``: also those of this user's other
    NBTRAIN_HOMEs, from the per-user folder they register in): pid, key, warm folder, memory held (RSS),
    how long it has idled (None where it did not register), uptime, and whether it serves this process's
    environment."""
    env = os.environ if env is None else env
    mine = warmproto.env_key({**env, **job_env()})
    entries = {int(e["pid"]): e for e in warmproto.registered(env)}
    infos = []
    for info_file in sorted(warmproto.warm_dir(env).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            infos.append(json.loads(info_file.read_text()))
    if every_home:
        listed = {info.get("pid") for info in infos}
        infos += [e for pid, e in entries.items() if pid not in listed and e.get("socket")]  # ready ones
    out = []
    now = time.time()
    for info in infos:
        try:
            proc = psutil.Process(int(info["pid"]))
            if abs(proc.create_time() - float(info["created"])) > 1:
                continue  # a reused pid
            rss = proc.memory_info().rss
            entry = entries.get(int(info["pid"]))
            out.append({
                "pid": info["pid"], "key": info["key"], "rss_bytes": rss, "ready_s": info.get("ready_s"),
                "uptime_s": round(now - float(info["started"]), 1), "this_kernel": info["key"] == mine,
                "socket": info.get("socket"), "python": info.get("python"),
                "folder": str(Path(str(info["socket"])).parent) if info.get("socket") else None,
                "idle_s": round(now - float(entry["last_used"]), 1) if entry else None,
            })  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            continue
    return out


def release_idle(why: str, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Ask every idle warm process of this user (every NBTRAIN_HOME) to exit and wait until each has, so
    the memory it held is available; returns the ones that exited (pid, key, rss_bytes). Each is asked over
    its own socket and answers between requests (contract.warmproto.ask_to_exit): none exits while it
    forks."""
    gone = []
    for entry in warmproto.registered(env):
        pid, created = int(entry["pid"]), float(entry["created"])
        try:
            rss = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
        if warmproto.ask_to_exit(entry, why) and warmproto.wait_gone(pid, created):
            gone.append({"pid": pid, "key": entry.get("key"), "rss_bytes": rss})
    return gone


def memory_short(env: Mapping[str, str] | None = None) -> str | None:
    """Why no warm process starts or stays now (the machine's available memory is below their floor)."""
    vm = psutil.virtual_memory()
    return warmproto.memory_short(int(vm.available), int(vm.total), env)


def reclaimable(env: Mapping[str, str] | None = None) -> int:
    """Bytes (RSS) the ready warm processes of this user hold: what ``release_idle`` would give back."""
    total = 0
    for entry in warmproto.registered(env):
        if entry.get("socket"):
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(int(entry["pid"])).memory_info().rss
    return total


def stop(env: Mapping[str, str] | None = None) -> int:
    """SIGTERM every warm process of this user in the warm folder, the ready ones and those still
    importing (found by the lock each holds, which names it); returns how many."""
    pids = {int(row["pid"]) for row in status(env)} | set(
        _starting(warmproto.warm_dir(os.environ if env is None else env))
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
            if abs(proc.create_time() - float(created)) > 1 or not warmproto.held(lock):
                continue
            if "nbtrain.worker.warm" not in " ".join(proc.cmdline()):
                continue
        except (OSError, ValueError, psutil.Error):
            continue
        out.append(int(pid))
    return out
