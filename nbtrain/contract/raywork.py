"""What one worker of a Ray run reserves on the cluster, and how many such workers its nodes have room
for: the planner (control/plan/target), the sweep's capacity and the job's driver (worker/rayjob) read the
same rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def worker_resources(given: Mapping[str, Any] | None, gpu: bool) -> dict[str, float]:
    """``ray: resources_per_worker`` as given, else one GPU a worker where the run trains on GPUs and one
    CPU where it does not (Ray Train's own default)."""
    if given:
        return {str(k): float(v) for k, v in given.items()}
    return {"GPU": 1.0} if gpu else {"CPU": 1.0}


def room(nodes: Iterable[Mapping[str, float]], need: Mapping[str, float]) -> int:
    """Workers of ``need`` the nodes (each its resources: {"CPU": 4, "GPU": 1, ...}) hold side by side."""
    total = 0
    for res in nodes:
        fits = [int(res.get(k, 0.0) // v) for k, v in need.items() if v > 0]
        total += min(fits) if fits else 0
    return total
