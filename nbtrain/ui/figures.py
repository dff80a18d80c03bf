"""Plotly figures of a run: the dashboard layout (static or live), run comparison, ``Run.plot()``, and the
one theme every nbtrain figure uses (``THEME``: the dashboard, preview, evaluation and estimate charts).

The live dashboard and the static figure are built from the same trace specs and the same layout, so a
notebook saved after a run shows exactly what the live view showed at the end, at the same size.

What the dashboard draws, and why:

- every panel is against the step (one x-axis, zoomed together); the time of a point is in its hover.
  Memory samples are written with a wall time only, so they are placed on the step axis through the
  wall time of each logged step (:class:`Clock`);
- time is the run's own: elapsed counts every attempt of a resumed run and leaves out the pause between
  a stop and its resume; the ETA comes from the recent steps, with outliers (an evaluation, a checkpoint)
  clipped, so it moves smoothly;
- throughput is drawn smoothed (an exponential moving average over the recent steps) over its raw
  per-step values, which are faint;
- the memory estimate is drawn as what it is comparable to: on a CPU, the process's RSS, so the line adds
  the Python / torch runtime the estimate leaves out; on a GPU, torch's allocator, so the line leaves out
  the CUDA context the allocator does not see. Its legend and hover say what it includes;
- before the first step the frame says what the run is doing ("loading model", a download's progress),
  instead of showing empty axes.
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from nbtrain.contract.rundir import MAX_JSON_BYTES, TERMINAL_STATES, RunPaths, read_json
from nbtrain.control.memory import CUDA_CONTEXT_BYTES, NCCL_BYTES
from nbtrain.control.runs.metrics import DEFAULT_CAP, MEMORY_KEYS, FloatArray, MetricsTail

if TYPE_CHECKING:
    from nbtrain.control.runs.run import Run, RunStatus

GIB = float(2**30)
MIB = float(2**20)

# ------------------------------------------------------------------------------------------- theme
THEME = "nbtrain"  # the plotly template every nbtrain figure uses (registered in plotly.io.templates)
FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
INK = "#1f2937"  # text
MUTED = "#6b7280"  # secondary text, axis titles
GRID = "#eef0f3"
AXIS_LINE = "#cfd4dc"
# One colour per metric, and none of them a rank's: a curve's colour says what it is.
COLORS = {
    "loss": "#2563eb",
    "eval_loss": "#ea580c",
    "lr": "#059669",
    "grad_norm": "#7c3aed",
    "tokens_per_s": "#0891b2",
    "estimate": "#111827",
}
RANK_COLORS = ("#db2777", "#ca8a04", "#475569", "#65a30d", "#0f766e", "#9f1239", "#a16207", "#6d28d9")
EXTRA_COLORS = ("#0369a1", "#be123c", "#4d7c0f", "#a21caf", "#b45309", "#334155")
STATE_COLORS = {"completed": "#15803d", "failed": "#b91c1c", "stopped": "#92400e"}
RUNNING_COLOR = "#1d4ed8"


def _template() -> go.layout.Template:
    base = pio.templates["plotly_white"]
    axis = {
        "gridcolor": GRID,
        "linecolor": AXIS_LINE,
        "showline": True,
        "ticks": "outside",
        "tickcolor": AXIS_LINE,
        "ticklen": 4,
        "zeroline": False,
        "automargin": True,
        "title": {"font": {"size": 11, "color": MUTED}, "standoff": 6},
        "tickfont": {"size": 11, "color": MUTED},
    }
    layout = go.Layout(base.layout)
    layout.update(
        font={"family": FONT, "size": 12, "color": INK},
        title={"font": {"size": 15, "color": INK}, "x": 0, "xref": "paper", "xanchor": "left"},
        colorway=[*COLORS.values(), *EXTRA_COLORS],
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=axis,
        yaxis=axis,
        hoverlabel={"bgcolor": "white", "bordercolor": AXIS_LINE, "font": {"family": FONT, "size": 12}},
        legend={"font": {"size": 11, "color": INK}, "bgcolor": "rgba(255,255,255,0)"},
        margin={"l": 64, "r": 24, "t": 64, "b": 48},
        bargap=0.25,
    )
    return go.layout.Template(layout=layout, data=base.data)


pio.templates[THEME] = _template()


def themed(fig: go.Figure) -> go.Figure:
    """``fig`` in nbtrain's theme (for figures built elsewhere, e.g. the evaluation report's)."""
    fig.update_layout(template=THEME)
    return fig


# ----------------------------------------------------------------------------------------- panels
# The fixed panels; extra metric panels (e.g. a DPO recipe's rewards/margins) follow them.
LOSS, LR, GRAD_NORM, TOKENS, MEMORY = "loss", "lr", "grad_norm", "tokens_per_s", "memory"
PANEL_TITLES = {
    LOSS: "loss",
    LR: "learning rate",
    GRAD_NORM: "gradient norm",
    TOKENS: "throughput",
    MEMORY: "memory per rank",
}
Y_TITLES = {LOSS: "loss", LR: "learning rate", GRAD_NORM: "L2 norm", TOKENS: "tokens/s", MEMORY: "GiB"}
LEGENDS = {LOSS: "legend", TOKENS: "legend2", MEMORY: "legend3"}  # panels with a legend of their own
MEMORY_STYLE = {  # key -> (legend label, line dash)
    "rss": ("RSS", "solid"),
    "gpu_mem_alloc": ("GPU allocated", "dot"),
    "gpu_mem_reserved": ("GPU reserved", "dash"),
    "gpu_mem_peak": ("GPU peak", "dashdot"),
}
SMOOTHING_SPAN = 20  # logged steps in the throughput's moving average
RECENT = 100  # logged steps the ETA's speed is measured over

# Sizes in pixels: the live figure and the static one use the same, so the output never jumps. The width is
# set, not left to the frontend: a FigureWidget is drawn before its output has a width (plotly's 700 px
# then) while a static figure fills its output, so an unset width changed when the view turned static.
FIGURE_WIDTH = 920
FIGURE_HEIGHT_BASE = 780  # three rows of panels
FIGURE_HEIGHT_PER_EXTRA_ROW = 230
MARGIN = {"l": 64, "r": 24, "t": 112, "b": 44}
ROW_GAP_PX = 100  # x tick labels + "step" + the next panel's title and legend line
LEGEND_ROW_PX = 20  # a panel's legend: a line between its title and its plot
TITLE_Y_PX = 12  # the header line, from the top
BAR_Y_PX = 42  # the progress bar under it
BAR_H_PX = 5
ERROR_Y_PX = 54  # an error line under the bar


# ---------------------------------------------------------------------------------------- the clock
# The Python, torch and transformers a training process imports before it loads anything: resident
# memory the estimate leaves out (it counts tensors) but a CPU run's RSS includes. Measured with
# torch 2.13 (CPU) and transformers 5.24: ~0.45 GiB; a machine's exact figure differs a little.
CPU_RUNTIME_BYTES = int(0.45 * GIB)

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


def _durations(seconds: FloatArray) -> list[str]:
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


# ------------------------------------------------------------------------------------ memory line
@dataclass(frozen=True)
class MemoryLine:
    """The memory estimate as drawn: at ``bytes``, named ``label`` in the legend, ``label_text`` on the
    line (what it adds up), and ``hover`` over that label (the estimate's parts, what to compare it with)."""

    bytes: float
    label: str
    hover: str
    label_text: str = ""


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 or n == 0 else f"{n / MIB:.0f} MiB"


def memory_line(estimate: Any) -> MemoryLine | None:
    """The line to draw for the estimate recorded in resolved.json, comparable with what is measured.

    A CPU run measures each process's RSS, which holds the Python / torch runtime beside the tensors: the
    line is the estimate plus ``CPU_RUNTIME_BYTES``. A GPU run measures torch's allocator, which does not
    see the CUDA context (nor NCCL's buffers) the estimate counts: the line leaves them out. A bare
    number is drawn as it is."""
    if isinstance(estimate, (int, float)) and not isinstance(estimate, bool):
        text = f"estimate {_gib(estimate)}"
        return MemoryLine(float(estimate), "estimate", text, text)
    if not isinstance(estimate, dict):
        return None
    total = _estimate_total(estimate)
    if total is None:
        return None
    raw_inputs, raw_parts = estimate.get("inputs"), estimate.get("parts")
    inputs: dict[str, Any] = raw_inputs if isinstance(raw_inputs, dict) else {}
    parts: dict[str, Any] = raw_parts if isinstance(raw_parts, dict) else {}
    device = inputs.get("device") or estimate.get("device")
    shown = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items() if isinstance(v, (int, float)) and v)
    what = f"estimate {_gib(total)}" + (f" ({shown})" if shown else "")
    if device == "cpu":
        line = total + CPU_RUNTIME_BYTES
        return MemoryLine(
            line,
            "estimate + runtime",
            f"{what}<br>+ {_gib(CPU_RUNTIME_BYTES)} Python / torch runtime (in RSS, not in the estimate)"
            f"<br>= {_gib(line)}: compare with RSS",
            f"estimate {_gib(total)} + runtime {_gib(CPU_RUNTIME_BYTES)} = {_gib(line)}",
        )
    if device == "cuda":
        left_out = CUDA_CONTEXT_BYTES + (NCCL_BYTES if int(inputs.get("world_size") or 1) > 1 else 0)
        line = max(0.0, total - left_out)
        return MemoryLine(
            line,
            "estimate (allocator)",
            f"{what}<br>− {_gib(left_out)} CUDA context"
            + (" and NCCL buffers" if left_out > CUDA_CONTEXT_BYTES else "")
            + f" (torch's allocator does not see them)<br>= {_gib(line)}: compare with GPU reserved",
            f"estimate {_gib(total)} − CUDA context {_gib(left_out)} = {_gib(line)}",
        )
    return MemoryLine(total, "estimate", what, f"estimate {_gib(total)}")


def _estimate_total(estimate: dict[str, Any]) -> float | None:
    for k in ("per_device_bytes", "peak_bytes", "total_bytes", "bytes"):
        v = estimate.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


# ------------------------------------------------------------------------------------------ frames
@dataclass
class Frame:
    """What one drawing of a run is made from: the tail read so far, its clock, the estimate line."""

    tail: MetricsTail
    clock: Clock
    estimate: MemoryLine | None = None
    extra: tuple[str, ...] = ()  # metric keys in panels of their own: the view's, then the notebook's
    notebook: tuple[str, ...] = ()  # of those, what the run's hooks: compute_metrics returned

    @property
    def x_end(self) -> float:
        """The last step drawn (at least 1)."""
        last = self.tail.last_step or 0.0
        return float(max(1.0, last, self.clock.s[-1] if len(self.clock.s) else 0.0))


def panels_of(tail: MetricsTail, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The metric keys drawn in panels of their own: ``extra`` (the view's), then each metric of the run's
    ``hooks: compute_metrics`` (the records mark them, ``MetricsTail.notebook_metrics``) as it appears."""
    return tuple(dict.fromkeys([*extra, *tail.notebook_metrics]))


def make_frame(
    tail: MetricsTail, estimate: MemoryLine | float | None = None, extra: Sequence[str] = ()
) -> Frame:
    if isinstance(estimate, (int, float)):
        estimate = memory_line(float(estimate))
    return Frame(tail, clock(tail), estimate, panels_of(tail, extra), tuple(tail.notebook_metrics))


Trace = dict[str, Any]


@dataclass(frozen=True)
class TraceSpec:
    """One trace of the dashboard: where its data comes from and where it is drawn."""

    key: tuple[str, ...]  # ("metric", name), ("smooth", name), ("memory", rank, name), ("estimate",)
    panel: str
    name: str
    color: str
    dash: str = "solid"
    width: float = 1.8
    opacity: float = 1.0
    markers: bool = False
    showlegend: bool = False
    legendgroup: str | None = None
    unit: str = ""
    fmt: str = ".4~g"
    timed: bool = True  # the hover says when (the first trace of a panel; the others are read beside it)

    def data(self, frame: Frame) -> Trace:
        """x, y and the hover's time of each point, as drawn (memory in GiB, placed on the step axis)."""
        tail, clk = frame.tail, frame.clock
        kind = self.key[0]
        if kind == "estimate":
            if frame.estimate is None or not tail.records:  # nothing to compare with before the first step
                return {"x": _EMPTY, "y": _EMPTY}
            level = frame.estimate.bytes / GIB
            return {"x": np.array([0.0, frame.x_end]), "y": np.array([level, level])}
        if kind == "memory":
            s = tail.memory(int(self.key[1]), self.key[2])
            if s is None:
                return {"x": _EMPTY, "y": _EMPTY, "customdata": []}
            t, y = np.asarray(s.x), np.asarray(s.y) / GIB
            if clk.set_aside is not None:
                a, b = clk.set_aside
                keep = (t <= a) | (t >= b)
                t, y = t[keep], y[keep]
            return {"x": clk.steps_at(t), "y": y, "customdata": _durations(clk.elapsed_many(t))}
        s = tail.series(self.key[1])
        if s is None:
            return {"x": _EMPTY, "y": _EMPTY, "customdata": []}
        x, y = np.asarray(s.x), np.asarray(s.y)
        if kind == "smooth":
            y = ema(y)
        if not self.timed:
            return {"x": x, "y": y}
        # the time of each step: the clock's knots are (t, step), so t is interpolated over the step
        when = np.interp(x, clk.s, clk.t) if len(clk.t) else None
        return {
            "x": x,
            "y": y,
            "customdata": _durations(clk.elapsed_many(when)) if when is not None else [""] * len(x),
        }

    def version(self, frame: Frame) -> tuple[Any, ...]:
        """Changes exactly when :meth:`data` would return something different."""
        tail, clk = frame.tail, frame.clock
        kind = self.key[0]
        if kind == "estimate":
            return (frame.estimate, frame.x_end, bool(tail.records))
        s = tail.memory(int(self.key[1]), self.key[2]) if kind == "memory" else tail.series(self.key[1])
        return ((s.version if s else -1), tail.clock.version, clk.start, clk.pauses, clk.set_aside)

    def hovertemplate(self) -> str:
        value = f"%{{y:{self.fmt}}}{(' ' + self.unit) if self.unit else ''}"
        when = f"<span style='color:{MUTED}'> · %{{customdata}}</span>" if self.timed else ""
        return f"{html.escape(self.name)} <b>{value}</b>{when}<extra></extra>"

    def trace(self, frame: Frame) -> go.Scatter:
        d = self.data(frame)
        return go.Scatter(
            x=d["x"],
            y=d["y"],
            customdata=d.get("customdata") if self.timed else None,
            name=self.name,
            mode="lines+markers" if self.markers else "lines",
            line={"color": self.color, "dash": self.dash, "width": self.width},
            marker={"size": 7, "color": self.color} if self.markers else None,
            opacity=self.opacity,
            showlegend=self.showlegend,
            legend=LEGENDS.get(self.panel, "legend"),
            legendgroup=self.legendgroup,
            hovertemplate=self.hovertemplate(),
            meta=list(self.key),  # lets tests and tools find a trace by key, not by position
        )


_EMPTY: FloatArray = np.empty(0, dtype=np.float64)


def _extra_panels(extra: Sequence[str]) -> list[str]:
    # a key that already has a trace (or names a panel) would get a second trace with the same key
    taken = {LOSS, "eval_loss", LR, GRAD_NORM, TOKENS, MEMORY}
    return [k for k in dict.fromkeys(extra) if k not in taken]


def trace_specs(frame: Frame) -> list[TraceSpec]:
    """The traces to draw for what the tail has seen so far.

    The core metric traces are always present (empty until logged) so a live figure keeps its panels
    from the start; eval_loss and memory traces appear once their data does.
    """
    tail = frame.tail
    has_eval = tail.series("eval_loss") is not None
    specs = [TraceSpec(("metric", "loss"), LOSS, "loss", COLORS["loss"], showlegend=has_eval)]
    if has_eval:
        specs.append(
            TraceSpec(
                ("metric", "eval_loss"),
                LOSS,
                "eval loss",
                COLORS["eval_loss"],
                markers=True,
                showlegend=True,
                timed=False,
            )
        )
    specs += [
        TraceSpec(("metric", "lr"), LR, "lr", COLORS["lr"], fmt=".3~g"),
        TraceSpec(("metric", "grad_norm"), GRAD_NORM, "grad norm", COLORS["grad_norm"]),
        TraceSpec(
            ("metric", "tokens_per_s"),
            TOKENS,
            "per step",
            COLORS["tokens_per_s"],
            width=1,
            opacity=0.35,
            showlegend=True,
            unit="tokens/s",
            fmt=",.0f",
        ),
        TraceSpec(
            ("smooth", "tokens_per_s"),
            TOKENS,
            "smoothed",
            COLORS["tokens_per_s"],
            width=2.4,
            showlegend=True,
            unit="tokens/s",
            fmt=",.0f",
            timed=False,
        ),
    ]
    if frame.estimate is not None:
        specs.append(
            TraceSpec(
                ("estimate",),
                MEMORY,
                frame.estimate.label,
                COLORS["estimate"],
                dash="dash",
                width=1.5,
                showlegend=True,
                unit="GiB",
                fmt=".2f",
                timed=False,
            )
        )
    many = len(tail.ranks) > 1
    for rank in tail.ranks:
        for key in MEMORY_KEYS:
            if tail.memory(rank, key) is not None:
                label, dash = MEMORY_STYLE[key]
                specs.append(
                    TraceSpec(
                        ("memory", str(rank), key),
                        MEMORY,
                        f"rank {rank} {label}" if many else label,
                        RANK_COLORS[rank % len(RANK_COLORS)],
                        dash=dash,
                        legendgroup=f"rank{rank}",
                        showlegend=True,
                        unit="GiB",
                        fmt=".2f",
                    )
                )
    specs += [
        # a notebook metric is measured at evaluations: points, like eval loss
        TraceSpec(("metric", k), k, k, EXTRA_COLORS[i % len(EXTRA_COLORS)], markers=k in frame.notebook)
        for i, k in enumerate(_extra_panels(frame.extra))
    ]
    return specs


def panel_grid(extra: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
    """(row, col) of each panel: loss across the top, the rest two per row."""
    grid = {LOSS: (1, 1)}
    for i, panel in enumerate([LR, GRAD_NORM, TOKENS, MEMORY, *_extra_panels(extra)]):
        grid[panel] = (2 + i // 2, 1 + i % 2)
    return grid


def figure_height(extra: Sequence[str] = ()) -> int:
    rows = max(r for r, _ in panel_grid(extra).values())
    return FIGURE_HEIGHT_BASE + FIGURE_HEIGHT_PER_EXTRA_ROW * (rows - 3)


def _axis_names(fig: go.Figure) -> list[tuple[str, str]]:
    """(x axis name, y axis name) of each panel, as layout properties ("xaxis", "xaxis2", ...), in the
    order of its axes (the panels' order)."""
    xs = sorted((k for k in fig.layout if k.startswith("xaxis")), key=lambda k: int(k[5:] or 1))
    return [(x, "y" + x[1:]) for x in xs]


def empty_figure(extra: Sequence[str] = ()) -> go.Figure:
    """The dashboard's panels with titled axes and legends but no traces."""
    grid = panel_grid(extra)
    rows = max(r for r, _ in grid.values())
    height = figure_height(extra)
    area = height - MARGIN["t"] - MARGIN["b"]
    specs: list[list[dict[str, Any] | None]] = [[{"colspan": 2}, None]]
    taken = set(grid.values())
    specs += [[{} if (r, c) in taken else None for c in (1, 2)] for r in range(2, rows + 1)]
    ordered = sorted(grid, key=lambda p: grid[p])
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=[PANEL_TITLES.get(p, p) for p in ordered],
        vertical_spacing=ROW_GAP_PX / area,
        horizontal_spacing=0.09,
        row_heights=[1.3] + [1.0] * (rows - 1),
    )
    axes = dict(zip(ordered, _axis_names(fig), strict=True))
    for panel, (xname, yname) in axes.items():
        x = fig.layout[xname]
        x.update(title_text="step", matches=None if xname == "xaxis" else "x", rangemode="tozero")
        x.unifiedhovertitle.text = "step %{x:,.0f}"
        fig.layout[yname].update(title_text=Y_TITLES.get(panel, panel))
        if panel in (LR, GRAD_NORM, TOKENS, MEMORY):
            fig.layout[yname].rangemode = "tozero"
        fig.layout[yname].nticks = 6
        if panel == LR:
            fig.layout[yname].exponentformat = "e"
        if panel == TOKENS:
            fig.layout[yname].tickformat = "~s"
    # panel titles: left-aligned above each panel, in the text colour (plotly centres them, larger)
    for ann, panel in zip(fig.layout.annotations, ordered, strict=True):
        xname, _ = axes[panel]
        left = fig.layout[xname].domain[0]
        ann.update(x=left, xanchor="left", yanchor="bottom", yshift=LEGEND_ROW_PX + 2, name=f"panel:{panel}",
                   font={"size": 13, "color": INK})  # fmt: skip
        ann.text = f"<b>{html.escape(PANEL_TITLES.get(panel, panel))}</b>"
    # each panel's legend on a line of its own under its title, above the plot: it never covers a curve
    legends: dict[str, Any] = {}
    for panel, legend in LEGENDS.items():
        xname, yname = axes[panel]
        legends[legend] = {
            "orientation": "h",
            "x": fig.layout[xname].domain[0],
            "xanchor": "left",
            "y": fig.layout[yname].domain[1] + 1 / area,
            "yanchor": "bottom",
            "yref": "paper",
            "font": {"size": 11, "color": MUTED},
            "itemwidth": 30,
            "tracegroupgap": 0,
        }
    fig.update_layout(
        template=THEME,
        width=FIGURE_WIDTH,
        height=height,
        margin=MARGIN,
        hovermode="x unified",
        # keeps the user's zoom and hidden traces while a live figure updates
        uirevision="nbtrain",
        **legends,
    )
    return fig


# ---------------------------------------------------------------------------------------- header
def fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5):
        return f"{v:.3g}"
    return f"{v:.4f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Progress:
    """What a header says about a run: derived from the tail and status.json."""

    state: str
    step: int
    max_steps: int | None
    elapsed: float | None
    eta: float | None
    loss: float | None
    eval_loss: float | None
    error: dict[str, Any] | None
    phase: str | None = None  # while starting: "downloading model org/x 3.1 / 15.2 GB, 40 MB/s", ...
    records: int = 0  # logged steps read so far

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def fraction(self) -> float:
        if not self.max_steps:
            return 1.0 if self.state == "completed" else 0.0
        return min(1.0, max(0.0, self.step / self.max_steps))

    def waiting(self) -> str | None:
        """What the frame says while there is no step to draw yet (None once there is)."""
        if self.records:
            return None
        if self.error:
            return f"failed before the first step: {self.error.get('type', 'error')}"
        if self.state == "completed":
            return "completed without a logged step"
        if self.state == "stopped":
            return "stopped before the first step"
        if self.phase:
            return self.phase
        return {
            "queued": "queued: waiting to start",
            "starting": "starting the training process",
            "running": "training: waiting for the first logged step",
            "stopping": "stopping",
        }.get(self.state, self.state)


def progress(
    tail: MetricsTail, status: RunStatus, now: float | None = None, clk: Clock | None = None
) -> Progress:
    now = time.time() if now is None else now
    step = max(status.step, int(tail.last_step or 0))
    clk = clock(tail) if clk is None else clk
    elapsed = None
    if clk.start is not None:
        # a finished run's elapsed time stops at its last status write, not at "now"
        end = status.updated if status.done and status.updated else now
        elapsed = clk.elapsed(end)
    eta = None
    spp = clk.seconds_per_step()
    if not status.done and status.max_steps and spp:
        eta = max(0, status.max_steps - step) * spp
    return Progress(
        state=status.state,
        step=step,
        max_steps=status.max_steps,
        elapsed=elapsed,
        eta=eta,
        loss=tail.last.get("loss"),
        eval_loss=tail.last.get("eval_loss"),
        error=status.error,
        phase=status.phase_text(),
        records=tail.records,
    )


def header_parts(p: Progress) -> list[str]:
    if p.phase is not None:
        return [p.state, p.phase]
    parts = [p.state, f"step {p.step:,}/{p.max_steps:,}" if p.max_steps else f"step {p.step:,}"]
    if p.elapsed is not None:
        parts.append(f"elapsed {duration(p.elapsed)}")
    if p.eta is not None:
        parts.append(f"ETA {duration(p.eta)}")
    if p.loss is not None:
        parts.append(f"loss {fmt(p.loss)}")
    if p.eval_loss is not None:
        parts.append(f"eval loss {fmt(p.eval_loss)}")
    return parts


def header_text(p: Progress, name: str | None = None) -> str:
    text = " · ".join(([name] if name else []) + header_parts(p))
    if p.error:
        text += f" — {p.error.get('type', 'error')}: {p.error.get('message', '')}"
    return text


def state_color(state: str) -> str:
    return STATE_COLORS.get(state, RUNNING_COLOR)


def header_title(p: Progress, name: str | None = None) -> str:
    """The figure title: plotly titles take a subset of HTML, so everything user-written is escaped."""
    parts = header_parts(p)
    head = f"<span style='color:{state_color(p.state)}'><b>{html.escape(parts[0])}</b></span>"
    rest = [f"<span style='color:{MUTED}'>·</span> {html.escape(s)}" for s in parts[1:]]
    head = " ".join([head, *rest])
    if name:
        head = f"<b>{html.escape(name)}</b>  {head}"
    return head


def error_line(p: Progress) -> str:
    if not p.error:
        return ""
    msg = str(p.error.get("message", ""))
    msg = msg if len(msg) <= 140 else msg[:137] + "..."
    return f"{html.escape(str(p.error.get('type', 'error')))}: {html.escape(msg)}"


def _rect(x1: float, y0: float, y1: float, color: str, name: str) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "paper",
        "yref": "paper",
        "x0": 0,
        "x1": x1,
        "y0": y0,
        "y1": y1,
        "fillcolor": color,
        "line": {"width": 0},
        "layer": "above",
        "name": name,
    }


def _note(name: str, text: str, x: float, y: float, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "text": text,
        "x": x,
        "y": y,
        "xref": "paper",
        "yref": "paper",
        "showarrow": False,
        **kw,
    }


def _log_lines(p: Progress, n: int = 8, width: int = 110) -> list[str]:
    tail = str((p.error or {}).get("log_tail") or "").rstrip().splitlines()[-n:]
    return [line if len(line) <= width else line[: width - 1] + "…" for line in tail]


def chrome(
    fig: go.Figure,
    p: Progress,
    name: str | None = None,
    *,
    estimate: MemoryLine | None = None,
    throughput_top: float | None = None,
    title: bool = True,
) -> dict[str, Any]:
    """The layout that follows the run's progress: the title, the progress bar under it, an error line,
    the estimate's label, the throughput axis's top (``throughput_top``, see :func:`throughput_top`), and,
    before the first step, the frame's message in place of empty axes.

    Plain values (so a live view can tell whether anything changed by comparing two of these); apply one
    with :func:`apply_chrome`."""
    height = fig.layout.height or FIGURE_HEIGHT_BASE
    area = height - MARGIN["t"] - MARGIN["b"]

    def paper_y(px_from_top: float) -> float:
        return 1 + (MARGIN["t"] - px_from_top) / area

    bar_top, bar_bottom = paper_y(BAR_Y_PX), paper_y(BAR_Y_PX + BAR_H_PX)
    shapes = [
        _rect(1, bar_bottom, bar_top, GRID, "progress-bg"),
        _rect(p.fraction, bar_bottom, bar_top, state_color(p.state), "progress"),
    ]
    waiting = p.waiting()
    drawn = waiting is None
    annotations: list[dict[str, Any]] = [
        {**a.to_plotly_json(), "visible": drawn}
        for a in fig.layout.annotations
        if str(a.name or "").startswith("panel:")
    ]
    axes = _axis_names(fig)
    if estimate is not None and drawn:
        # the line's label, under the line at the panel's left edge: what it adds up
        xname, yname = axes[4]  # the memory panel
        annotations.append(
            {
                "name": "estimate",
                "text": html.escape(estimate.label_text),
                "xref": f"x{xname[5:]} domain",
                "yref": f"y{yname[5:]}",
                "x": 0.01,
                "y": estimate.bytes / GIB,
                "xanchor": "left",
                "yanchor": "top",
                "showarrow": False,
                "font": {"size": 10, "color": MUTED},
                "bgcolor": "rgba(255,255,255,0.75)",
                "hovertext": estimate.hover,  # its parts, and what it is to be compared with
            }
        )
    err = error_line(p)
    if err:
        annotations.append(
            _note(
                "error",
                err,
                0,
                paper_y(ERROR_Y_PX),
                xanchor="left",
                yanchor="top",
                font={"size": 12, "color": STATE_COLORS["failed"]},
            )
        )
    if waiting is not None:
        text = f"<b>{html.escape(waiting)}</b>"
        if not p.done:
            sub = "the charts start with the first logged step"
            text += f"<br><span style='color:{MUTED};font-size:12px'>{sub}</span>"
        color = STATE_COLORS["failed"] if p.error else INK
        annotations.append(_note("phase", text, 0.5, 0.6, font={"size": 16, "color": color}))
        lines = _log_lines(p)
        if lines:
            log = "<br>".join(html.escape(line) for line in lines)
            annotations.append(
                _note(
                    "log",
                    f"<span style='color:{MUTED}'>last lines of the log</span><br>{log}",
                    0.5,
                    0.55,
                    yanchor="top",
                    align="left",
                    bgcolor="#f8fafc",
                    bordercolor=AXIS_LINE,
                    borderpad=8,
                    font={
                        "family": "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
                        "size": 11,
                        "color": INK,
                    },
                )
            )
    look: dict[str, Any] = {"shapes": shapes, "annotations": annotations, "showlegend": drawn}
    for xname, yname in axes:
        look[xname] = {"visible": drawn}
        look[yname] = {"visible": drawn}
    if throughput_top is not None:
        look[axes[3][1]] = {"visible": drawn, "range": [0, throughput_top], "autorange": False}
    if title:
        look["title"] = {
            "text": header_title(p, name),
            "x": 0,
            "xref": "paper",
            "y": 1 - TITLE_Y_PX / height,
            "yref": "container",
            "yanchor": "top",
        }
    return look


def throughput_top(tail: MetricsTail) -> float | None:
    """The top of the throughput axis: the smoothed curve and most per-step values fit, a rare spike of
    the faint raw line goes past it (drawn to it, it would flatten the curve people read)."""
    s = tail.series(TOKENS)
    if s is None or not len(s):
        return None
    raw = np.asarray(s.y)
    raw = raw[np.isfinite(raw)]
    if not len(raw):
        return None
    top = max(float(np.percentile(raw, 95)), float(np.nanmax(ema(raw))))
    return 1.15 * top if top > 0 else None


def apply_chrome(fig: go.Figure, look: dict[str, Any]) -> None:
    """Put a :func:`chrome` on ``fig`` (a Figure or a FigureWidget, inside its ``batch_update``)."""
    rest = dict(look)
    # assigned whole: update_layout merges lists of shapes and annotations item by item
    fig.layout.annotations = rest.pop("annotations")
    fig.layout.shapes = rest.pop("shapes")
    fig.update_layout(rest)


# ----------------------------------------------------------------------------------------- figures
def add_traces(fig: go.Figure, frame: Frame, specs: Sequence[TraceSpec]) -> None:
    grid = panel_grid(frame.extra)
    for spec in specs:
        row, col = grid[spec.panel]
        fig.add_trace(spec.trace(frame), row=row, col=col)


def build_figure(
    tail: MetricsTail,
    status: RunStatus,
    *,
    estimate_bytes: float | None = None,
    estimate: MemoryLine | None = None,
    name: str | None = None,
    extra: Sequence[str] = (),
    title: bool = True,
    now: float | None = None,
) -> go.Figure:
    """A static figure of what ``tail`` holds: loss and eval loss, learning rate, gradient norm,
    throughput and memory per rank, all against the step, with the memory estimate as a line
    (``estimate``, or a bare ``estimate_bytes``), and any ``extra`` metric keys and the metrics of the run's
    ``hooks: compute_metrics`` in panels of their own.
    The title carries state, progress, elapsed time, ETA and last loss, a bar under it the progress."""
    frame = make_frame(tail, estimate if estimate is not None else estimate_bytes, extra)
    fig = empty_figure(frame.extra)
    add_traces(fig, frame, trace_specs(frame))
    p = progress(tail, status, now, frame.clock)
    look = chrome(fig, p, name, estimate=frame.estimate, throughput_top=throughput_top(tail), title=title)
    apply_chrome(fig, look)
    return fig


def _label(run: Run) -> str:
    return run.id if run.name in (run.id, "") else f"{run.name} ({run.id})"


def compare_figure(
    runs: Sequence[Run], *, key: str = "loss", eval_key: str | None = "eval_loss", cap: int = DEFAULT_CAP
) -> go.Figure:
    """The ``key`` curves of several runs on one chart (eval curves dashed in the same colour)."""
    fig = go.Figure()
    palette = (*EXTRA_COLORS, *RANK_COLORS)
    for i, run in enumerate(runs):
        tail = MetricsTail(run, cap=cap)
        tail.poll()
        color = palette[i % len(palette)]
        label = _label(run)
        for k, dash in ((key, "solid"), (eval_key, "dash")):
            s = tail.series(k) if k else None
            if s is None or k is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=s.x,
                    y=s.y,
                    name=label if k == key else f"{label} {k}",
                    mode="lines" if k == key else "lines+markers",
                    line={"color": color, "dash": dash, "width": 1.8},
                    legendgroup=run.id,
                    meta=[run.id, k],
                )
            )
    fig.update_layout(
        template=THEME,
        title={"text": f"<b>{html.escape(key)}</b> of {len(runs)} run{'s' if len(runs) != 1 else ''}"},
        xaxis_title="step",
        yaxis_title=key,
        hovermode="x unified",
        height=450,
    )
    fig.update_xaxes(unifiedhovertitle_text="step %{x:,.0f}")
    return fig


def run_plot(run: Run, *, estimate_bytes: float | None = None, extra: Sequence[str] = ()) -> go.Figure:
    """The whole run as a static figure (``Run.plot()``)."""
    tail = MetricsTail(run)
    tail.poll()
    line = (
        memory_line(estimate_bytes)
        if estimate_bytes is not None
        else memory_line(run.resolved.get("estimate"))
    )
    return build_figure(tail, run.status(), estimate=line, name=run.name, extra=extra)
