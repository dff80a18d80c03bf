"""The dashboard's axes and their controls: how high the throughput axis goes (and what lies above it), and
the loss panel's scale and smoothing buttons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.ui.figures.clock import ema
from nbtrain.ui.figures.theme import AXIS_LINE, INK

TOKENS = "tokens_per_s"


def short_number(v: float) -> str:
    """12,345 -> '12.3k' (as the axis labels read)."""
    return f"{v / 1e6:.3g}M" if v >= 1e6 else f"{v / 1e3:.3g}k" if v >= 1e3 else f"{v:.3g}"


@dataclass(frozen=True)
class ThroughputAxis:
    """The throughput panel's axis: its ``top``, and the highest per-step value (``peak``), which may lie
    above it."""

    top: float
    peak: float


def throughput_top(tail: MetricsTail) -> ThroughputAxis | None:
    """The top of the throughput axis: the smoothed curve and most per-step values fit, a rare spike of
    the faint raw line goes past it (drawn to it, it would flatten the curve people read); the panel then
    says how high the spikes went (:func:`chrome`)."""
    s = tail.series(TOKENS)
    if s is None or not len(s):
        return None
    raw = np.asarray(s.y)
    raw = raw[np.isfinite(raw)]
    if not len(raw):
        return None
    top = max(float(np.percentile(raw, 95)), float(np.nanmax(ema(raw))))
    return ThroughputAxis(1.15 * top, float(np.max(raw))) if top > 0 else None


def loss_controls(y: float) -> list[dict[str, Any]]:
    """The loss panel's controls, at its top right (``y``, paper coordinates): its scale, linear or log,
    and the curve, raw or smoothed (the exponential moving average the throughput panel draws, the raw
    line faint behind it), as TensorBoard offers. They act in the browser (plotly's relayout / restyle,
    on the raw loss and its smoothed twin: traces 0 and 1, which ``trace_specs`` puts first); a live view's
    updates change only the data, so the choice holds while the run goes on."""
    look = {"type": "buttons", "direction": "right", "showactive": True, "yanchor": "bottom",
            "font": {"size": 10, "color": INK}, "bgcolor": "#f8fafc", "bordercolor": AXIS_LINE,
            "pad": {"l": 2, "r": 2, "t": 0, "b": 0}, "y": y}  # fmt: skip
    scale = [
        {"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
        {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]},
    ]
    curve = [
        {"label": "raw", "method": "restyle",
         "args": [{"visible": [True, False], "opacity": [1.0, 1.0]}, [0, 1]]},
        {"label": "smoothed", "method": "restyle",
         "args": [{"visible": [True, True], "opacity": [0.3, 1.0]}, [0, 1]]},
    ]  # fmt: skip
    return [
        {**look, "name": "loss-curve", "buttons": curve, "x": 1.0, "xanchor": "right", "active": 0},
        {**look, "name": "loss-scale", "buttons": scale, "x": 0.83, "xanchor": "right", "active": 0},
    ]
