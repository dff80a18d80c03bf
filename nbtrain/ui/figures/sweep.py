"""A sweep in one figure: every trial's metric against the step (the best bold, pruned and failed ones
marked), a parallel-coordinates chart of the parameters against the metric, and a table of the trials
sorted by the metric with the best first. The notebook's view, the CLI's picture and the server draw this
one figure."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nbtrain.ui.figures.theme import AXIS_LINE, EXTRA_COLORS, INK, MUTED, RANK_COLORS, STATE_COLORS, THEME

PALETTE = (*EXTRA_COLORS, *RANK_COLORS)
TRIAL_STATE_COLORS = {**STATE_COLORS, "pruned": "#9ca3af", "running": "#1d4ed8", "queued": MUTED}
Curve = tuple[Sequence[float], Sequence[float]]
CURVES_PX, PARCOORDS_PX, GAP_PX = 340, 200, 70
TABLE_HEAD_PX, ROW_PX, MAX_ROWS = 34, 23, 24  # more rows than MAX_ROWS scroll inside the table
MARGIN_TOP, MARGIN_BOTTOM = 80, 16


def _short(key: str) -> str:
    return key.split(".")[-1]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v)) if v is not None else ""


def ranked(trials: Sequence[Mapping[str, Any]], minimize: bool) -> list[Mapping[str, Any]]:
    """The trials as the table lists them: finished ones by the metric (best first), then the running,
    then pruned, stopped and failed ones, each group by trial number."""
    order = {"completed": 0, "running": 1, "queued": 1, "pruned": 2, "stopped": 3, "failed": 4}

    def key(t: Mapping[str, Any]) -> tuple[int, float, int]:
        v = t.get("value")
        score = (v if minimize else -v) if isinstance(v, (int, float)) else math.inf
        return order.get(str(t.get("state")), 5), score, int(t["number"])

    return sorted(trials, key=key)


def sweep_figure(
    trials: Sequence[Mapping[str, Any]],
    *,
    title: str,
    metric: str,
    minimize: bool,
    best: int | None,
    curves: Mapping[int, Curve],
) -> go.Figure:
    # the space's keys on the parameters' axes; in the table also what a clone set besides (not the path of
    # the weights it started from: its note says whose)
    space_keys = list(dict.fromkeys(k for t in trials for k in t.get("params", {})))
    keys = list(dict.fromkeys(k for t in trials for k in _shown(t)))
    # in pixels: the curves, the parameters, the table (as tall as its rows, up to MAX_ROWS of them), a gap
    rows = (CURVES_PX, PARCOORDS_PX, TABLE_HEAD_PX + ROW_PX * min(max(len(trials), 1), MAX_ROWS))
    plot_px = sum(rows) + 2 * GAP_PX
    fig = make_subplots(
        rows=3,
        cols=1,
        specs=[[{"type": "xy"}], [{"type": "parcoords"}], [{"type": "table"}]],
        row_heights=[r / sum(rows) for r in rows],
        vertical_spacing=GAP_PX / plot_px,
    )
    for t in sorted(trials, key=lambda t: int(t["number"])):
        n = int(t["number"])
        x, y = curves.get(n, ((), ()))
        if not len(x):
            continue
        state = str(t.get("state"))
        is_best = n == best
        live = state in ("completed", "running")
        color = PALETTE[n % len(PALETTE)] if live else TRIAL_STATE_COLORS.get(state, MUTED)
        params = " ".join(f"{_short(k)}={_fmt(v)}" for k, v in _shown(t).items())
        hover = f"trial {n} ({state})<br>step %{{x}}<br>{metric} %{{y:.4g}}<extra>{params}</extra>"
        fig.add_trace(
            go.Scatter(
                x=list(x),
                y=list(y),
                name=f"{'★ ' if is_best else ''}t{n} {params}",
                mode="lines+markers",
                line={"color": color, "width": 3.2 if is_best else 1.6, "dash": "solid" if live else "dot"},
                marker={"size": 5},
                opacity=1.0 if is_best or live else 0.6,
                hovertemplate=hover,
                meta=[n, state],
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text=metric, row=1, col=1)
    fig.add_trace(_parcoords(trials, space_keys, metric, minimize), row=2, col=1)
    fig.add_trace(_table(trials, keys, metric, minimize, best), row=3, col=1)
    fig.update_layout(
        template=THEME,
        title={"text": title},
        height=plot_px + MARGIN_TOP + MARGIN_BOTTOM,
        legend={"y": 1.0, "yanchor": "top", "x": 1.01, "font": {"size": 10}},
        margin={"t": MARGIN_TOP, "r": 24, "b": MARGIN_BOTTOM},
        meta={"nbtrain_sweep": True},
    )
    return fig


def _shown(t: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's values as views show them: the space's, then what a clone set (``init_from`` left out)."""
    merged = {**t.get("params", {}), **t.get("set", {})}
    merged.pop("init_from", None)
    return merged


def _note(t: Mapping[str, Any]) -> str:
    if t.get("reason"):
        return str(t["reason"])
    if t.get("clone_of") is None:
        return ""
    warm = " (from its weights)" if (t.get("set") or {}).get("init_from") else ""
    return f"clone of trial {t['clone_of']}{warm}"


def _parcoords(
    trials: Sequence[Mapping[str, Any]], keys: list[str], metric: str, minimize: bool
) -> go.Parcoords:
    """Finished trials only: a line per trial through its values, coloured by its metric."""
    done = [t for t in trials if isinstance(t.get("value"), (int, float))]
    dims = []
    for k in keys:
        vals = [t.get("params", {}).get(k) for t in done]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            numeric = [float(v) for v in vals]
            log = bool(numeric) and min(numeric) > 0 and max(numeric) / min(numeric) >= 100
            if log:  # a learning rate spans decades: its axis is its log
                ticks = sorted(set(numeric))
                dims.append(
                    {
                        "label": f"{_short(k)} (log)",
                        "values": [math.log10(v) for v in numeric],
                        "tickvals": [math.log10(v) for v in ticks],
                        "ticktext": [f"{v:.0e}" for v in ticks],
                    }
                )
            else:
                dims.append({"label": _short(k), "values": numeric})
        else:
            labels = sorted({str(v) for v in vals})
            dims.append({"label": _short(k), "values": [labels.index(str(v)) for v in vals],
                         "tickvals": list(range(len(labels))), "ticktext": labels})  # fmt: skip
    values = [float(t["value"]) for t in done]
    dims.append({"label": metric, "values": values})
    return go.Parcoords(
        dimensions=dims,
        line={"color": values, "colorscale": "Viridis", "reversescale": minimize, "showscale": False},
        labelfont={"size": 11, "color": INK},
        tickfont={"size": 10, "color": MUTED},
        name="parameters",
    )


def _table(
    trials: Sequence[Mapping[str, Any]], keys: list[str], metric: str, minimize: bool, best: int | None
) -> go.Table:
    rows = ranked(trials, minimize)
    head = ["", "trial", "state", *(_short(k) for k in keys), metric, "step", "note"]
    cols: list[list[str]] = [[] for _ in head]
    fills: list[str] = []
    for t in rows:
        n = int(t["number"])
        merged = _shown(t)
        value = t.get("value") if t.get("value") is not None else t.get("last")
        step = f"{t.get('step', '')}/{t['max_steps']}" if t.get("max_steps") else str(t.get("steps") or "")
        note = _note(t)
        cells = ["★" if n == best else "", str(n), str(t.get("state")), *(_fmt(merged.get(k)) for k in keys),
                 _fmt(value), step, _fmt(note)]  # fmt: skip
        for c, v in zip(cols, cells, strict=True):
            c.append(v)
        fills.append("#ecfdf5" if n == best else "white")
    # wide enough for each header in bold (plotly's table cuts what does not fit)
    widths = [
        18,
        44,
        78,
        *(max(96, 8 * len(_short(k)) + 12) for k in keys),
        max(80, 8 * len(metric) + 12),
        64,
        280,
    ]
    state_ink = [TRIAL_STATE_COLORS.get(s, INK) for s in cols[2]]
    inks = [state_ink if i == 2 else [INK] * len(rows) for i in range(len(head))]
    header = {"values": [f"<b>{h}</b>" for h in head], "fill_color": "#f3f4f6", "line_color": AXIS_LINE,
              "align": "left", "font": {"size": 11, "color": INK}}  # fmt: skip
    body = {"values": cols, "fill_color": [fills] * len(head), "line_color": AXIS_LINE, "align": "left",
             "font": {"size": 11, "color": inks}, "height": ROW_PX - 1}  # fmt: skip
    return go.Table(columnwidth=widths, header=header, cells=body)
