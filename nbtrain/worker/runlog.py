"""Logging from inside a training function started by ``nbtrain.launch_function`` (stdlib only).

    def train():
        ...
        for step in range(n):
            ...
            nbtrain.log(step=step, loss=loss.item())
            if nbtrain.should_stop():
                break

Both read NBTRAIN_RUN_DIR, which nbtrain sets for the processes it starts. Only rank 0 writes metrics,
so a function can call ``log`` on every rank.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import JsonlWriter, RunPaths, write_status

_STATE: dict[str, Any] = {"writer": None, "dir": None, "last_status": 0.0, "signalled": False}


def _paths() -> RunPaths:
    run_dir = os.environ.get("NBTRAIN_RUN_DIR")
    if not run_dir:
        raise NbtrainError(
            "nbtrain.log() and nbtrain.should_stop() work inside a function started by "
            "nbtrain.launch_function() (or %finetune launch-function); NBTRAIN_RUN_DIR is not set here"
        )
    return RunPaths(Path(run_dir))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def log(step: int | None = None, **values: float) -> None:
    """Append one metrics record (rank 0 only) and keep status.json's step current."""
    paths = _paths()
    if _rank() != 0:
        return
    if _STATE["dir"] != paths.root:
        _STATE["writer"] = JsonlWriter(paths.metrics, "metrics")
        _STATE["dir"] = paths.root
    rec: dict[str, Any] = {"t": time.time()}
    if step is not None:
        rec["step"] = int(step)
    for k, v in values.items():
        rec[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    _STATE["writer"].write(rec)
    now = time.monotonic()
    if step is not None and now - _STATE["last_status"] >= 0.5:
        _STATE["last_status"] = now
        max_steps = values.get("max_steps")
        write_status(paths, "running", step=int(step), max_steps=int(max_steps) if max_steps else None)


def should_stop() -> bool:
    """True once a stop was asked for (``Run.stop()``, ``%finetune stop``, or SIGTERM).

    Call it on every rank at the same point of the loop: under torch.distributed the ranks agree (one
    tiny all-reduce), so they all leave the loop after the same step instead of one rank waiting
    forever in the next collective.
    """
    local = stop_requested_here()
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return local
    import torch

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def stop_requested_here() -> bool:
    """This process's own view of a stop request, with no collective (safe after the ranks are done)."""
    return bool(_STATE["signalled"]) or _paths().control_file("stop").exists()


def mark_signalled() -> None:
    _STATE["signalled"] = True
