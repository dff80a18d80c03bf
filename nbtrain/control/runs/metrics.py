"""The one reader of a run's metrics.jsonl and system.jsonl: every view, route and API call goes through it.

``JsonlTail`` reads one append-only JSONL file incrementally: it remembers the byte offset after the last
whole record it returned, so each read costs only the bytes appended since (a live view polls several
times a second for hours); a last line still being written is left for a later read, and a file that
shrank (the run directory was recreated) is read again from its start. ``read_records`` is a whole file
through the same reader (``Run.metrics()``), the server's metrics route resumes one from the offset its
client holds.

``MetricsTail`` is what a live view keeps on top of it: both files, with a bounded history. When a series
passes ``cap`` points its older part is reduced to per-bucket minima and maxima, so a 100k-step run stays
a few thousand points per trace while its first and last points and its extremes survive.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TypeGuard

import numpy as np
import numpy.typing as npt

from nbtrain.contract.rundir import MAX_JSON_BYTES, MAX_LINE, RunPaths, open_regular, parse_record, read_json

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


class JsonlTail:
    """One append-only JSONL file (metrics.jsonl, system.jsonl), read incrementally from ``offset`` on.

    ``offset`` is the byte offset after the last record handed out (or line skipped); ``records()`` resumes
    there, so its cost is proportional to the bytes appended since. The schema header, blank and torn
    lines are not records (:func:`nbtrain.contract.rundir.parse_record`); a last line without its newline
    is still being written and is read once it is whole. A file now shorter than ``offset``, or gone, was
    replaced: the next read starts again at 0 and sets ``restarted``.

    The file is read in chunks of at most ``CHUNK`` bytes, never a whole line at once, and opened with
    :func:`~nbtrain.contract.rundir.open_regular` (``below``: no link followed under that directory): a
    FIFO or a link is never opened, it raises ``NotRegularFile`` naming it. A line still being written is
    remembered (its bytes, up to ``max_line``), so the next read starts after what was already scanned
    instead of going over it again. A line longer than ``max_line`` is no record nbtrain writes: it is
    skipped to its newline, without holding it, and counted in ``skipped`` (``offset`` moves past what is
    skipped, so a reader made afresh from that offset does not scan it again either: a reader whose
    ``offset`` does not follow a newline drops the rest of that line as the end of one it did not see).
    """

    CHUNK = 1 << 20

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int = 0,
        *,
        max_line: int = MAX_LINE,
        below: str | os.PathLike[str] | None = None,
    ) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if max_line < 1:
            raise ValueError(f"max_line must be >= 1, got {max_line}")
        self.path = Path(path)
        self.below = Path(below) if below is not None else None
        self.offset = offset
        self.max_line = max_line
        self.restarted = False  # the last read started again at 0 because the file was replaced
        self.caught_up = False  # the last read reached the end of the file (no budget cut it short)
        self.skipped = 0  # lines longer than max_line skipped so far
        self.bytes_read = 0  # bytes read from the file so far (each byte once, however often it is polled)
        self._pending = b""  # the start of a line not yet ended, read from ``offset`` on
        self._discard = False  # the bytes up to the next newline are dropped (a line too long, or mid-line)
        self._check_start = offset > 0  # the first read looks whether ``offset`` starts a line

    def replaced(self) -> bool:
        """Whether the file no longer holds what was read up to ``offset`` (shorter, or gone)."""
        if self._scanned == 0:
            return False
        try:
            return os.lstat(self.path).st_size < self._scanned
        except FileNotFoundError:
            return True

    @property
    def _scanned(self) -> int:
        return self.offset + len(self._pending)

    def start_at_tail(self, nbytes: int) -> None:
        """Place the reader on the first whole line among the file's last ``nbytes`` bytes (what a look at
        the latest records needs, without reading a long file from its start)."""
        try:
            size = os.lstat(self.path).st_size
        except FileNotFoundError:
            size = 0
        self.offset = max(0, size - nbytes)
        self._pending, self._discard, self._check_start = b"", False, self.offset > 0

    def records(
        self, *, max_bytes: int | None = None, max_records: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The records appended since the last read, advancing ``offset`` past each one handed out.

        With ``max_bytes`` (about that many bytes) or ``max_records`` the read stops early and leaves
        ``caught_up`` False, so attaching to a long run can be spread over several reads.
        """
        self.caught_up = False
        self.restarted = self.replaced()
        if self.restarted:
            self.offset, self._pending, self._discard, self._check_start = 0, b"", False, False
        try:
            f = open_regular(self.path, below=self.below)
        except FileNotFoundError:
            self.caught_up = True
            return
        start = self._scanned
        n = 0
        with f:
            if self._check_start:
                # An offset that does not follow a newline is inside a line (one skipped as too long,
                # handed on by a reader that stopped in it, or a tail's start): the rest of it is no record.
                f.seek(self.offset - 1)
                self._discard, self._check_start = f.read(1) != b"\n", False
            while True:
                if max_bytes is not None and self._scanned - start >= max_bytes:
                    return
                f.seek(self._scanned)
                chunk = f.read(self.CHUNK)
                if not chunk:
                    self.caught_up = True
                    return
                self.bytes_read += len(chunk)
                base = self._scanned  # the file offset of chunk[0]
                i = 0
                # State stays consistent at every yield: a caller that stops iterating leaves a reader that
                # resumes after the last record it was handed.
                while (nl := chunk.find(b"\n", i)) >= 0:
                    end = base + nl + 1
                    if self._discard:
                        line = None
                    elif len(self._pending) + nl + 1 - i > self.max_line:
                        self.skipped += 1
                        line = None
                    else:
                        line = self._pending + chunk[i : nl + 1]
                    self.offset, self._pending, self._discard = end, b"", False
                    i = nl + 1
                    rec = parse_record(line) if line is not None else None
                    if rec is not None:
                        n += 1
                        yield rec
                        if (max_records is not None and n >= max_records) or (
                            max_bytes is not None and end - start >= max_bytes
                        ):
                            return
                        if self._scanned != end:  # the caller reset or moved the reader meanwhile
                            break
                else:
                    rest = chunk[i:]
                    if self._discard:
                        self.offset += len(rest)
                    elif len(self._pending) + len(rest) > self.max_line:
                        self.skipped += 1  # no record is this long: drop it up to its newline
                        self.offset += len(self._pending) + len(rest)
                        self._pending, self._discard = b"", True
                    else:
                        self._pending += rest

    def read(self, *, max_bytes: int | None = None, max_records: int | None = None) -> list[dict[str, Any]]:
        return list(self.records(max_bytes=max_bytes, max_records=max_records))


def read_records(
    path: str | os.PathLike[str], *, below: str | os.PathLike[str] | None = None
) -> list[dict[str, Any]]:
    """Every record of a metrics or system file (``Run.metrics()``): the same reader, from the start."""
    return JsonlTail(path, below=below).read()


MAX_NOTEBOOK_METRICS = 12  # the notebook's metrics a view draws a panel for (the first ones logged)


class MetricsTail:
    """Everything a live view needs from metrics.jsonl and system.jsonl, read incrementally.

    ``poll()`` reads the bytes appended since the previous call. Metrics are kept per key against
    ``step`` (``loss``, ``eval_loss``, ``lr``, ``grad_norm``, ``tokens_per_s`` and any other numeric key
    a recipe logs, e.g. ``rewards/margins``); system samples per ``(rank, key)`` against the wall
    time ``t``. A line still being written is left for a later poll. With ``rows`` the last that many
    metrics records are also kept whole, in ``recent`` (a table of the latest steps). The keys records
    list in ``notebook_metrics`` (what the run's ``hooks: compute_metrics`` returned, e.g. ``eval_exact``)
    are gathered in ``notebook_metrics``: views draw each in a panel of its own.
    """

    def __init__(
        self,
        source: RunPaths | _HasPaths | str | os.PathLike[str],
        *,
        cap: int = DEFAULT_CAP,
        rows: int = 0,
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
        self.rows = rows
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
        self.recent: deque[dict[str, Any]] = deque(maxlen=self.rows)
        # keys the records list in "notebook_metrics" (what hooks: compute_metrics returned), in order seen
        self.notebook_metrics: dict[str, None] = {}
        # below: no link is followed inside the run directory (a FIFO or a link raises NotRegularFile)
        self._metrics_file = JsonlTail(self.paths.metrics, below=self.paths.root)
        self._system_file = JsonlTail(self.paths.system, below=self.paths.root)
        # (t, step) of recent records: throughput for the ETA over a window, not since the start,
        # so that model loading and a slow first step do not skew it for the whole run
        self._progress: deque[tuple[float, float]] = deque(maxlen=50)
        # the wall time of each logged step (x = step, y = t): what puts time-stamped samples on the step
        # axis, and the time of a step in a view's hover
        self.clock = Series(self.cap)

    # ------------------------------------------------------------------------------------- reading
    def poll(self, max_bytes: int | None = None) -> int:
        """Read what was appended since the last poll; returns the number of new records.

        With ``max_bytes`` a poll stops after about that many bytes of each file, so attaching to a
        long run can be spread over several polls; ``caught_up`` says whether this one reached the end.
        """
        if self._metrics_file.replaced() or self._system_file.replaced():
            # the files were replaced (run directory recreated): what we hold describes other files
            self._reset()
        n = 0
        for rec in self._metrics_file.records(max_bytes=max_bytes):
            self._add_metrics(rec)
            n += 1
        for rec in self._system_file.records(max_bytes=max_bytes):
            self._add_system(rec)
            n += 1
        self.caught_up = self._metrics_file.caught_up and self._system_file.caught_up
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
        self.recent.append(rec)
        t = self._see_time(rec.get("t"))
        if t is not None:
            self._progress.append((t, x))
            self.clock.append(x, t)
        marked = rec.get("notebook_metrics")
        if isinstance(marked, list):
            for key in marked[:MAX_NOTEBOOK_METRICS]:
                room = len(self.notebook_metrics) < MAX_NOTEBOOK_METRICS
                if room and isinstance(key, str) and _is_number(rec.get(key)):
                    self.notebook_metrics.setdefault(key)
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
                start = read_json(self.paths.launch, max_bytes=MAX_JSON_BYTES).get("start_time")
            except (OSError, ValueError, AttributeError):
                start = None  # notebook_launcher (no launch.json), not launched yet, or unreadable
            if _is_coordinate(start):
                self._started = float(start)
        return self._started if self._started is not None else self.t0
