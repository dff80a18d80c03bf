"""How fast runs like a planned one went on this machine, for the plan's expected duration: the seconds a
step of the newest completed run of the same model, method, device and batch (micro-batch, accumulation,
processes), read back from its own records (``resolved.json``, ``status.json``'s Trainer summary).

Measured, not modelled: nbtrain has no throughput model (the estimate is of memory), so where no such run
has finished here there is no duration to give, and the caller says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nbtrain.contract.rundir import MAX_JSON_BYTES, RunPaths, read_json
from nbtrain.control.runs import registry

LOOK_AT: Final = 50  # the newest runs read, at most


@dataclass(frozen=True)
class Timed:
    name: str  # the run timed
    seconds_per_step: float  # its Trainer's runtime over its steps


def kind(resolved: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two runs' steps comparable: model, method, device and the batch's shape."""
    plan, args = resolved.get("plan") or {}, resolved.get("train_args") or {}
    return (
        (resolved.get("config") or {}).get("model"),
        plan.get("method"),
        plan.get("device"),
        plan.get("world_size"),
        args.get("per_device_train_batch_size"),
        args.get("gradient_accumulation_steps"),
        args.get("max_length"),
    )


def step_time(want: tuple[Any, ...]) -> Timed | None:
    """The newest completed run of ``kind`` ``want`` here, and its seconds a step; None when there is none."""
    for row in reversed(registry.rows()[-LOOK_AT:]):
        paths = RunPaths(Path(row.run_dir))
        try:  # bounded, regular files inside the run directory: what every other reader of them asks
            status = read_json(paths.status, max_bytes=MAX_JSON_BYTES, below=paths.root)
            if not isinstance(status, dict) or status.get("state") != "completed":
                continue
            resolved = read_json(paths.resolved, max_bytes=MAX_JSON_BYTES, below=paths.root)
            if not isinstance(resolved, dict) or kind(resolved) != want:
                continue
        except (OSError, ValueError, AttributeError):
            continue
        runtime, steps = (status.get("summary") or {}).get("train_runtime"), status.get("step")
        if isinstance(runtime, (int, float)) and isinstance(steps, int) and steps > 0 and runtime > 0:
            return Timed(row.name, runtime / steps)
    return None
