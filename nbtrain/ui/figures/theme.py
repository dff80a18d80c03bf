"""nbtrain's one plotly theme (``THEME``, registered in plotly.io.templates) and its colours: the dashboard,
preview, evaluation and estimate charts all use it."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

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
