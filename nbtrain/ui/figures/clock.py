"""A run's own time, for its charts: elapsed over every attempt of a resumed run (the pause between a stop
and its resume left out), the ETA from the recent steps with outliers clipped, the wall time of each
logged step (so memory samples, which carry a wall time only, land on the step axis), and the moving
average the throughput is drawn with."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from nbtrain.contract.rundir import MAX_JSON_BYTES, RunPaths, read_json
from nbtrain.control.runs.metrics import FloatArray, MetricsTail

SMOOTHING_SPAN = 20  # logged steps in the throughput's moving average
RECENT = 100  # logged steps the ETA's speed is measured over

_RESUME_CACHE: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {}


def resume_of(paths: RunPaths) -> tuple[int, int] | None:
    """(step, attempt) of a resumed run's current attempt, from resolved.json; None for a first attempt.

    resolved.json changes only at a resume, and a live view asks several times a second: the answer is
    kept until the file changes."""
    try:
        st = os.stat(paths.resolved)
    except OSError:
        return None
    key = str(paths.resolved)
    sig = (st.st_mtime_ns, st.st_size)
    hit = _RESUME_CACHE.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    try:
        resume = read_json(paths.resolved, max_bytes=MAX_JSON_BYTES).get("resume")
    except (OSError, ValueError, AttributeError):
        resume = None
    out = None
    if isinstance(resume, dict):
        step, attempt = resume.get("step"), resume.get("attempt")
        if isinstance(step, (int, float)) and isinstance(attempt, (int, float)):
            out = (int(step), int(attempt))
    _RESUME_CACHE[key] = (sig, out)
    return out


def _mean_clipped(per_step: FloatArray, weights: FloatArray) -> float:
    # step-weighted mean of seconds per step, each interval clipped to [median/3, 3 x median]: a pause for
    # evaluation or a checkpoint moves it a little, and no single interval moves it much
    med = float(np.median(per_step))
    clipped = np.clip(per_step, med / 3, med * 3)
    return float(np.sum(clipped * weights) / np.sum(weights))


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
        r = self.recent
        if len(r) < 3:
            return None
        dt, ds = np.diff(r[:, 0]), np.diff(r[:, 1])
        ok = (ds > 0) & (dt > 0)
        for a, b in self.pauses:
            ok &= ~((r[:-1, 0] < b) & (r[1:, 0] > a))
        if ok.sum() < 4:
            return None  # a few steps say little about the rest
        return _mean_clipped(dt[ok] / ds[ok], ds[ok])


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


def remaining(seconds: float) -> str:
    """Time left in words ("18 min 10 s left"): "ETA 18:10" reads like a clock time."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s // 60 % 60:02d} min left"
    return f"{s // 60} min {s % 60:02d} s left" if s >= 60 else f"{s} s left"


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
