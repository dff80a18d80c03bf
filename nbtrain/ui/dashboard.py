"""The live dashboard of one run: one Plotly ``FigureWidget`` (its title the header, a bar under it the
progress), and a line of notes under it (the output folder, an error's log tail).

One background thread follows the run with the one follow loop (:mod:`nbtrain.control.runs.follow`),
reads the run directory through the one metrics reader (only new bytes, :mod:`nbtrain.control.runs.metrics`)
and updates the widget inside ``batch_update()`` at a throttled rate, only when something changed, so the
kernel stays free for other cells. Errors in that thread are shown under the figure and kept in ``error``.

What a saved notebook keeps (checked with nbclient 0.11 / ipykernel 7.4 / plotly 7.1):

- a FigureWidget's saved widget state holds the data it was *created* with (later updates travel as
  messages that are not part of its state) plus ~5 MB of plotly's JS, and JupyterLab shows "model not
  found" for a widget output once the kernel is gone;
- ``update_display_data`` sent from a background thread reaches the right output even while another
  cell runs (nbclient maps it by display id), but ``display()``/``print`` from a thread land in whatever
  cell is running then.

- JupyterLab 4 / ipywidgets 8 choose the widget renderer for a bundle that holds a widget view, and that
  renderer has no fallback: a missing model is "Error displaying widget: model not found" whatever else
  the bundle holds.

So a live dashboard is three outputs of its cell, each updated in place (:class:`CellOutput`, which
routes updates from the thread to the cell that showed them): the widget (a widget view and a line of
text), a static snapshot of the figure (plotly JSON, HTML, text) updated at most every
``static_interval`` seconds, and a guard (a ``<style>`` only). While the widget is drawn, a style in its
notes hides the snapshot; while it is not (a notebook saved mid-run and reopened without the kernel, or
the widget code still loading), the guard's style hides the widget's output and the snapshot shows. So it
does once the kernel is lost (Kernel > Restart, a kernel that died or was shut down): ipywidgets 8 keeps
drawing the widget as it last was, with a broken-link icon, so the lab extension marks its output
(``KERNEL_LOST_CLASS``, labextension/src/kernellost.ts) and both styles treat it as not drawn.
When the run ends the guard and the snapshot become empty, then (in that order, so the guard never
hides it) the widget output becomes the static figure of the final state and the widgets are closed: the
saved notebook, any viewer without the kernel, and an untrusted notebook all show the final chart and no
widget reference.

The snapshot of a run that goes on also carries ``RUN_VIEW_MIME``: the run's id, which nbtrain's lab
extension renders instead of the figure as a view that follows the run through the server extension
(labextension/src/runview.ts). So once the kernel that drew a view is gone (restarted, shut down, the
notebook reopened without it), the view still shows the run as its run directory has it now, and says
where it reads from and when it last could. Under the final figure of a stopped or failed run, which may
be resumed from anywhere, the snapshot's place holds a watch of the same type: empty while the run is as
the figure shows it, the live view (the figure hidden) once it went on without this kernel. Frontends
other than JupyterLab / Notebook 7 mid-run show both the widget (or its error) and the snapshot.

A view that ended on a run's stopped or failed state is not left behind when the run starts again (a
resume from the sidebar, another cell or the CLI): one thread per kernel (:class:`Revivals`) reads those
runs' status every ``REVIVE_EVERY`` seconds, and a view whose run is active again turns live in place,
follows the new attempt and ends on its final state as before.
"""

from __future__ import annotations

import copy
import html
import json
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from nbtrain.contract.errors import RunNotFound
from nbtrain.control.jobs.grading import CellOutput
from nbtrain.control.runs.follow import FollowStopped
from nbtrain.control.runs.follow import follow as follow_run
from nbtrain.control.runs.metrics import DEFAULT_CAP, MetricsTail
from nbtrain.control.runs.run import Run, RunStatus
from nbtrain.ui.figures import (
    STATE_COLORS,
    Frame,
    MemoryLine,
    TraceSpec,
    add_traces,
    apply_chrome,
    build_figure,
    chrome,
    empty_figure,
    header_text,
    make_frame,
    memory_line,
    panels_of,
    progress,
    throughput_top,
    trace_specs,
)

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# A live figure's data goes at most at this many points a second (every changed trace is sent whole: a
# 4,000-step history is ~20,000 points, 1 MB of JSON); the title and progress still move every tick. The
# browser and the kernel both keep up with a long run on a busy machine instead of falling behind.
POINTS_PER_S = 20_000
REVIVE_EVERY = 2.0  # s between status reads of the runs whose ended views may come back to life
REVIVABLE = ("stopped", "failed")  # final states a run leaves when it is resumed
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# nbtrain's lab extension renders this (labextension/src/runview.ts), ranked above plotly: a view that
# follows the run through the server extension, for when the cell's kernel is gone. Other frontends show the
# plotly JSON or the HTML beside it.
RUN_VIEW_MIME = "application/vnd.nbtrain.run-view+json"
# The lab extension (labextension/src/kernellost.ts) puts this class on the output that holds a live widget's
# mark once the notebook's kernel restarted, died or was shut down: ipywidgets 8 keeps drawing the widget
# as it last was, so the dashboard's own style then hides it and shows the snapshot, the live view without
# a kernel, in its place.
KERNEL_LOST_CLASS = "nbtrain-kernel-lost"


def static_bundle(fig: go.Figure, text: str, header_html: str = "") -> dict[str, Any]:
    """A display bundle for a figure that needs no kernel: plotly JSON (JupyterLab, VS Code) and HTML
    that loads plotly.js from its CDN (nbconvert, other viewers)."""
    fig_html = pio.to_html(fig, include_plotlyjs="cdn", full_html=False, config={"displaylogo": False})
    return {
        PLOTLY_MIME: {**json.loads(fig.to_json()), "config": {"displaylogo": False}},
        "text/html": header_html + fig_html,
        "text/plain": text,
    }


def snapshot_note(now: float | None = None) -> str:
    """What a live run's static picture adds to its header: when it was taken. The notebook's kernel
    replaces it every few seconds; after a reload without the kernel, or once the kernel is gone, it stays,
    and says how old it is."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    return f"<span style='color:#6b7280'>· snapshot at {stamp}</span>"


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
        estimate: MemoryLine | None = None
        if estimate_bytes is not None:
            estimate = memory_line(float(estimate_bytes))
        else:
            try:
                estimate = memory_line(run.resolved.get("estimate"))
            except RunNotFound:
                estimate = None  # a run being created: no resolved.json yet, so no estimate
        self.estimate = estimate
        self.extra = tuple(extra)
        self.widget = widget
        self.error: str | None = None
        self.status: RunStatus | None = None
        self.updates = 0  # figure data updates sent, for tests and diagnostics
        self.finished = False

        self.fig: go.FigureWidget | None = None
        self._panels: tuple[str, ...] = ()  # the extra panels self.fig was made with
        self.notes: widgets.HTML | None = None  # under the figure: the output folder, an error's log tail
        self.box: widgets.VBox | None = None
        self._index: dict[tuple[str, ...], int] = {}
        self._versions: dict[tuple[str, ...], Any] = {}
        self._chrome: dict[str, Any] | None = None

        self._out: CellOutput | None = None  # the widget, then the final static figure
        self._snap: CellOutput | None = None  # while live: the static snapshot shown without the widget
        self._guard: CellOutput | None = None  # while live: the style that hides a widget not drawn
        self._uid = uuid.uuid4().hex[:12]
        self._shown = False
        self._static_sig: tuple[Any, ...] | None = None
        self._static_at = 0.0
        self._unseen_sync_at = 0.0
        self._data_due = 0.0  # when the figure's data may be sent again (POINTS_PER_S)
        # refresh() runs in the thread or in follow(); the lock keeps a stray second caller from
        # interleaving two updates of the same widgets
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    # ------------------------------------------------------------------------------------ updating
    def refresh(self) -> RunStatus:
        """Read what is new and update the view; returns the run's status. Safe to call any time."""
        with self._lock:
            st = self._read()
            if self.widget and not self.finished:
                self._update_widgets(st)
                if self._snap is not None and not self._ended(st):
                    self._update_static(st, self._snap)
            elif not self.widget and self._out is not None and not self._ended(st):
                self._update_static(st, self._out)
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

    def _frame(self) -> Frame:
        return make_frame(self.tail, self.estimate, self.extra)

    def _new_figure(self, st: RunStatus) -> go.FigureWidget:
        # made whole before it is published: the thread and a reader never see a figure without its traces
        self._panels = panels_of(self.tail, self.extra)
        fig = go.FigureWidget(empty_figure(self._panels))
        self._index, self._versions, self._chrome = {}, {}, None
        self._update_figure(fig, st)
        return fig

    def _build_widgets(self, st: RunStatus) -> None:
        fig = self._new_figure(st)
        self.notes = widgets.HTML(value=self._live_css() + self._notes_html(st))
        self.box = widgets.VBox([fig, self.notes])
        self.fig = fig

    def _update_widgets(self, st: RunStatus) -> None:
        if self.fig is None:
            self._build_widgets(st)
            return
        assert self.notes is not None and self.box is not None
        if panels_of(self.tail, self.extra) != self._panels:
            # a metric of the notebook's hooks: compute_metrics appeared: a figure with its panel
            old, self.fig = self.fig, self._new_figure(st)
            self.box.children = (self.fig, self.notes)
            old.close()
            self._sync_unseen(self.fig, force=True)
        else:
            self._update_figure(self.fig, st)
        value = self._live_css() + self._notes_html(st)
        if value != self.notes.value:
            self.notes.value = value

    def _update_figure(self, fig: go.FigureWidget, st: RunStatus) -> None:
        frame = self._frame()
        specs = trace_specs(frame)
        new = [s for s in specs if s.key not in self._index]
        if new:
            # Adding traces cannot happen inside batch_update, and plotly sends each as a message of its
            # own: they are added empty and hidden, and get their data in the one update below with every
            # other trace's, so a view never draws one panel a poll ahead of another (an evaluation's
            # point before the loss reached its step).
            first = len(fig.data)
            add_traces(fig, frame, new, empty=True)
            for i, spec in enumerate(new):
                self._index[spec.key] = first + i
        added = {s.key for s in new}
        changed: list[TraceSpec] = [
            s for s in specs if s.key in added or s.version(frame) != self._versions[s.key]
        ]
        now, sent = time.monotonic(), 0
        if changed and not added and not st.done and now < self._data_due:
            changed = []  # paced: left changed, so a later tick sends them (the title still moves now)
        # the title (elapsed, ETA), the progress bar, the message before the first step
        p = progress(self.tail, st, clk=frame.clock)
        top = throughput_top(self.tail)
        look = chrome(fig, p, self.run.name, estimate=self.estimate, throughput_top=top)
        look_changed = look != self._chrome
        if changed or look_changed:
            with fig.batch_update():
                for spec in changed:
                    trace = fig.data[self._index[spec.key]]
                    d = spec.data(frame)
                    sent += len(d["x"])
                    trace.x, trace.y = d["x"], d["y"]
                    if trace.mode != (mode := spec.mode(len(d["x"]))):
                        trace.mode = mode
                    if "customdata" in d:
                        trace.customdata = d["customdata"]
                    if spec.key in added and spec.visible:
                        trace.visible = True  # the panel's own controls decide it from now on
                    self._versions[spec.key] = spec.version(frame)
                if look_changed:
                    apply_chrome(fig, look)
                    # the step the header shows, for the lab extension: a view whose kernel is lost says
                    # it stopped there (labextension/src/runview.ts)
                    fig.layout.meta = {"nbtrain_step": p.step}
                    self._chrome = look
        if new or changed:
            self.updates += 1  # data sent (the title's clock ticks on its own)
            self._data_due = now + sent / POINTS_PER_S
        if new or changed or look_changed:
            self._sync_unseen(fig)

    def _sync_unseen(self, fig: go.FigureWidget | None, *, force: bool = False) -> None:
        """Keep the figure's widget state current, not only its views.

        Plotly sends trace updates as messages to the views that exist; a view created later (the
        frontend is still loading the widget code, a slow machine, a notebook reopened) draws the widget
        *state*, which is what the figure was made with, and that state is also what JupyterLab saves with
        the notebook and restores on reopening. So the full state is re-sent: at most once a second until
        the frontend reports a view (``_view_count``), then every ``static_interval`` seconds (plotly's
        views ignore a change of that state: nothing is redrawn), so a notebook saved mid-run reopens with
        a figure as recent as its static snapshot.
        """
        if fig is None:
            return
        now = time.monotonic()
        every = self.static_interval if getattr(fig, "_view_count", None) else 1.0
        if force or now - self._unseen_sync_at >= every:
            fig._widget_layout = copy.deepcopy(fig._layout_obj._props)
            fig._widget_data = copy.deepcopy(fig._data)
            self._unseen_sync_at = now

    def _update_static(self, st: RunStatus, out: CellOutput) -> None:
        sig = (self.tail.version, st.state, st.step, st.max_steps)
        now = time.monotonic()
        if sig != self._static_sig and now - self._static_at >= self.static_interval:
            out.update(self._static(st))
            self._static_sig, self._static_at = sig, now
            self.updates += 1

    # ---------------------------------------------------------------------------------- rendering
    def _live_css(self) -> str:
        """In the notes widget, so only while the widget is drawn and its kernel not lost: hide the snapshot
        after its output."""
        mark = f"nbtrain-live-{self._uid}"
        return (
            f"<style>.jp-OutputArea-child:has(.{mark}):not(.{KERNEL_LOST_CLASS}) + .jp-OutputArea-child "
            f"{{display: none}}</style><span class='nbtrain-live {mark}'></span>"
        )

    def _guard_bundle(self) -> dict[str, Any]:
        """Saved with the notebook: hide the widget's output (two before this one) while it holds no
        drawn widget, or one whose kernel is lost, so the snapshot between them is what shows, not 'model
        not found' nor a widget frozen as its kernel last drew it."""
        mark = f"nbtrain-guard-{self._uid}"
        widget_out = (
            f".jp-OutputArea-child:is(:not(:has(.nbtrain-live-{self._uid})), .{KERNEL_LOST_CLASS})"
            f":has(+ .jp-OutputArea-child + .jp-OutputArea-child .{mark})"
        )
        return {
            "text/html": f"<style>{widget_out} {{display: none}}</style><span class='{mark}'></span>",
            "text/plain": "",
        }

    def _static(self, st: RunStatus) -> dict[str, Any]:
        fig = build_figure(self.tail, st, estimate=self.estimate, name=self.run.name, extra=self.extra)
        if not st.done:  # a picture of a run that goes on: seen without the kernel, it says when it was taken
            fig.layout.title.text = f"{fig.layout.title.text} {snapshot_note()}"
        notes = self._notes_html(st)
        bundle = static_bundle(fig, self.text(st), notes)
        if not st.done:  # the picture of a run that goes on: seen without its kernel, a live view instead
            # (the state, step and phase: what the view shows until it has read the run itself)
            bundle[RUN_VIEW_MIME] = {
                **self._run_ref(),
                "view": self._uid,  # the widget it stands in for: its mark, nbtrain-live-<view>
                "state": st.state,
                "step": st.step,
                "max_steps": st.max_steps,
                "phase": progress(self.tail, st).waiting(),
                "taken_at": time.time(),
            }
        return bundle

    def _watch_bundle(self, st: RunStatus) -> dict[str, Any]:
        """Under the final figure of a stopped or failed run, which may be resumed from anywhere: empty
        while the run is as the figure shows it; a live view in its place once it went on without this
        kernel (which revives the view itself while it lives)."""
        if st.state not in REVIVABLE:
            return {"text/html": "", "text/plain": ""}
        watch = {"state": st.state, "step": st.step}
        return {RUN_VIEW_MIME: {**self._run_ref(), "watch": watch}, "text/html": "", "text/plain": ""}

    def _run_ref(self) -> dict[str, str]:
        """What names the run in a ``RUN_VIEW_MIME`` output."""
        return {"run_id": self.run.id, "name": self.run.name}

    def text(self, st: RunStatus | None = None) -> str:
        st = st or self.status or self.run.status()
        text = f"{self.run.id}: " + header_text(progress(self.tail, st))
        if self.error:
            text += f"\nlive view stopped by an error:\n{self.error}"
        return text

    def _notes_html(self, st: RunStatus) -> str:
        """What the figure does not say: where the output is, an error's log tail, a view that broke."""
        out = ""
        if st.state == "completed":
            out += f"<div>output: <code>{html.escape(str(self.run.output_dir))}</code></div>"
        if st.error:
            tail = st.error.get("log_tail") or self.run.logs(20)
            color = STATE_COLORS["failed"]
            out += (
                f"<div style='color:{color}'>{html.escape(str(st.error.get('type', 'error')))}: "
                f"{html.escape(str(st.error.get('message', '')))}</div>"
                f"<details><summary>log tail</summary><pre>{html.escape(tail)}</pre></details>"
            )
        if self.error:
            out += (
                f"<pre style='color:{STATE_COLORS['failed']};white-space:pre-wrap'>live view stopped by an "
                f"error:\n{html.escape(self.error)}</pre>"
            )
        return f"<div class='nbtrain-dashboard' style='font-size:12px'>{out}</div>" if out else ""

    # ------------------------------------------------------------------------------------ showing
    def show(self, *, background: bool = True) -> None:
        """Display the dashboard in the current cell and (by default) keep it updated from a thread."""
        with self._lock:
            st = self._read()
            self._shown = True
            if self._ended(st) or not self.widget:
                self._out = CellOutput(self._static(st))
                self._static_sig = (self.tail.version, st.state, st.step, st.max_steps)
                self._static_at = time.monotonic()
                if self._ended(st):
                    if st.state in REVIVABLE:
                        self._snap = CellOutput(self._watch_bundle(st))
                    self.finished = True
                    self._close_widgets()
                    self._watch_for_restart(st)
                    return
            else:
                self._update_widgets(st)
                self._sync_unseen(self.fig, force=True)
                self._out = CellOutput({**self._widget_bundle(), "text/plain": self.text(st)})
                self._snap = CellOutput(self._static(st))
                self._static_sig = (self.tail.version, st.state, st.step, st.max_steps)
                self._static_at = time.monotonic()
                self._guard = CellOutput(self._guard_bundle())
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

    def _follow(self, timeout: float | None = None, stop: threading.Event | None = None) -> RunStatus:
        """Refresh until the run ended and its whole history is read (at once while behind on it)."""
        return follow_run(
            self.refresh,
            ended=self._ended,
            timeout=timeout,
            interval=self.interval,
            stop=stop,
            behind=lambda: not self.tail.caught_up,
            what=f"run {self.run.id}",
        )

    def _loop(self) -> None:
        try:
            st = self._follow(stop=self._stop)
            self._finish(st)
        except FollowStopped:
            return
        except Exception:  # noqa: BLE001 - a thread's exception is otherwise lost: shown in the view
            self._fail(traceback.format_exc())

    def _finish(self, st: RunStatus) -> None:
        """After the final widget update: leave a static figure of the final state in the output."""
        with self._lock:
            if self._out is not None:
                # the guard and the snapshot first: the guard hides an output without a live widget, so
                # the other way round the final figure would be hidden until the guard's update came
                if self._guard is not None:
                    self._guard.update({"text/html": "", "text/plain": ""})
                if self._snap is not None:
                    self._snap.update(self._watch_bundle(st))
                self._out.update(self._static(st))
                self._close_widgets()
            self.finished = True
            self._watch_for_restart(st)

    def _watch_for_restart(self, st: RunStatus) -> None:
        if self._out is not None and st.state in REVIVABLE and not self._closed:
            REVIVALS.add(self)

    def revive(self) -> bool:
        """The run is active again (resumed): turn this ended view live in place and follow the new
        attempt. False when it is not (still ended, closed, or never shown)."""
        with self._lock:
            if not self.finished or self._out is None or self._closed:
                return False
            st = self._read()
            if st.done:
                return False
            self.finished = False
            if self.widget:
                self.fig = None  # new widgets: the old ones were closed when the view ended
                self._update_widgets(st)
                self._sync_unseen(self.fig, force=True)
                self._out.update({**self._widget_bundle(), "text/plain": self.text(st)})
                if self._snap is not None:
                    self._snap.update(self._static(st))
                if self._guard is not None:
                    self._guard.update(self._guard_bundle())
            else:
                self._update_static(st, self._out)
                if self._snap is not None:  # the watch: this kernel follows the run again
                    self._snap.update({"text/html": "", "text/plain": ""})
        self.start()
        return True

    def _fail(self, tb: str) -> None:
        self.error = tb
        try:
            st = self.status or RunStatus(state="queued")
            if self.notes is not None:
                self.notes.value = self._notes_html(st)
            elif self._out is not None:
                self._out.update({"text/html": self._notes_html(st), "text/plain": self.text(st)})
        except Exception:  # noqa: BLE001 - the view itself is broken: the kernel's stderr is what is left
            print(f"nbtrain dashboard of {self.run.id} failed:\n{tb}", file=sys.__stderr__)

    def _close_widgets(self) -> None:
        # the output shows the static figure now; closing frees the models in kernel and frontend
        for w in (self.box, self.fig, self.notes):
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
        try:
            st = self._follow(timeout)
            self._finish(st)
        except (KeyboardInterrupt, TimeoutError):
            self.start()
            raise
        except Exception:
            self._fail(traceback.format_exc())
            raise
        return st

    def _stop_thread(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)

    def close(self) -> None:
        """Stop updating (the view stays as it is), also when its run starts again."""
        self._closed = True
        self._stop_thread()


class Revivals:
    """The ended views whose runs may start again, and the one thread that reads those runs' status every
    ``REVIVE_EVERY`` seconds (a view is held weakly: one the kernel dropped is forgotten). A view whose run
    is active again is revived and leaves the list; a revived view that ends stopped or failed joins it
    again."""

    def __init__(self, every: float = REVIVE_EVERY) -> None:
        self.every = every
        self._views: list[weakref.ref[Dashboard]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, view: Dashboard) -> None:
        with self._lock:
            if not any(ref() is view for ref in self._views):
                self._views.append(weakref.ref(view))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="nbtrain-revivals", daemon=True)
                self._thread.start()

    def watched(self) -> list[Dashboard]:
        with self._lock:
            return [v for v in (ref() for ref in self._views) if v is not None]

    def _loop(self) -> None:
        while True:
            time.sleep(self.every)
            with self._lock:
                views = [v for v in (ref() for ref in self._views) if v is not None and not v._closed]
                self._views = [weakref.ref(v) for v in views]
                if not views:
                    self._thread = None
                    return
            for view in views:
                try:
                    if view.run.status().done:
                        continue
                except Exception:  # noqa: BLE001 - one unreadable run never stops the others' watch
                    continue
                with self._lock:  # it leaves the list as it turns live (it comes back if it ends again)
                    self._views = [ref for ref in self._views if ref() is not view]
                try:
                    revived = view.revive()
                except Exception:  # noqa: BLE001 - shown nowhere better: the view stays as it was
                    revived = False
                if not revived and view.finished and not view._closed:
                    self.add(view)  # it ended again before it could turn live: still watched


REVIVALS = Revivals()
