"""The dashboard's charts: the panels and their trace specs, the frame of a run's metrics they draw, the
header and progress bar, the memory estimate's line, and the built figures (live or static, comparison,
``Run.plot()``)."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nbtrain.contract.rundir import TERMINAL_STATES
from nbtrain.control.memory import CUDA_CONTEXT_BYTES, NCCL_BYTES
from nbtrain.control.runs.metrics import DEFAULT_CAP, MEMORY_KEYS, FloatArray, MetricsTail
from nbtrain.ui.figures.axes import TOKENS, ThroughputAxis, loss_controls, short_number, throughput_top
from nbtrain.ui.figures.clock import Clock, clock, duration, durations, ema, remaining
from nbtrain.ui.figures.theme import (
    AXIS_LINE,
    COLORS,
    EXTRA_COLORS,
    GRID,
    INK,
    MUTED,
    RANK_COLORS,
    RUNNING_COLOR,
    STATE_COLORS,
    THEME,
)

if TYPE_CHECKING:
    from nbtrain.control.runs.run import Run, RunStatus

GIB = float(2**30)
MIB = float(2**20)


# ----------------------------------------------------------------------------------------- panels
# The fixed panels; extra metric panels (e.g. a DPO recipe's rewards/margins) follow them.
LOSS, LR, GRAD_NORM, MEMORY = "loss", "lr", "grad_norm", "memory"
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


# The Python, torch and transformers a training process imports before it loads anything: resident
# memory the estimate leaves out (it counts tensors) but a CPU run's RSS includes. Measured with
# torch 2.13 (CPU) and transformers 5.24: ~0.45 GiB; a machine's exact figure differs a little.
CPU_RUNTIME_BYTES = int(0.45 * GIB)


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
    visible: bool = True  # False: drawn once the panel's control asks for it (the smoothed loss)

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
            return {"x": clk.steps_at(t), "y": y, "customdata": durations(clk.elapsed_many(t))}
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
            "customdata": durations(clk.elapsed_many(when)) if when is not None else [""] * len(x),
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

    def mode(self, points: int) -> str:
        """A line of one point draws nothing: until a second point comes, the point is a marker."""
        return "lines+markers" if self.markers or points == 1 else "lines"

    def trace(self, frame: Frame, *, empty: bool = False) -> go.Scatter:
        """The trace of ``frame``; ``empty``: without data and hidden, for a live figure to fill in with
        its other traces' update (plotly sends each trace it adds as a message of its own)."""
        d: Trace = {"x": _EMPTY, "y": _EMPTY} if empty else self.data(frame)
        return go.Scatter(
            x=d["x"],
            y=d["y"],
            customdata=d.get("customdata") if self.timed else None,
            name=self.name,
            mode=self.mode(len(d["x"])),
            line={"color": self.color, "dash": self.dash, "width": self.width},
            marker={"size": 7, "color": self.color},
            opacity=self.opacity,
            visible=False if empty else self.visible,
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
    specs = [
        TraceSpec(("metric", "loss"), LOSS, "loss", COLORS["loss"], showlegend=has_eval),
        # shown by the loss panel's "smoothed" control (LOSS_CONTROLS), the raw line then faint behind it
        TraceSpec(
            ("smooth", "loss"), LOSS, "smoothed", COLORS["loss"], width=2.4, visible=False, timed=False
        ),
    ]
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
        updatemenus=loss_controls(fig.layout[axes[LOSS][1]].domain[1] + (LEGEND_ROW_PX + 4) / area),
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
        parts.append(remaining(p.eta))
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
    throughput_top: ThroughputAxis | None = None,
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
        axis = throughput_top
        look[axes[3][1]] = {"visible": drawn, "range": [0, axis.top], "autorange": False}
        if drawn and axis.peak > axis.top:  # the spikes drawn past the top: say how high they went
            xname, yname = axes[3]
            annotations.append(
                {
                    "name": "throughput-peak",
                    "text": f"▲ per-step spikes up to {short_number(axis.peak)} tokens/s, above the axis",
                    "xref": f"x{xname[5:]} domain",
                    "yref": f"y{yname[5:]} domain",
                    "x": 1,
                    "y": 1,
                    "xanchor": "right",
                    "yanchor": "bottom",
                    "showarrow": False,
                    "font": {"size": 10, "color": MUTED},
                }
            )
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


def apply_chrome(fig: go.Figure, look: dict[str, Any]) -> None:
    """Put a :func:`chrome` on ``fig`` (a Figure or a FigureWidget, inside its ``batch_update``)."""
    rest = dict(look)
    # assigned whole: update_layout merges lists of shapes and annotations item by item
    fig.layout.annotations = rest.pop("annotations")
    fig.layout.shapes = rest.pop("shapes")
    fig.update_layout(rest)


# ----------------------------------------------------------------------------------------- figures
def add_traces(fig: go.Figure, frame: Frame, specs: Sequence[TraceSpec], *, empty: bool = False) -> None:
    grid = panel_grid(frame.extra)
    for spec in specs:
        row, col = grid[spec.panel]
        fig.add_trace(spec.trace(frame, empty=empty), row=row, col=col)


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
