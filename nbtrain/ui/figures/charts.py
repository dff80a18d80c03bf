"""The dashboard's figures built whole: a run's static figure (the panels, their traces and the header),
several runs' curves on one chart, and ``Run.plot()``."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from nbtrain.control.runs.metrics import DEFAULT_CAP, MetricsTail
from nbtrain.ui.figures.axes import throughput_top
from nbtrain.ui.figures.header import apply_chrome, chrome, progress
from nbtrain.ui.figures.memoryline import MemoryLine, memory_line
from nbtrain.ui.figures.panels import Frame, TraceSpec, empty_figure, make_frame, panel_grid, trace_specs
from nbtrain.ui.figures.theme import EXTRA_COLORS, RANK_COLORS, THEME

if TYPE_CHECKING:
    from nbtrain.control.runs.run import Run, RunStatus


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
