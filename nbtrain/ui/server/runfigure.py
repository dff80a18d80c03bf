"""A run's page's charts: the very figure a notebook's dashboard draws (``nbtrain.ui.figures.build_figure``:
loss with eval loss, learning rate, gradient norm, throughput and memory against the step, the loss panel's
linear/log and raw/smoothed controls, the axis titles), as plotly JSON for the page's plotly renderer
(``labextension/src/runfigure.ts``). One figure builder for the cell and the page: the page draws no chart of
its own.

Each run's metrics are read incrementally through the one metrics reader (``MetricsTail``: only the bytes
appended since the last request, at most ``MAX_READ_BYTES`` of each file per request), one reader per run
for the server's life (the ``KEPT`` most recently asked). The answer carries a ``version``: asked with the
version it holds, the page gets ``figure: null`` while nothing the figure shows has changed, so a page left
open on an ended run costs a status read, not a figure.

The page shows the run's name, state, steps, loss, time left and error itself, above the figure, so the
figure comes without its header line, progress bar and error line; its width follows the page.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import RunNotFound

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from nbtrain.control.runs.metrics import MetricsTail
    from nbtrain.control.runs.run import Run, RunStatus

KEPT = 32  # runs whose metrics stay read (an LRU): a page reopened later reads only what was appended since
MAX_READ_BYTES = 16 << 20  # per file per request; "caught_up" false: the page asks again at once
# the loss panel's title, legend and controls, under plotly's tool bar (the header and bar are the page's)
PAGE_MARGIN_TOP = 84


class _Kept:
    def __init__(self, tail: MetricsTail) -> None:
        self.tail = tail
        self.lock = threading.Lock()  # two tabs on one run must not read its new records twice


_LOCK = threading.Lock()
_TAILS: OrderedDict[str, _Kept] = OrderedDict()


def _kept(run: Run) -> _Kept:
    from nbtrain.control.runs.metrics import MetricsTail

    key = str(run.dir)
    with _LOCK:
        kept = _TAILS.pop(key, None) or _Kept(MetricsTail(run))
        _TAILS[key] = kept
        while len(_TAILS) > KEPT:
            _TAILS.popitem(last=False)
        return kept


def _version(tail: MetricsTail, st: RunStatus) -> str:
    """Changes whenever the figure would: new records, or a status the figure reads (its waiting message,
    the throughput axis and the estimate need the records; the state and phase say what it waits for)."""
    parts = [tail.version, tail.records, st.state, st.phase_text(), st.max_steps, bool(st.error)]
    return json.dumps(parts, default=str)


def for_page(fig: go.Figure) -> None:
    """The dashboard's figure as the page shows it: without the header line, progress bar and error line
    (the page's own head says those), as wide as the page."""
    fig.layout.shapes = [s for s in fig.layout.shapes if not str(s.name or "").startswith("progress")]
    fig.layout.annotations = [a for a in fig.layout.annotations if a.name != "error"]
    fig.update_layout(width=None, autosize=True, title=None, margin={"t": PAGE_MARGIN_TOP})


def run_figure(run: Run, since: str | None = None) -> dict[str, Any]:
    """``{"version", "caught_up", "figure"}``: the run's dashboard figure as plotly JSON (``figure`` None
    when ``since`` is the version the figure would have)."""
    from nbtrain.ui.figures import build_figure, memory_line

    kept = _kept(run)
    with kept.lock:
        tail = kept.tail
        tail.poll(max_bytes=MAX_READ_BYTES)
        st = run.status()
        version = _version(tail, st)
        if since == version:
            return {"version": version, "caught_up": tail.caught_up, "figure": None}
        try:
            estimate = memory_line(run.resolved.get("estimate"))
        except RunNotFound:
            estimate = None  # a run being created: no resolved.json yet, so no estimate
        fig = build_figure(tail, st, estimate=estimate, name=run.name, title=False)
    for_page(fig)
    figure = json.loads(fig.to_json())
    return {"version": version, "caught_up": tail.caught_up, "figure": figure}
