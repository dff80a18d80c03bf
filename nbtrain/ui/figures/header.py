"""A run's progress as its figure says it: the header line (state, step, elapsed, ETA, last loss), the
progress bar under it, an error line, and the layout that follows the run (:func:`chrome`: those, the
estimate's label, the throughput axis's top, and before the first step what the run is doing)."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from nbtrain.contract.rundir import TERMINAL_STATES
from nbtrain.control.runs.eta import remaining, time_left
from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.ui.figures.axes import ThroughputAxis, short_number
from nbtrain.ui.figures.clock import Clock, clock, duration, loss_every_of
from nbtrain.ui.figures.memoryline import GIB, MemoryLine
from nbtrain.ui.figures.panels import FIGURE_HEIGHT_BASE, MARGIN, axis_names
from nbtrain.ui.figures.theme import AXIS_LINE, GRID, INK, MUTED, RUNNING_COLOR, STATE_COLORS

if TYPE_CHECKING:
    from nbtrain.control.runs.run import RunStatus

# Where the header's parts lie, in pixels from the figure's top (its margin is panels.MARGIN). The header
# line starts under plotly's tool bar (the modebar: top right, about 26 px high, shown on hover), which drew
# over the line's end when both shared the top row.
MODEBAR_PX = 28  # the tool bar's row, kept clear
TITLE_Y_PX = MODEBAR_PX  # the header line, from the top
BAR_Y_PX = TITLE_Y_PX + 30  # the progress bar under it
BAR_H_PX = 5
ERROR_Y_PX = BAR_Y_PX + 12  # an error line under the bar


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
    first_loss: str | None = None  # before it: "first loss at step 5, in about 3 min" (control/runs/eta)

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
            "running": f"training: {self.first_loss or 'waiting for the first logged step'}",
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
    left = time_left(
        status,
        logged=clk.seconds_per_step(),
        losses=tail.records,
        loss_every=loss_every_of(tail.paths, status.max_steps),
        step=step,
        now=now,
    )
    return Progress(
        state=status.state,
        step=step,
        max_steps=status.max_steps,
        elapsed=elapsed,
        eta=left.seconds,
        loss=tail.last.get("loss"),
        eval_loss=tail.last.get("eval_loss"),
        error=status.error,
        phase=status.phase_text(),
        records=tail.records,
        first_loss=left.first_loss_text,
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
    axes = axis_names(fig)
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
