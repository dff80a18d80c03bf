"""The live dashboard of one run: a header, a progress bar and one Plotly ``FigureWidget``.

One background thread polls the run directory (only new bytes, see :mod:`nbtrain.ui.tail`) and updates
the widget inside ``batch_update()`` at a throttled rate, only when something changed, so the kernel
stays free for other cells. Errors in that thread are shown in the header and kept in ``error``.

What a saved notebook keeps (checked with nbclient 0.11 / ipykernel 7.4 / plotly 7.1):

- a FigureWidget's saved widget state holds the data it was *created* with (later updates travel as
  messages that are not part of its state) plus ~5 MB of plotly's JS, and JupyterLab shows "model not
  found" for a widget output once the kernel is gone;
- ``update_display_data`` sent from a background thread reaches the right output even while another
  cell runs (nbclient maps it by display id), but ``display()``/``print`` from a thread land in whatever
  cell is running then.

So the dashboard is displayed through a display handle with static fallbacks (plotly JSON, HTML) next
to the widget, and when the run ends the handle is updated to a static figure of the final state and
the widgets are closed: the saved notebook, any viewer without the kernel, and an untrusted notebook
all show the final chart.
"""

from __future__ import annotations

import copy
import html
import json
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from nbtrain.errors import RunNotFound
from nbtrain.runs import Run, RunStatus
from nbtrain.ui.figures import (
    STATE_COLORS,
    TraceSpec,
    add_traces,
    build_figure,
    estimate_bytes_of,
    header_parts,
    header_text,
    progress,
    trace_specs,
)
from nbtrain.ui.tail import DEFAULT_CAP, MetricsTail

if TYPE_CHECKING:
    from IPython.display import DisplayHandle

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
BAR_STYLES = {"completed": "success", "failed": "danger", "stopped": "warning"}


def static_bundle(fig: go.Figure, text: str, header_html: str = "") -> dict[str, Any]:
    """A display bundle for a figure that needs no kernel: plotly JSON (JupyterLab, VS Code) and HTML
    that loads plotly.js from its CDN (nbconvert, other viewers)."""
    fig_html = pio.to_html(fig, include_plotlyjs="cdn", full_html=False, config={"displaylogo": False})
    return {
        PLOTLY_MIME: {**json.loads(fig.to_json()), "config": {"displaylogo": False}},
        "text/html": header_html + fig_html,
        "text/plain": text,
    }


class Dashboard:
    """A live view of ``run``: ``show()`` it in a notebook, or ``follow()`` it until the run ends.

    ``interval`` is the polling period of the update thread and so the highest update rate of the
    figure. ``widget=False`` shows a static figure instead, re-displayed at most every
    ``static_interval`` seconds: for frontends without widgets, or headless notebook runs where a
    FigureWidget's 5 MB state is not wanted. Each tick reads at most ``chunk_bytes`` of each file, so
    showing a long run returns at once and its history loads over the next ticks.
    """

    def __init__(
        self,
        run: Run,
        interval: float = 0.25,
        *,
        estimate_bytes: float | None = None,
        extra: Sequence[str] = (),
        cap: int = DEFAULT_CAP,
        widget: bool = True,
        static_interval: float = 5.0,
        chunk_bytes: int = 4_000_000,
    ) -> None:
        self.run = run
        self.interval = max(0.02, float(interval))
        self.static_interval = static_interval
        self.chunk_bytes = chunk_bytes
        self.tail = MetricsTail(run, cap=cap)
        if estimate_bytes is None:
            try:
                estimate_bytes = estimate_bytes_of(run.resolved)
            except RunNotFound:
                estimate_bytes = None  # a run being created: no resolved.json yet, so no estimate
        self.estimate_bytes = estimate_bytes
        self.extra = tuple(extra)
        self.widget = widget
        self.error: str | None = None
        self.status: RunStatus | None = None
        self.updates = 0  # figure updates sent, for tests and diagnostics
        self.finished = False

        self.fig: go.FigureWidget | None = None
        self.header: widgets.HTML | None = None
        self.progress: widgets.IntProgress | None = None
        self.box: widgets.VBox | None = None
        self._index: dict[tuple[str, ...], int] = {}
        self._versions: dict[tuple[str, ...], tuple[int, float | None]] = {}

        self._handle: DisplayHandle | None = None
        self._shown = False
        self._static_sig: tuple[Any, ...] | None = None
        self._static_at = 0.0
        self._unseen_sync_at = 0.0
        # refresh() runs in the thread or in follow(); the lock keeps a stray second caller from
        # interleaving two updates of the same widgets
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------------------------ updating
    def refresh(self) -> RunStatus:
        """Read what is new and update the view; returns the run's status. Safe to call any time."""
        with self._lock:
            st = self._read()
            if self.widget and not self.finished:
                self._update_widgets(st)
            elif not self.widget and self._handle is not None and not self._ended(st):
                self._update_static(st)
            return st

    def _read(self) -> RunStatus:
        # status before metrics: the worker writes its last metrics before its final state, so a
        # terminal status read first guarantees the poll sees every line
        st = self.run.status()
        # a bounded read per tick: attaching to a long run fills the history over several ticks
        # (the figure grows as it loads) instead of blocking the cell for the whole file
        self.tail.poll(max_bytes=self.chunk_bytes)
        self.status = st
        return st

    def _ended(self, st: RunStatus) -> bool:
        return st.done and self.tail.caught_up

    def _build_widgets(self, st: RunStatus) -> None:
        specs = trace_specs(self.tail, self.extra)
        fig = build_figure(self.tail, st, estimate_bytes=self.estimate_bytes, extra=self.extra, title=False)
        fig.update_layout(margin={"t": 50})
        self.fig = go.FigureWidget(fig)
        self._index = {tuple(trace.meta): i for i, trace in enumerate(self.fig.data)}
        self._versions = {spec.key: spec.version(self.tail) for spec in specs}
        self.header = widgets.HTML(value=self._header_html(st))
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="100%"))
        self._update_progress(st)
        self.box = widgets.VBox([self.header, self.progress, self.fig])

    def _update_widgets(self, st: RunStatus) -> None:
        if self.fig is None:
            self._build_widgets(st)
            return
        assert self.header is not None
        specs = trace_specs(self.tail, self.extra)
        new = [s for s in specs if s.key not in self._index]
        if new:
            # adding traces cannot happen inside batch_update; they arrive with their data anyway
            first = len(self.fig.data)
            add_traces(self.fig, self.tail, new, self.extra)
            for i, spec in enumerate(new):
                self._index[spec.key] = first + i
                self._versions[spec.key] = spec.version(self.tail)
        added = {s.key for s in new}
        changed: list[TraceSpec] = [
            s for s in specs if s.key not in added and s.version(self.tail) != self._versions[s.key]
        ]
        if changed:
            with self.fig.batch_update():
                for spec in changed:
                    trace = self.fig.data[self._index[spec.key]]
                    trace.x, trace.y = spec.data(self.tail)
                    self._versions[spec.key] = spec.version(self.tail)
        if new or changed:
            self.updates += 1
            self._sync_unseen()
        value = self._header_html(st)
        if value != self.header.value:
            self.header.value = value
        self._update_progress(st)

    def _sync_unseen(self, *, force: bool = False) -> None:
        """Keep the figure's initial state current while no browser view shows it.

        Plotly sends trace updates as messages to the views that exist; a view created later (the
        frontend is still loading the widget code, a slow machine, a notebook reopened) draws the state
        the widget had when it was made, so it would stay empty. Until the frontend reports a view
        (``_view_count``), the full state is re-sent at most once a second instead.
        """
        fig = self.fig
        if fig is None or getattr(fig, "_view_count", None):
            return
        now = time.monotonic()
        if force or now - self._unseen_sync_at >= 1.0:
            fig._widget_layout = copy.deepcopy(fig._layout_obj._props)
            fig._widget_data = copy.deepcopy(fig._data)
            self._unseen_sync_at = now

    def _update_progress(self, st: RunStatus) -> None:
        assert self.progress is not None
        p = self.progress
        top = max(1, st.max_steps or 0)
        if p.max != top:
            p.max = top
        # with no known max_steps an empty bar says less that is wrong than a full one
        step = min(max(st.step, int(self.tail.last_step or 0)), top) if st.max_steps else 0
        if p.value != step:
            p.value = step
        style = BAR_STYLES.get(st.state, "info")
        if p.bar_style != style:
            p.bar_style = style

    def _update_static(self, st: RunStatus) -> None:
        assert self._handle is not None
        sig = (self.tail.version, st.state, st.step, st.max_steps)
        now = time.monotonic()
        if sig != self._static_sig and now - self._static_at >= self.static_interval:
            self._handle.update(self._static(st), raw=True)
            self._static_sig, self._static_at = sig, now
            self.updates += 1

    # ---------------------------------------------------------------------------------- rendering
    def _static(self, st: RunStatus) -> dict[str, Any]:
        fig = build_figure(
            self.tail, st, estimate_bytes=self.estimate_bytes, name=self.run.name, extra=self.extra
        )
        extra = self._error_html(st)
        return static_bundle(
            fig, self.text(st), f"<div class='nbtrain-dashboard'>{extra}</div>" if extra else ""
        )

    def text(self, st: RunStatus | None = None) -> str:
        st = st or self.status or self.run.status()
        text = f"{self.run.id}: " + header_text(progress(self.tail, st))
        if self.error:
            text += f"\nlive view stopped by an error:\n{self.error}"
        return text

    def _header_html(self, st: RunStatus) -> str:
        color = STATE_COLORS.get(st.state, "#1565c0")
        parts = header_parts(progress(self.tail, st))[1:]  # [0] is the state, coloured here
        head = (
            f"<b>{html.escape(self.run.name)}</b> <code>{html.escape(self.run.id)}</code> "
            f"<span style='color:{color};font-weight:bold'>{html.escape(st.state)}</span> · "
            + " · ".join(html.escape(s) for s in parts)
        )
        return f"<div class='nbtrain-dashboard'>{head}{self._error_html(st)}</div>"

    def _error_html(self, st: RunStatus) -> str:
        out = ""
        if st.state == "completed":
            out += f"<div>output: <code>{html.escape(str(self.run.output_dir))}</code></div>"
        if st.error:
            tail = st.error.get("log_tail") or self.run.logs(20)
            out += (
                f"<div style='color:#c62828'>{html.escape(str(st.error.get('type', 'error')))}: "
                f"{html.escape(str(st.error.get('message', '')))}</div>"
                f"<details><summary>log tail</summary><pre>{html.escape(tail)}</pre></details>"
            )
        if self.error:
            out += (
                "<pre style='color:#c62828;white-space:pre-wrap'>live view stopped by an error:\n"
                f"{html.escape(self.error)}</pre>"
            )
        return out

    # ------------------------------------------------------------------------------------ showing
    def show(self, *, background: bool = True) -> None:
        """Display the dashboard in the current cell and (by default) keep it updated from a thread."""
        from IPython.display import display

        with self._lock:
            st = self._read()
            self._shown = True
            if self._ended(st) or not self.widget:
                self._handle = display(self._static(st), raw=True, display_id=True)
                self._static_sig = (self.tail.version, st.state, st.step, st.max_steps)
                self._static_at = time.monotonic()
                if self._ended(st):
                    self.finished = True
                    self._close_widgets()
                    return
            else:
                self._update_widgets(st)
                self._sync_unseen(force=True)
                bundle = {**self._static(st), **self._widget_bundle()}
                self._handle = display(bundle, raw=True, display_id=True)
        if background:
            self.start()

    def _widget_bundle(self) -> dict[str, Any]:
        assert self.box is not None
        return {WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.box.model_id}}

    def start(self) -> None:
        """Start the update thread (``show()`` does); a no-op while it runs or once the run ended."""
        if self.finished or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"nbtrain-dashboard-{self.run.id}", daemon=True
        )
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _loop(self) -> None:
        stop = self._stop
        wait = self.interval
        try:
            while not stop.wait(wait):
                st = self.refresh()
                if self._ended(st):
                    self._finish(st)
                    return
                wait = self.interval if self.tail.caught_up else 0.0
        except Exception:  # noqa: BLE001 - a thread's exception is otherwise lost: shown in the view
            self._fail(traceback.format_exc())

    def _finish(self, st: RunStatus) -> None:
        """After the final widget update: leave a static figure of the final state in the output."""
        with self._lock:
            if self._handle is not None:
                self._handle.update(self._static(st), raw=True)
                self._close_widgets()
            self.finished = True

    def _fail(self, tb: str) -> None:
        self.error = tb
        try:
            st = self.status or RunStatus(state="queued")
            if self.header is not None:
                self.header.value = self._header_html(st)
            elif self._handle is not None:
                self._handle.update(
                    {"text/html": self._header_html(st), "text/plain": self.text(st)}, raw=True
                )
        except Exception:  # noqa: BLE001 - the view itself is broken: the kernel's stderr is what is left
            print(f"nbtrain dashboard of {self.run.id} failed:\n{tb}", file=sys.__stderr__)

    def _close_widgets(self) -> None:
        # the output shows the static figure now; closing frees the models in kernel and frontend
        for w in (self.box, self.fig, self.progress, self.header):
            if w is not None:
                w.close()

    def follow(self, timeout: float | None = None) -> RunStatus:
        """Block, updating the view in the foreground, until the run ends; returns its final status.

        On a timeout or an interrupt the view is handed back to the update thread (it stays live) and
        the exception propagates. Used by ``%finetune wait``.
        """
        self._stop_thread()  # one updater at a time
        if not self._shown:
            self.show(background=False)
        if self.finished:
            return self.status or self.run.status()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                st = self.refresh()
                if self._ended(st):
                    self._finish(st)
                    return st
                if deadline is not None and time.monotonic() > deadline:
                    self.start()
                    raise TimeoutError(f"run {self.run.id} still {st.describe()} after {timeout} s")
                if self.tail.caught_up:
                    time.sleep(self.interval)
        except KeyboardInterrupt:
            self.start()
            raise
        except TimeoutError:
            raise
        except Exception:
            self._fail(traceback.format_exc())
            raise

    def _stop_thread(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)

    def close(self) -> None:
        """Stop updating (the view stays as it is)."""
        self._stop_thread()
