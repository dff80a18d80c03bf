"""Run directories written the way a worker writes them, for tests of the readers (server, browser)."""

from __future__ import annotations

import time
from pathlib import Path

from nbtrain import registry
from nbtrain.rundir import JsonlWriter, RunPaths, atomic_write_json, write_status


def make_run(
    run_id: str, *, state: str = "running", step: int = 0, losses: tuple[float, ...] = ()
) -> RunPaths:
    """A registered run directory as a worker leaves it: resolved.json, status.json, metrics, a log."""
    root = Path.cwd() / "runs" / run_id
    paths = RunPaths(root)
    paths.make()
    atomic_write_json(paths.resolved, {"id": run_id, "name": run_id.split("-")[0], "config": {}})
    write_status(paths, state, step=step, max_steps=10)
    w = JsonlWriter(paths.metrics, "metrics")
    for i, loss in enumerate(losses, 1):
        w.write({"t": time.time(), "step": i, "loss": loss})
    w.close()
    paths.rank_log(0).write_text("".join(f"line {i}\n" for i in range(100)), encoding="utf-8")
    registry.add(run_id, run_id.split("-")[0], root, state)
    return paths
