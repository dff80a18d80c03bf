"""Incremental, bounded reading of a run's metrics.jsonl and system.jsonl for live views.

A live view polls several times a second for hours, so each poll reads only the bytes appended since
the last one (byte offsets into the append-only files) and the history it keeps is bounded: when a
series passes ``cap`` points its older part is reduced to per-bucket minima and maxima, so a 100k-step
run stays a few thousand points per trace while its first and last points and its extremes survive.
"""

from __future__ import annotations

import math
import os
from collections import deque
from pathlib import Path
from typing import Any, Protocol, TypeGuard

import numpy as np
import numpy.typing as npt

from nbtrain.rundir import RunPaths, iter_jsonl, read_json

DEFAULT_CAP = 4000
MIN_CAP = 16
MEMORY_KEYS = ("rss", "gpu_mem_alloc", "gpu_mem_reserved", "gpu_mem_peak")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class _HasPaths(Protocol):
    @property
    def paths(self) -> RunPaths: ...


def _is_number(v: Any) -> TypeGuard[int | float]:
    # bool is an int subclass, but a flag logged by a trainer is not a curve
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_coordinate(v: Any) -> TypeGuard[int | float]:
    # json.loads accepts NaN and 1e400 (inf); a step, time or rank like that cannot place a point
    return _is_number(v) and math.isfinite(v)


def downsample_minmax(x: FloatArray, y: FloatArray, buckets: int) -> IntArray:
    """Indices (sorted) of the points to keep: the min and max of ``y`` in each of ``buckets`` equal
    ranges of ``x``, plus the first and last point.

    Buckets span equal ranges of ``x`` rather than equal counts: the part being reduced mixes points
    already reduced (sparse, long ago) with points just aged out of the recent window (dense), and
    equal counts would halve the resolution of the old part on every reduction. A bucket whose ``y`` is
    all NaN keeps NaN points, so a gap in the curve (a diverged loss) stays visible.
    """
    m = len(x)
    if m <= 2 * buckets + 2:
        return np.arange(m, dtype=np.int64)
    lo, hi = float(np.min(x)), float(np.max(x))
    if hi > lo:
        b = ((x - lo) * (buckets / (hi - lo))).astype(np.int64)
        np.minimum(b, buckets - 1, out=b)
    else:
        b = np.zeros(m, dtype=np.int64)
    nan = np.isnan(y)
    # lexsort sorts by the last key first: by bucket, then by value within a bucket
    by_min = np.lexsort((np.where(nan, np.inf, y), b))
    by_max = np.lexsort((np.where(nan, -np.inf, y), b))
    sorted_b = b[by_min]
    starts = np.flatnonzero(np.concatenate(([True], sorted_b[1:] != sorted_b[:-1])))
    ends = np.concatenate((starts[1:], [m])) - 1
    keep = np.concatenate(([0, m - 1], by_min[starts], by_max[ends]))
    return np.unique(keep).astype(np.int64)


class Series:
    """Points ``(x, y)`` of one curve, bounded to ``cap`` points.

    New points go to a Python list (appending is O(1)); when the total passes ``cap``, the points
    older than the most recent ``cap // 4`` are reduced by :func:`downsample_minmax` to at most about
    ``cap // 2``. Each reduction costs O(cap) and frees about ``cap // 4`` slots, so the amortised cost
    per appended point is constant, independent of how long the run is.
    """

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        if cap < MIN_CAP:
            raise ValueError(f"cap must be at least {MIN_CAP}, got {cap}")
        self.cap = cap
        self._x: FloatArray = np.empty(0, dtype=np.float64)
        self._y: FloatArray = np.empty(0, dtype=np.float64)
        self._px: list[float] = []
        self._py: list[float] = []
        self.version = 0  # bumped on every change, so a view can skip unchanged traces
        self.seen = 0  # points ever appended, before any reduction

    def __len__(self) -> int:
        return len(self._x) + len(self._px)

    def append(self, x: float, y: float) -> None:
        self._px.append(x)
        self._py.append(y)
        self.seen += 1
        self.version += 1
        if len(self) > self.cap:
            self._reduce()

    def _flush(self) -> None:
        if self._px:
            self._x = np.concatenate((self._x, np.asarray(self._px, dtype=np.float64)))
            self._y = np.concatenate((self._y, np.asarray(self._py, dtype=np.float64)))
            self._px.clear()
            self._py.clear()

    def _reduce(self) -> None:
        self._flush()
        recent = self.cap // 4
        old_x, old_y = self._x[:-recent], self._y[:-recent]
        keep = downsample_minmax(old_x, old_y, self.cap // 4)
        self._x = np.concatenate((old_x[keep], self._x[-recent:]))
        self._y = np.concatenate((old_y[keep], self._y[-recent:]))

    @property
    def x(self) -> FloatArray:
        self._flush()
        out = self._x.view()
        out.flags.writeable = False  # callers share our buffer; a write would corrupt the history
        return out

    @property
    def y(self) -> FloatArray:
        self._flush()
        out = self._y.view()
        out.flags.writeable = False
        return out

    def last(self) -> tuple[float, float] | None:
        if self._px:
            return self._px[-1], self._py[-1]
        if len(self._x):
            return float(self._x[-1]), float(self._y[-1])
        return None


class MetricsTail:
    """Everything a live view needs from metrics.jsonl and system.jsonl, read incrementally.

    ``poll()`` reads the bytes appended since the previous call. Metrics are kept per key against
    ``step`` (``loss``, ``eval_loss``, ``lr``, ``grad_norm``, ``tokens_per_s`` and any other numeric key
    a recipe logs, e.g. ``rewards/margins``); system samples per ``(rank, key)`` against the wall
    time ``t``. A line still being written is left for a later poll.
    """

    def __init__(
        self, source: RunPaths | _HasPaths | str | os.PathLike[str], *, cap: int = DEFAULT_CAP
    ) -> None:
        if isinstance(source, RunPaths):
            self.paths = source
        elif isinstance(source, (str, os.PathLike)):
            self.paths = RunPaths(Path(source))
        else:
            self.paths = source.paths
        if cap < MIN_CAP:
            raise ValueError(f"cap must be at least {MIN_CAP}, got {cap}")
        self.cap = cap
        self._started: float | None = None
        self._reset()

    def _reset(self) -> None:
        self.metrics: dict[str, Series] = {}
        self.system: dict[tuple[int, str], Series] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.records = 0
        self.system_records = 0
        self.last_step: float | None = None
        self.t0: float | None = None
        self.t_last: float | None = None
        self.version = 0
        self.caught_up = False  # until a poll has read to the end of both files
        self._metrics_offset = 0
        self._system_offset = 0
        # (t, step) of recent records: throughput for the ETA over a window, not since the start,
        # so that model loading and a slow first step do not skew it for the whole run
        self._progress: deque[tuple[float, float]] = deque(maxlen=50)

    # ------------------------------------------------------------------------------------- reading
    def poll(self, max_bytes: int | None = None) -> int:
        """Read what was appended since the last poll; returns the number of new records.

        With ``max_bytes`` a poll stops after about that many bytes of each file, so attaching to a
        long run can be spread over several polls; ``caught_up`` says whether this one reached the end.
        """
        if _shrunk(self.paths.metrics, self._metrics_offset) or _shrunk(
            self.paths.system, self._system_offset
        ):
            # the files were replaced (run directory recreated): what we hold describes other files
            self._reset()
        self.caught_up = True
        n = 0
        start = self._metrics_offset
        for end, rec in iter_jsonl(self.paths.metrics, start):
            self._metrics_offset = end
            self._add_metrics(rec)
            n += 1
            if max_bytes is not None and end - start >= max_bytes:
                self.caught_up = False
                break
        start = self._system_offset
        for end, rec in iter_jsonl(self.paths.system, start):
            self._system_offset = end
            self._add_system(rec)
            n += 1
            if max_bytes is not None and end - start >= max_bytes:
                self.caught_up = False
                break
        if n:
            self.version += 1
        return n

    def _see_time(self, t: Any) -> float | None:
        if not _is_coordinate(t):
            return None
        t = float(t)
        self.t0 = t if self.t0 is None else min(self.t0, t)
        self.t_last = t if self.t_last is None else max(self.t_last, t)
        return t

    def _add_metrics(self, rec: dict[str, Any]) -> None:
        step = rec.get("step")
        # a record without a step still belongs after the previous one
        x = (
            float(step)
            if _is_coordinate(step)
            else float(self.last_step if self.last_step is not None else 0)
        )
        self.records += 1
        self.last_step = x
        t = self._see_time(rec.get("t"))
        if t is not None:
            self._progress.append((t, x))
        for key, value in rec.items():
            if key in ("t", "step") or not _is_number(value):
                continue
            v = float(value)
            series = self.metrics.get(key)
            if series is None:
                series = self.metrics[key] = Series(self.cap)
                self.first[key] = v
            series.append(x, v)
            self.last[key] = v

    def _add_system(self, rec: dict[str, Any]) -> None:
        t = self._see_time(rec.get("t"))
        if t is None:
            return  # a sample without a time cannot be placed on the time axis
        rank = rec.get("rank", 0)
        rank = int(rank) if _is_coordinate(rank) else 0
        self.system_records += 1
        for key, value in rec.items():
            if key in ("t", "rank") or not _is_number(value):
                continue
            series = self.system.get((rank, key))
            if series is None:
                series = self.system[(rank, key)] = Series(self.cap)
            series.append(t, float(value))

    # --------------------------------------------------------------------------------- accessors
    @property
    def keys(self) -> list[str]:
        """Metric names seen so far, in the order they first appeared."""
        return list(self.metrics)

    @property
    def ranks(self) -> list[int]:
        return sorted({rank for rank, _ in self.system})

    def series(self, key: str) -> Series | None:
        """A metric against step, or None when the run has not logged it (yet)."""
        return self.metrics.get(key)

    def memory(self, rank: int, key: str) -> Series | None:
        """A system sample (``rss``, ``gpu_mem_alloc``, ...) of one rank against wall time."""
        return self.system.get((rank, key))

    def steps_per_second(self) -> float | None:
        """Recent training speed, from the last logged records."""
        if len(self._progress) < 2:
            return None
        (t_a, s_a), (t_b, s_b) = self._progress[0], self._progress[-1]
        if t_b <= t_a or s_b <= s_a:
            return None
        return (s_b - s_a) / (t_b - t_a)

    def started(self) -> float | None:
        """When the run was launched (launch.json), else the time of its first record."""
        if self._started is None:
            try:
                start = read_json(self.paths.launch).get("start_time")
            except (FileNotFoundError, ValueError, AttributeError):
                start = None  # not launched by nbtrain.launch (notebook_launcher) or not yet
            if _is_coordinate(start):
                self._started = float(start)
        return self._started if self._started is not None else self.t0


def _shrunk(path: Path, offset: int) -> bool:
    if offset == 0:
        return False
    try:
        return os.stat(path).st_size < offset
    except FileNotFoundError:
        return True
