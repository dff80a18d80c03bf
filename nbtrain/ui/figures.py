"""Plotly figures of a run: the dashboard layout (static or live), run comparison, and ``Run.plot()``.

The live dashboard and the static figure are built from the same trace specs, so a notebook saved after
a run shows exactly what the live view showed at the end.
"""

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

from nbtrain.rundir import TERMINAL_STATES
from nbtrain.ui.tail import DEFAULT_CAP, MEMORY_KEYS, FloatArray, MetricsTail

if TYPE_CHECKING:
    from nbtrain.runs import Run, RunStatus

GIB = float(2**30)

# The fixed panels; extra metric panels (e.g. a DPO recipe's rewards/margins) follow them.
LOSS, LR, GRAD_NORM, TOKENS, MEMORY = "loss", "lr", "grad_norm", "tokens_per_s", "memory"
PANEL_TITLES = {
    LOSS: "loss",
    LR: "learning rate",
    GRAD_NORM: "grad norm",
    TOKENS: "tokens/s",
    MEMORY: "memory per rank (GiB)",
}
STATE_COLORS = {"completed": "#2e7d32", "failed": "#c62828", "stopped": "#6d4c41"}
RANK_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
MEMORY_STYLE = {  # key -> (legend label, line dash)
    "rss": ("RSS", "solid"),
    "gpu_mem_alloc": ("GPU allocated", "dot"),
    "gpu_mem_reserved": ("GPU reserved", "dash"),
    "gpu_mem_peak": ("GPU peak", "dashdot"),
}
FIGURE_HEIGHT_BASE = 680
FIGURE_HEIGHT_PER_EXTRA_ROW = 220


@dataclass(frozen=True)
class TraceSpec:
    """One trace of the dashboard: where its data comes from and where it is drawn."""

    key: tuple[str, ...]  # ("metric", name) or ("memory", rank, name): stable across updates
    panel: str
    name: str
    color: str | None = None
    dash: str = "solid"
    markers: bool = False
    showlegend: bool = True
    legendgroup: str | None = None

    def data(self, tail: MetricsTail) -> tuple[FloatArray, FloatArray]:
        """x and y as drawn: metrics against step; memory in GiB against minutes since the start."""
        if self.key[0] == "memory":
            s = tail.memory(int(self.key[1]), self.key[2])
            if s is None:
                return _EMPTY, _EMPTY
            origin = tail.started() or 0.0
            return (s.x - origin) / 60.0, s.y / GIB
        s = tail.series(self.key[1])
        if s is None:
            return _EMPTY, _EMPTY
        return s.x, s.y

    def version(self, tail: MetricsTail) -> tuple[int, float | None]:
        """Changes exactly when :meth:`data` would return something different."""
        if self.key[0] == "memory":
            s = tail.memory(int(self.key[1]), self.key[2])
            return (s.version if s else -1), tail.started()
        s = tail.series(self.key[1])
        return (s.version if s else -1), None

    def trace(self, tail: MetricsTail) -> go.Scatter:
        x, y = self.data(tail)
        return go.Scatter(
            x=x,
            y=y,
            name=self.name,
            mode="lines+markers" if self.markers else "lines",
            line={"color": self.color, "dash": self.dash, "width": 1.5},
            marker={"size": 5} if self.markers else None,
            showlegend=self.showlegend,
            legendgroup=self.legendgroup,
            meta=list(self.key),  # lets tests and tools find a trace by key, not by position
        )


_EMPTY: FloatArray = np.empty(0, dtype=np.float64)


def _extra_panels(extra: Sequence[str]) -> list[str]:
    # a key that already has a trace (or names a panel) would get a second trace with the same key
    taken = {LOSS, "eval_loss", LR, GRAD_NORM, TOKENS, MEMORY}
    return [k for k in dict.fromkeys(extra) if k not in taken]


def trace_specs(tail: MetricsTail, extra: Sequence[str] = ()) -> list[TraceSpec]:
    """The traces to draw for what the tail has seen so far.

    The core metric traces are always present (empty until logged) so a live figure keeps its panels
    from the start; eval_loss and memory traces appear once their data does.
    """
    specs = [TraceSpec(("metric", "loss"), LOSS, "loss", color="#1f77b4")]
    if tail.series("eval_loss") is not None:
        specs.append(TraceSpec(("metric", "eval_loss"), LOSS, "eval_loss", color="#ff7f0e", markers=True))
    specs += [
        TraceSpec(("metric", "lr"), LR, "lr", color="#2ca02c", showlegend=False),
        TraceSpec(("metric", "grad_norm"), GRAD_NORM, "grad_norm", color="#9467bd", showlegend=False),
        TraceSpec(("metric", "tokens_per_s"), TOKENS, "tokens/s", color="#8c564b", showlegend=False),
    ]
    for rank in tail.ranks:
        for key in MEMORY_KEYS:
            if tail.memory(rank, key) is not None:
                label, dash = MEMORY_STYLE[key]
                specs.append(
                    TraceSpec(
                        ("memory", str(rank), key),
                        MEMORY,
                        f"rank {rank} {label}",
                        color=RANK_COLORS[rank % len(RANK_COLORS)],
                        dash=dash,
                        legendgroup=f"rank{rank}",
                    )
                )
    specs += [TraceSpec(("metric", k), k, k, showlegend=False) for k in _extra_panels(extra)]
    return specs


def panel_grid(extra: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
    """(row, col) of each panel: loss across the top, the rest two per row."""
    grid = {LOSS: (1, 1)}
    for i, panel in enumerate([LR, GRAD_NORM, TOKENS, MEMORY, *_extra_panels(extra)]):
        grid[panel] = (2 + i // 2, 1 + i % 2)
    return grid


def empty_figure(extra: Sequence[str] = (), *, estimate_bytes: float | None = None) -> go.Figure:
    """The dashboard's panels with axes and titles but no traces."""
    grid = panel_grid(extra)
    rows = max(r for r, _ in grid.values())
    specs: list[list[dict[str, Any] | None]] = [[{"colspan": 2}, None]]
    specs += [[{}, {}] for _ in range(rows - 1)]
    ordered = sorted(grid, key=lambda p: grid[p])
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=[PANEL_TITLES.get(p, p) for p in ordered],
        vertical_spacing=min(0.3 / rows, 0.1),
        horizontal_spacing=0.08,
    )
    for panel, (row, col) in grid.items():
        # an x title on every panel collides with the subplot title below it: "step" goes on the
        # bottom row only, the memory panel always says its axis is time
        if panel == MEMORY:
            fig.update_xaxes(title_text="minutes since start", row=row, col=col)
        elif row == rows:
            fig.update_xaxes(title_text="step", row=row, col=col)
    row, col = grid[LR]
    fig.update_yaxes(exponentformat="e", row=row, col=col)
    fig.update_layout(
        template="plotly_white",
        height=FIGURE_HEIGHT_BASE + FIGURE_HEIGHT_PER_EXTRA_ROW * (rows - 3),
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        # below the panels: at the top a legend of many ranks would run into the title and modebar
        legend={"orientation": "h", "yanchor": "top", "y": -0.1, "xanchor": "left", "x": 0},
        # keeps the user's zoom and hidden traces while a live figure updates
        uirevision="nbtrain",
        hovermode="x unified",
    )
    if estimate_bytes:
        row, col = grid[MEMORY]
        fig.add_hline(
            y=estimate_bytes / GIB,
            line={"color": "#424242", "dash": "longdash", "width": 1.5},
            annotation_text=f"estimate {estimate_bytes / GIB:.1f} GiB",
            annotation_position="top left",
            row=row,
            col=col,
            exclude_empty_subplots=False,  # the line matters most before the first sample arrives
        )
    return fig


def add_traces(
    fig: go.Figure, tail: MetricsTail, specs: Sequence[TraceSpec], extra: Sequence[str] = ()
) -> None:
    grid = panel_grid(extra)
    for spec in specs:
        row, col = grid[spec.panel]
        fig.add_trace(spec.trace(tail), row=row, col=col)


# ---------------------------------------------------------------------------------------- header
def duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


def progress(tail: MetricsTail, status: RunStatus, now: float | None = None) -> Progress:
    now = time.time() if now is None else now
    step = max(status.step, int(tail.last_step or 0))
    start = tail.started()
    elapsed = None
    if start is not None:
        # a finished run's elapsed time stops at its last status write, not at "now"
        end = status.updated if status.done and status.updated else now
        elapsed = max(0.0, end - start)
    eta = None
    rate = tail.steps_per_second()
    if not status.done and status.max_steps and rate:
        eta = max(0, status.max_steps - step) / rate
    return Progress(
        state=status.state,
        step=step,
        max_steps=status.max_steps,
        elapsed=elapsed,
        eta=eta,
        loss=tail.last.get("loss"),
        eval_loss=tail.last.get("eval_loss"),
        error=status.error,
    )


def header_parts(p: Progress) -> list[str]:
    parts = [p.state, f"step {p.step}/{p.max_steps}" if p.max_steps else f"step {p.step}"]
    if p.elapsed is not None:
        parts.append(f"elapsed {duration(p.elapsed)}")
    if p.eta is not None:
        parts.append(f"ETA {duration(p.eta)}")
    if p.loss is not None:
        parts.append(f"loss {fmt(p.loss)}")
    if p.eval_loss is not None:
        parts.append(f"eval_loss {fmt(p.eval_loss)}")
    return parts


def header_text(p: Progress, name: str | None = None) -> str:
    text = " · ".join(([name] if name else []) + header_parts(p))
    if p.error:
        text += f" — {p.error.get('type', 'error')}: {p.error.get('message', '')}"
    return text


def header_title(p: Progress, name: str | None = None) -> str:
    """The figure title: plotly titles take a subset of HTML, so everything user-written is escaped."""
    color = STATE_COLORS.get(p.state, "#1565c0")
    parts = header_parts(p)
    head = f"<span style='color:{color}'><b>{html.escape(parts[0])}</b></span> · " + " · ".join(
        html.escape(s) for s in parts[1:]
    )
    if name:
        head = f"<b>{html.escape(name)}</b> · {head}"
    if p.error:
        msg = str(p.error.get("message", ""))
        msg = msg if len(msg) <= 120 else msg[:117] + "..."
        head += f"<br><span style='color:#c62828'>{html.escape(str(p.error.get('type', 'error')))}: "
        head += f"{html.escape(msg)}</span>"
    return head


# ----------------------------------------------------------------------------------------- figures
def build_figure(
    tail: MetricsTail,
    status: RunStatus,
    *,
    estimate_bytes: float | None = None,
    name: str | None = None,
    extra: Sequence[str] = (),
    title: bool = True,
    now: float | None = None,
) -> go.Figure:
    """A static figure of what ``tail`` holds: loss and eval_loss, lr, grad norm, tokens/s against
    step, memory per rank against time (with a line at ``estimate_bytes``), and any ``extra`` metric
    keys in panels of their own. The title carries state, progress, elapsed time, ETA and last loss.
    """
    fig = empty_figure(extra, estimate_bytes=estimate_bytes)
    add_traces(fig, tail, trace_specs(tail, extra), extra)
    if title:
        fig.update_layout(title={"text": header_title(progress(tail, status, now), name), "x": 0.01})
    return fig


def _label(run: Run) -> str:
    return run.id if run.name in (run.id, "") else f"{run.name} ({run.id})"


def compare_figure(
    runs: Sequence[Run], *, key: str = "loss", eval_key: str | None = "eval_loss", cap: int = DEFAULT_CAP
) -> go.Figure:
    """The ``key`` curves of several runs on one chart (eval curves dashed in the same colour)."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        tail = MetricsTail(run, cap=cap)
        tail.poll()
        color = RANK_COLORS[i % len(RANK_COLORS)]
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
                    line={"color": color, "dash": dash, "width": 1.5},
                    legendgroup=run.id,
                    meta=[run.id, k],
                )
            )
    fig.update_layout(
        template="plotly_white",
        title={"text": f"{html.escape(key)} of {len(runs)} run{'s' if len(runs) != 1 else ''}", "x": 0.01},
        xaxis_title="step",
        yaxis_title=key,
        hovermode="x unified",
        height=450,
    )
    return fig


def estimate_bytes_of(resolved: dict[str, Any]) -> float | None:
    """The memory estimate recorded in resolved.json, as bytes per device, if there is one."""
    est = resolved.get("estimate")
    if isinstance(est, (int, float)) and not isinstance(est, bool):
        return float(est)
    if isinstance(est, dict):
        for k in ("per_device_bytes", "peak_bytes", "total_bytes", "bytes"):
            v = est.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return None


def run_plot(run: Run, *, estimate_bytes: float | None = None, extra: Sequence[str] = ()) -> go.Figure:
    """The whole run as a static figure (``Run.plot()``)."""
    tail = MetricsTail(run)
    tail.poll()
    if estimate_bytes is None:
        estimate_bytes = estimate_bytes_of(run.resolved)
    return build_figure(tail, run.status(), estimate_bytes=estimate_bytes, name=run.name, extra=extra)
