"""The dashboard's panels: which metric each draws and where, the frame of a run's metrics they are drawn
from, the trace specs (where each trace's data comes from and how it looks), and the empty figure of
titled axes and legends the traces go into."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nbtrain.control.runs.metrics import MEMORY_KEYS, FloatArray, MetricsTail
from nbtrain.ui.figures.axes import TOKENS, loss_controls
from nbtrain.ui.figures.clock import Clock, clock, durations, ema
from nbtrain.ui.figures.memoryline import GIB, MemoryLine, memory_line
from nbtrain.ui.figures.theme import COLORS, EXTRA_COLORS, INK, MUTED, RANK_COLORS, THEME

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
FIGURE_HEIGHT_BASE = 796  # three rows of panels
FIGURE_HEIGHT_PER_EXTRA_ROW = 230
MARGIN = {"l": 64, "r": 24, "t": 128, "b": 44}  # t: the header (figures.header), tool bar row first
ROW_GAP_PX = 100  # x tick labels + "step" + the next panel's title and legend line
LEGEND_ROW_PX = 20  # a panel's legend: a line between its title and its plot


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


def axis_names(fig: go.Figure) -> list[tuple[str, str]]:
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
    axes = dict(zip(ordered, axis_names(fig), strict=True))
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
