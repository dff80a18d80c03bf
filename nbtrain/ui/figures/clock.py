"""A run's own time, for its charts: elapsed over every attempt of a resumed run (the pause between a stop
and its resume left out), the speed of the recent logged steps (the time left is ``control/runs/eta``'s),
the wall time of each logged step (so memory samples, which carry a wall time only, land on the step
axis), and the moving average the throughput is drawn with."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbtrain.contract.rundir import MAX_JSON_BYTES, RunPaths, read_json
from nbtrain.control.runs.eta import RECENT, logged_seconds_per_step, loss_every
from nbtrain.control.runs.metrics import FloatArray, MetricsTail

SMOOTHING_SPAN = 20  # logged steps in the throughput's moving average

# per resolved.json: its (mtime, size), the resume's (step, attempt) and the train args' loss_every input
_RESOLVED_CACHE: dict[str, tuple[tuple[int, int], tuple[int, int] | None, dict[str, Any]]] = {}
_LOGGING_KEYS = ("logging_strategy", "logging_first_step", "logging_steps")


def _resolved(paths: RunPaths) -> tuple[tuple[int, int] | None, dict[str, Any]]:
    """What a live view needs of resolved.json: the resume's (step, attempt) and the logging train args.

    resolved.json changes only at a resume, and a live view asks several times a second: the answer is
    kept until the file changes."""
    try:
        st = os.stat(paths.resolved)
    except OSError:
        return None, {}
    key = str(paths.resolved)
    sig = (st.st_mtime_ns, st.st_size)
    hit = _RESOLVED_CACHE.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1], hit[2]
    try:
        data = read_json(paths.resolved, max_bytes=MAX_JSON_BYTES)
        resume, args = data.get("resume"), data.get("train_args")
    except (OSError, ValueError, AttributeError):
        resume = args = None
    out = None
    if isinstance(resume, dict):
        step, attempt = resume.get("step"), resume.get("attempt")
        if isinstance(step, (int, float)) and isinstance(attempt, (int, float)):
            out = (int(step), int(attempt))
    logging = {k: args[k] for k in _LOGGING_KEYS if k in args} if isinstance(args, dict) else {}
    _RESOLVED_CACHE[key] = (sig, out, logging)
    return out, logging


def resume_of(paths: RunPaths) -> tuple[int, int] | None:
    """(step, attempt) of a resumed run's current attempt, from resolved.json; None for a first attempt."""
    return _resolved(paths)[0]


def loss_every_of(paths: RunPaths, max_steps: int | None) -> int | None:
    """Every how many steps the run logs a loss (resolved.json's train args, ``eta.loss_every``)."""
    return loss_every(_resolved(paths)[1], max_steps)


@dataclass(frozen=True)
class Clock:
    """The run's own time: when each logged step happened, and the pauses between attempts.

    ``t`` / ``s``: the wall time and step of each logged step (ascending), with the start of the run (and
    of the current attempt, at the step it resumed from) as extra knots. ``pauses``: wall-time intervals
    between one attempt's last record and the next attempt's launch, not counted as elapsed. ``set_aside``:
    the interval whose samples belong to the part of an attempt that its resume set aside."""

    start: float | None
    t: FloatArray
    s: FloatArray
    pauses: tuple[tuple[float, float], ...] = ()
    set_aside: tuple[float, float] | None = None
    recent: FloatArray = field(default_factory=lambda: np.empty((0, 2)))  # (t, step) of the last records

    def elapsed(self, t: float) -> float:
        if self.start is None:
            return 0.0
        paused = sum(max(0.0, min(t, b) - max(self.start, a)) for a, b in self.pauses)
        return max(0.0, t - self.start - paused)

    def elapsed_many(self, t: FloatArray) -> FloatArray:
        if self.start is None:
            return np.zeros(len(t))
        out = t - self.start
        for a, b in self.pauses:
            out = out - np.clip(np.minimum(t, b) - max(self.start, a), 0.0, None)
        return np.asarray(np.maximum(out, 0.0), dtype=np.float64)

    def steps_at(self, t: FloatArray) -> FloatArray:
        """Where wall times fall on the step axis (between the steps logged before and after them)."""
        if len(self.t) == 0:
            return np.zeros(len(t))
        return np.asarray(np.interp(t, self.t, self.s), dtype=np.float64)

    def seconds_per_step(self) -> float | None:
        """Recent seconds per step: over the last ``RECENT`` records, outliers clipped, pauses left out."""
        return logged_seconds_per_step(self.recent, self.pauses)


def clock(tail: MetricsTail) -> Clock:
    """The :class:`Clock` of what ``tail`` has read (launch.json and resolved.json: where attempts start)."""
    t = np.asarray(tail.clock.y, dtype=np.float64)
    s = np.asarray(tail.clock.x, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t, s = t[order], (np.maximum.accumulate(s[order]) if len(s) else s)
    recent = np.column_stack([t[-RECENT - 1 :], s[-RECENT - 1 :]]) if len(t) else np.empty((0, 2))
    launch = tail.started()  # the current attempt's launch (or the first record without launch.json)
    resumed = resume_of(tail.paths)
    samples = [series.x for series in tail.system.values()]
    points = np.sort(np.concatenate([t, *samples])) if len(t) or samples else np.empty(0)
    pauses: list[tuple[float, float]] = []
    set_aside = None
    start = launch
    if resumed is not None and launch is not None:
        step, attempt = resumed
        before = points[points < launch]
        if len(before):
            pauses.append((float(before[-1]), launch))
            # earlier resumes left no launch time: their pauses are the longest silences before this one
            if attempt > 2 and len(before) > 1:
                gaps = np.diff(before)
                for i in np.argsort(gaps)[::-1][: attempt - 2]:
                    pauses.append((float(before[i]), float(before[i + 1])))
            start = float(before[0])  # the first attempt's launch time is gone: its first record
        kept = t[(t < launch) & (s <= step)]
        if len(kept):
            set_aside = (float(kept[-1]), launch)
        # the current attempt starts at the step it resumed from
        i = int(np.searchsorted(t, launch))
        t, s = np.insert(t, i, launch), np.insert(s, i, float(step))
    elif start is not None and (len(t) == 0 or start < t[0]):
        t, s = np.insert(t, 0, start), np.insert(s, 0, 0.0)
    if start is not None and len(points) and points[0] < start:
        start = float(points[0])
    return Clock(start, t, s, tuple(sorted(pauses)), set_aside, recent)


def duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def durations(seconds: FloatArray) -> list[str]:
    return [duration(v) + " elapsed" for v in seconds.tolist()]


def ema(y: FloatArray, span: int = SMOOTHING_SPAN) -> FloatArray:
    """Exponential moving average over the points (bias-corrected from the first one, as TensorBoard's
    smoothing); NaN points are skipped (they keep the previous average)."""
    alpha = 2.0 / (span + 1.0)
    out = np.empty(len(y), dtype=np.float64)
    acc = weight = 0.0
    last = math.nan
    for i, v in enumerate(y.tolist()):
        if not math.isnan(v):
            acc = (1 - alpha) * acc + alpha * v
            weight = (1 - alpha) * weight + alpha
            last = acc / weight
        out[i] = last
    return out
