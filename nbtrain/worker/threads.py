"""Torch's CPU threads for a one-process run on a CPU: as many as the cores other processes leave free,
followed while the run trains.

Torch starts one intra-op thread per core, and a training step on a CPU is hundreds of small parallel
regions, each ending at a barrier where every thread waits for the slowest. When another process keeps a
core busy, one of the run's threads waits for the scheduler at every barrier. Measured on this project's
2-core machines (the tiny model, 60 steps): one busy process beside the run took a step from 0.013 s to
0.75 s with 2 threads, and to 0.017 s with 1 (bench/bench_threads.py). A notebook's machine is rarely
idle: JupyterLab, a browser, a chat server, another run. So the run measures, every few seconds, how much
CPU the other processes used (the machine's busy time less its own) and keeps a thread per core they
left free, at least one, at most its share (a sweep's trial) or the cores.

Not used where the user set ``OMP_NUM_THREADS`` (their number stands) or under a launcher that gives each
rank its own (torchrun, deepspeed: several ranks). The one-off jobs and the model server (``settle``) look
once, as they start, and keep that count: their threads (a server's generations) inherit it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

INTERVAL = 5.0  # seconds between two looks at the machine's load
FIRST = 1.0  # the first look, once this much of the run has been measured
# A core counts as free while other processes keep it busy less than this share of the time: a core a
# quarter busy already makes a thread on it wait at the barriers.
FREE_BELOW = 0.25


def _busy() -> float:
    """The machine's busy CPU seconds so far, all cores (what is neither idle nor waiting on I/O)."""
    t = psutil.cpu_times()
    return (
        sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    )


class CpuThreads:
    """Follows the cores other processes leave free and sets torch's thread count to them (``adjust``,
    called from the training loop's thread between steps: a thread count is that thread's setting)."""

    def __init__(self, most: int, log: Callable[[str], None] = print) -> None:
        self.cores = psutil.cpu_count() or 1
        self.most = max(1, min(most, self.cores))
        self.log = log
        self._proc = psutil.Process()
        self._mark = self._sample()
        self._due = time.monotonic() + FIRST
        self.current: int | None = None  # the count this follower set last
        self.others = 0.0  # cores other processes kept busy in the last window

    def _sample(self) -> tuple[float, float, float]:
        own = self._proc.cpu_times()
        return time.monotonic(), _busy(), own.user + own.system

    def target(self) -> int | None:
        """Threads for the cores left free since the last look, or None when too little time has passed to
        tell (the window starts afresh after each look)."""
        now = self._sample()
        span = now[0] - self._mark[0]
        if span < 0.2:
            return None
        self.others = max(0.0, ((now[1] - self._mark[1]) - (now[2] - self._mark[2])) / span)
        self._mark = now
        free = int(self.cores - self.others + FREE_BELOW)
        return max(1, min(self.most, free))

    def adjust(self, step: int | None = None, force: bool = False) -> int | None:
        """Look at the load if it is time (or ``force``) and set torch's threads when the count changes;
        the new count, or None where nothing changed."""
        if not force and time.monotonic() < self._due:
            return None
        self._due = time.monotonic() + INTERVAL
        n = self.target()
        if n is None or n == self.current:
            return None
        import torch

        torch.set_num_threads(n)
        first = self.current is None
        self.current = n
        when = "" if step is None else f" from step {step}"
        busy = f"other processes kept {self.others:.1f} of {self.cores} cores busy"
        if not first or n != self.cores:
            self.log(f"nbtrain: {n} CPU thread{'s' if n > 1 else ''}{when}: {busy}")
        return n


def settle(window: float = 0.3, log: Callable[[str], None] = print) -> int | None:
    """For a job or a server on a CPU, as it starts: torch's threads for the cores other processes left free
    over ``window`` seconds (None, and torch's own count, where the user set ``OMP_NUM_THREADS``); the
    threads this process starts later inherit it. What llama.cpp is given too (``torch.get_num_threads``)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    t = CpuThreads(psutil.cpu_count() or 1, log)
    time.sleep(window)
    return t.adjust(force=True)


def follower(resolved: dict[str, object]) -> CpuThreads | None:
    """The follower for a run, or None where the run keeps torch's own count: not on a CPU, several ranks,
    or the user's ``OMP_NUM_THREADS``."""
    plan = resolved.get("plan")
    if not isinstance(plan, dict) or plan.get("device") != "cpu" or int(plan.get("world_size") or 1) > 1:
        return None
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    share = resolved.get("threads")
    return CpuThreads(share if isinstance(share, int) and share > 0 else psutil.cpu_count() or 1)
