"""A process's start time that survives the wall clock being stepped.

psutil's ``create_time()`` is the process's start in clock ticks since boot plus the boot time, and Linux
derives the boot time from the wall clock (``btime`` = now - uptime): when the clock is stepped (NTP, a
virtual machine resumed or synced), every process's create_time moves with it. nbtrain recognises its
processes by pid and start time (a reused pid has a later start), so records keep the create_time and the
boot time it was computed with, and compare the start *since boot*, which nothing moves. Seen on this
project's machines: a run reading "lost", and a server "killed before it listened", while both ran.
"""

from __future__ import annotations

from typing import Any

import psutil

SAME_START = 0.01  # two reads of one process's start agree to well within this (jiffies)


def start_record(p: psutil.Process) -> dict[str, float]:
    """``{"create_time", "boot_time"}`` of ``p``, as records keep them."""
    return {"create_time": p.create_time(), "boot_time": psutil.boot_time()}


def since_boot(p: psutil.Process) -> float:
    """When ``p`` started, in seconds since boot (independent of the wall clock)."""
    return p.create_time() - psutil.boot_time()


def recorded_since_boot(create_time: float, boot_time: Any) -> float | None:
    """A record's start since boot; None for a record without its boot time (written before it was kept)."""
    try:
        return None if boot_time is None else float(create_time) - float(boot_time)
    except (TypeError, ValueError):
        return None


def same_start(
    p: psutil.Process, create_time: float, boot_time: Any = None, tolerance: float = SAME_START
) -> bool:
    """Whether ``p`` is the process a record names (its start matches): since boot when the record has
    its boot time, else by create_time as before."""
    recorded = recorded_since_boot(create_time, boot_time)
    if recorded is None:
        return abs(p.create_time() - float(create_time)) < tolerance
    return abs(since_boot(p) - recorded) < tolerance


def started_before(
    p: psutil.Process, create_time: float, boot_time: Any = None, margin: float = SAME_START
) -> bool:
    """Whether ``p`` started earlier than the recorded start (by more than ``margin``)."""
    recorded = recorded_since_boot(create_time, boot_time)
    if recorded is None:
        return p.create_time() < float(create_time) - margin
    return since_boot(p) < recorded - margin
