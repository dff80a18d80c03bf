"""Run directories written the way a worker writes them, for tests of the readers (server, browser)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from nbtrain.contract.rundir import COMPLETE_MARKER, JsonlWriter, RunPaths, atomic_write_json, write_status
from nbtrain.control.runs import registry


def make_run(
    run_id: str,
    *,
    state: str = "running",
    step: int = 0,
    losses: tuple[float, ...] = (),
    name: str | None = None,
    checkpoint: int | None = None,
    created: float | None = None,
    model: str | None = None,
) -> RunPaths:
    """A registered run directory as a worker leaves it: resolved.json, status.json, metrics, a log, and
    with ``checkpoint`` a complete (marked) ``checkpoints/checkpoint-N``."""
    root = Path.cwd() / "runs" / run_id
    paths = RunPaths(root)
    paths.make()
    name = name or run_id.split("-")[0]
    config = {"model": model} if model else {}
    atomic_write_json(paths.resolved, {"id": run_id, "name": name, "config": config})
    write_status(paths, state, step=step, max_steps=10)
    if checkpoint is not None:
        ckpt = paths.checkpoints / f"checkpoint-{checkpoint}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": checkpoint}), encoding="utf-8")
        (ckpt / COMPLETE_MARKER).write_text("", encoding="utf-8")
    w = JsonlWriter(paths.metrics, "metrics")
    for i, loss in enumerate(losses, 1):
        w.write({"t": time.time(), "step": i, "loss": loss})
    w.close()
    paths.rank_log(0).write_text("".join(f"line {i}\n" for i in range(100)), encoding="utf-8")
    registry.add(run_id, name, root, created)
    return paths
