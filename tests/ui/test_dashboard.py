"""The live Dashboard: one thread updating a FigureWidget from the run directory."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from nbtrain.ui.dashboard import (
    KERNEL_LOST_CLASS,
    PLOTLY_MIME,
    POINTS_PER_S,
    RUN_VIEW_MIME,
    WIDGET_MIME,
    Dashboard,
)
from nbtrain.ui.figures import FIGURE_WIDTH, STATE_COLORS
from tests.control.runs.test_metrics import RunFiles

TIMEOUT = 10.0


def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def wait_until(get: Callable[[], Any], expected: Any, timeout: float = TIMEOUT) -> None:
    """Wait until ``get()`` is ``expected``: the whole state a test asserts, read together. The thread sets a
    figure's traces and layout one property at a time (plotly applies an update so in Python, and sends it
    to the views as one message), so a reader on another thread can see one part set before the next."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = get()
        except (AssertionError, StopIteration):  # no figure, or not that trace, yet
            got = None
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert got == expected


def figure(dash: Dashboard) -> Any:
    assert dash.fig is not None
    return dash.fig


def curves(dash: Dashboard, *names: str) -> dict[str, tuple[list[float], list[float]]]:
    """The drawn (x, y) of these metrics' traces."""
    return {n: (list(trace(dash, n).x), list(trace(dash, n).y)) for n in names}


def _points(rows: list[dict[str, Any]], *names: str) -> dict[str, tuple[list[float], list[float]]]:
    return {n: ([r["step"] for r in rows], [r[n] for r in rows]) for n in names}


def trace(dash: Dashboard, name: str, kind: str = "metric") -> Any:
    """The widget's trace of metric ``name`` (found by its key, as tools would)."""
    assert dash.fig is not None
    return next(t for t in dash.fig.data if tuple(t.meta) == (kind, name))


def title(dash: Dashboard) -> str:
    assert dash.fig is not None
    return str(dash.fig.layout.title.text)


def bar(dash: Dashboard) -> Any:
    """The progress bar under the title."""
    assert dash.fig is not None
    return next(s for s in dash.fig.layout.shapes if s.name == "progress")


class FakeHandle:
    # every update of every handle, in the order sent
    sent: ClassVar[list[tuple[FakeHandle, dict[str, Any]]]] = []

    def __init__(self, bundle: dict[str, Any]) -> None:
        self.bundles = [bundle]

    def update(self, bundle: dict[str, Any], raw: bool = False, metadata: Any = None) -> None:
        assert raw
        self.bundles.append(bundle)
        FakeHandle.sent.append((self, bundle))


@pytest.fixture
def displayed(monkeypatch: pytest.MonkeyPatch) -> list[FakeHandle]:
    """What the dashboard displays, as a frontend would receive it (display and update_display)."""
    handles: list[FakeHandle] = []
    FakeHandle.sent.clear()

    def display(
        bundle: dict[str, Any], raw: bool = False, display_id: bool = False, metadata: Any = None
    ) -> FakeHandle:
        assert raw and display_id
        json.dumps(bundle)  # a display bundle must be JSON: numpy arrays would break the kernel's send
        handles.append(FakeHandle(bundle))
        return handles[-1]

    monkeypatch.setattr("IPython.display.display", display)
    return handles


@pytest.fixture
def files(tmp_path: Path) -> Iterator[RunFiles]:
    f = RunFiles(tmp_path / "run1", name="live-demo", max_steps=40)
    yield f
    f.close()


@pytest.fixture
def dash(files: RunFiles) -> Iterator[Dashboard]:
    d = Dashboard(files.run, interval=0.02)
    yield d
    d.close()


def test_thread_updates_the_figure_widget_as_lines_are_appended(files: RunFiles, dash: Dashboard) -> None:
    first = files.steps(1, 6)
    dash.start()
    wait_for(lambda: dash.fig is not None, timeout=60)  # a process's first figure loads plotly's validators
    wait_until(lambda: curves(dash, "loss", "lr"), _points(first, "loss", "lr"))
    more = files.steps(6, 11)
    wait_until(lambda: curves(dash, "loss", "lr"), _points(first + more, "loss", "lr"))
    # series that appear later get traces of their own
    files.sample(0, 11.0, gpu_mem_peak=2.0 * 2**30)
    files.step(11, eval_loss=1.25)
    wait_until(lambda: curves(dash, "eval_loss")["eval_loss"], ([11], [1.25]))
    peak = ("memory", "0", "gpu_mem_peak")
    wait_until(lambda: [(t.name, t.visible, len(t.x)) for t in figure(dash).data if tuple(t.meta) == peak],
               [("GPU peak", True, 1)])  # fmt: skip
    wait_until(lambda: ("step 11/40" in title(dash), round(bar(dash).x1, 9)), (True, round(11 / 40, 9)))
    assert dash.error is None


class ViewReplica:
    """What a browser view of a FigureWidget draws: the widget's state when the view is made, then each
    message plotly sends it (addTraces, and restyle / update as one Plotly call), applied as plotly.js
    applies them. ``seen`` is the view's traces after every message, by key."""

    def __init__(self, fig: Any) -> None:
        self.traces = [dict(t) for t in fig._widget_data]
        self.seen: list[dict[tuple[str, ...], dict[str, Any]]] = []
        fig.observe(self._message, names=["_py2js_addTraces", "_py2js_restyle", "_py2js_update"])

    def _message(self, change: dict[str, Any]) -> None:
        msg = change["new"]
        if msg is None:  # plotly sets the message, then None
            return
        if change["name"] == "_py2js_addTraces":
            self.traces += [dict(t) for t in msg["trace_data"]]
        else:
            style = msg["restyle_data"] if "restyle_data" in msg else msg["style_data"]
            indexes = msg["restyle_traces"] if "restyle_data" in msg else msg["style_traces"]
            for key, value in (style or {}).items():
                for i, index in enumerate(indexes):
                    self.traces[index][key] = value[i % len(value)] if isinstance(value, list) else value
        self.seen.append({tuple(t["meta"]): dict(t) for t in self.traces})


def _drawn_steps(trace: dict[str, Any]) -> list[float]:
    return [] if trace.get("visible", True) is False else [float(x) for x in trace.get("x", [])]


def test_a_view_draws_each_poll_whole_never_one_panel_ahead_of_another(
    files: RunFiles, dash: Dashboard
) -> None:
    files.steps(1, 4)
    dash.refresh()
    assert dash.fig is not None
    view = ViewReplica(dash.fig)
    # one poll brings more steps to every panel and the first evaluation, whose trace is new
    files.steps(4, 8)
    files.step(8, eval_loss=1.25)
    dash.refresh()
    assert view.seen, "the view got no message"
    for traces in view.seen:
        loss = _drawn_steps(traces[("metric", "loss")])
        for key, trace in traces.items():
            steps = _drawn_steps(trace)
            if key[0] == "metric" and key[1] != "eval_loss":
                assert steps == loss, f"{key} draws steps {steps}, the loss {loss}"
            elif key == ("metric", "eval_loss") and steps:
                assert max(steps) <= max(loss), f"the eval loss at step {max(steps)}, the loss at {max(loss)}"
    last = view.seen[-1]
    assert _drawn_steps(last[("metric", "loss")]) == list(range(1, 9))
    assert _drawn_steps(last[("metric", "eval_loss")]) == [8.0] and list(
        last[("metric", "eval_loss")]["y"]
    ) == [1.25]


def test_a_metric_of_the_notebooks_compute_metrics_gets_its_panel_when_it_first_appears(
    files: RunFiles, dash: Dashboard
) -> None:
    files.steps(1, 4)
    dash.refresh()
    first = dash.fig
    assert first is not None and dash.box is not None and len(first.layout.annotations) > 0
    files.step(4, eval_loss=1.5, eval_exact=0.5, notebook_metrics=["eval_exact"])
    dash.refresh()
    # a figure with one more panel, in the same place of the view; the old one is closed
    assert dash.fig is not first and dash.box.children[0] is dash.fig and first.comm is None
    assert list(trace(dash, "eval_exact").y) == [0.5] and list(trace(dash, "loss").x) == [1, 2, 3, 4]
    assert dash.fig.layout.height > first.layout.height
    files.step(5)
    files.step(6, eval_loss=1.4, eval_exact=0.75, notebook_metrics=["eval_exact"])
    kept = dash.fig
    dash.refresh()
    assert dash.fig is kept and list(trace(dash, "eval_exact").y) == [0.5, 0.75]


def _synced_loss(dash: Dashboard) -> list[float]:
    """The loss values in the state a browser view created now would draw (plotly's _widget_data)."""
    assert dash.fig is not None
    data = dash.fig._widget_data
    return next((list(t["y"]) for t in data if tuple(t.get("meta", ())) == ("metric", "loss")), [])


def test_a_view_created_late_or_a_notebook_reopened_draws_recent_data_not_the_initial_state(
    files: RunFiles, dash: Dashboard
) -> None:
    # No browser has drawn the widget yet (_view_count 0): updates sent as messages reach no view, so the
    # state a late view starts from must follow the data.
    dash.start()
    wait_for(lambda: dash.fig is not None)
    files.steps(1, 6)
    wait_for(lambda: len(_synced_loss(dash)) == 5, timeout=5.0)
    assert dash.fig is not None and dash.fig._view_count == 0
    # Once a view exists it receives the updates itself: the full state is re-sent only every
    # static_interval (5 s), for a notebook saved now and reopened later.
    dash.fig._view_count = 1
    files.steps(6, 9)
    wait_for(lambda: len(trace(dash, "loss").x) == 8)
    time.sleep(1.2)
    assert len(_synced_loss(dash)) == 5
    wait_for(lambda: len(_synced_loss(dash)) == 8, timeout=dash.static_interval + 2)


def test_before_the_first_step_the_widget_shows_the_phase_then_the_charts(
    files: RunFiles, dash: Dashboard
) -> None:
    files.status("starting", phase="loading model")
    dash.start()
    wait_for(lambda: dash.fig is not None and any(a.name == "phase" for a in dash.fig.layout.annotations))
    assert dash.fig is not None
    (phase,) = [a for a in dash.fig.layout.annotations if a.name == "phase"]
    assert "loading model" in phase.text and dash.fig.layout.xaxis.visible is False
    assert "starting" in title(dash) and "loading model" in title(dash)
    files.status("running", step=2, max_steps=40)
    files.steps(1, 3)
    wait_until(
        lambda: (len(trace(dash, "loss").x), any(a.name == "phase" for a in figure(dash).layout.annotations),
                 figure(dash).layout.xaxis.visible, "step 2/40" in title(dash)),
        (2, False, True, True),
    )  # fmt: skip


def test_the_live_figure_and_the_static_one_it_turns_into_have_one_size(
    files: RunFiles, dash: Dashboard, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 6)
    dash.show()
    assert dash.fig is not None
    live = dash.fig.layout
    files.status("completed", step=5)
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    static = displayed[0].bundles[-1][PLOTLY_MIME]["layout"]
    # set, not left to the frontend (a widget is drawn 700 px wide, a static figure as wide as its output)
    assert (static["height"], static["width"]) == (live.height, live.width) == (796, FIGURE_WIDTH)
    assert static["margin"] == live.margin.to_plotly_json()
    assert static["title"]["y"] == live.title.y  # the same header in the same place, title and bar
    assert static["template"] == live.template.to_plotly_json()


def test_no_update_is_sent_while_nothing_changes(files: RunFiles, dash: Dashboard) -> None:
    files.steps(1, 4)
    dash.start()
    wait_for(lambda: dash.fig is not None and len(trace(dash, "loss").x) == 3)
    dash.refresh()  # waits for the thread's poll that drew them to count its update; itself sees nothing new
    updates = dash.updates
    time.sleep(0.3)  # ~15 polls
    assert dash.updates == updates


def test_a_long_history_is_sent_at_a_paced_rate_while_the_title_follows_every_step(
    files: RunFiles, dash: Dashboard
) -> None:
    # 3,000 steps: each trace 3,000 points, ~18,000 in all, so the next data waits ~0.9 s; a view that
    # re-sent them every tick fell seconds behind a fast run on a busy machine (the browser test saw it)
    files.steps(1, 3001)
    dash.refresh()
    sent, started = dash.updates, time.monotonic()
    points = sum(len(t.x) for t in figure(dash).data)
    for i in range(3001, 3011):
        files.steps(i, i + 1)
        dash.refresh()
        assert figure(dash).layout.meta["nbtrain_step"] == i  # the title: at once
    if time.monotonic() - started < points / POINTS_PER_S:  # (a machine too busy to tell otherwise)
        assert dash.updates == sent  # the curves: not yet
        assert len(trace(dash, "loss").x) == 3000
    time.sleep(max(0.0, started + points / POINTS_PER_S - time.monotonic()) + 0.05)
    dash.refresh()
    assert dash.updates == sent + 1
    assert list(trace(dash, "loss").x)[-1] == 3010
    # the run's end is drawn at once, whatever the pace
    files.steps(3011, 3012)
    files.status("completed", step=3011)
    dash.refresh()
    assert list(trace(dash, "loss").x)[-1] == 3011


@pytest.mark.parametrize(
    ("state", "error", "color"),
    [
        ("completed", None, STATE_COLORS["completed"]),
        (
            "failed",
            {"type": "OutOfMemoryError", "message": "CUDA out of memory", "log_tail": "Traceback…"},
            STATE_COLORS["failed"],
        ),
        ("stopped", None, STATE_COLORS["stopped"]),
    ],
)
def test_thread_stops_after_a_final_update_when_the_run_ends(
    files: RunFiles, dash: Dashboard, state: str, error: dict[str, Any] | None, color: str
) -> None:
    files.steps(1, 6)
    dash.start()
    wait_for(lambda: dash.fig is not None and len(trace(dash, "loss").x) == 5)
    # the last lines come right before the final state, as a worker writes them
    files.steps(6, 9)
    files.status(state, step=8, error=error)
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    assert not dash.thread.is_alive()
    assert dash.finished and dash.error is None
    assert len(trace(dash, "loss").x) == 8
    assert state in title(dash) and "step 8/40" in title(dash)
    assert bar(dash).fillcolor == color and bar(dash).x1 == pytest.approx(8 / 40)
    assert dash.notes is not None
    if error:
        assert "CUDA out of memory" in dash.notes.value and "Traceback…" in dash.notes.value


def test_an_error_in_the_update_thread_is_shown_in_the_header_and_kept(
    files: RunFiles, dash: Dashboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    files.steps(1, 3)
    dash.refresh()
    calls = 0
    real = dash.tail.poll

    def poll(max_bytes: int | None = None) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("disk went away")
        return real(max_bytes)

    monkeypatch.setattr(dash.tail, "poll", poll)
    dash.start()
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    assert not dash.thread.is_alive()
    assert dash.error is not None and "RuntimeError: disk went away" in dash.error
    assert dash.notes is not None
    assert "live view stopped by an error" in dash.notes.value and "disk went away" in dash.notes.value


def test_follow_blocks_until_the_run_ends_and_returns_its_final_status(
    files: RunFiles, dash: Dashboard, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 3)

    def worker() -> None:
        time.sleep(0.2)
        files.steps(3, 21)
        files.status("completed", step=20)

    t = threading.Thread(target=worker)
    t.start()
    st = dash.follow(timeout=TIMEOUT)
    t.join()
    assert st.state == "completed"
    assert dash.thread is None  # all of it ran in the foreground
    assert len(trace(dash, "loss").x) == 20
    final = displayed[0].bundles[-1]
    assert WIDGET_MIME not in final
    assert "completed" in final["text/plain"]


def test_follow_timeout_raises_and_leaves_the_view_live(
    files: RunFiles, dash: Dashboard, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 3)
    with pytest.raises(TimeoutError, match="still running"):
        dash.follow(timeout=0.1)
    assert dash.thread is not None and dash.thread.is_alive()
    files.steps(3, 5)
    wait_for(lambda: len(trace(dash, "loss").x) == 4)
    files.status("completed", step=4)
    dash.thread.join(TIMEOUT)
    assert dash.finished


def test_close_stops_the_thread(files: RunFiles, dash: Dashboard) -> None:
    dash.start()
    wait_for(lambda: dash.fig is not None)
    dash.close()
    assert dash.thread is not None and not dash.thread.is_alive()
    files.steps(1, 3)
    time.sleep(0.1)
    assert len(trace(dash, "loss").x) == 0


def test_show_displays_the_widget_with_a_static_snapshot_then_leaves_a_static_final_figure(
    files: RunFiles, dash: Dashboard, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 4)
    dash.show()
    handle, snap, guard = displayed  # the widget, the snapshot shown without it, the style between
    first = handle.bundles[0]
    assert dash.box is not None
    assert first[WIDGET_MIME]["model_id"] == dash.box.model_id and PLOTLY_MIME not in first
    assert PLOTLY_MIME in snap.bundles[0] and WIDGET_MIME not in snap.bundles[0]
    # seen without the kernel (a reload, a restart), the picture of the running run says when it was taken
    assert "snapshot at " in snap.bundles[0][PLOTLY_MIME]["layout"]["title"]["text"]
    # and it names the run, so the lab extension shows it live from the run directory once the kernel is gone
    view = snap.bundles[0][RUN_VIEW_MIME]
    assert (view["run_id"], view["name"], view["state"]) == (files.run.id, files.run.name, "running")
    assert isinstance(view["step"], int) and view["max_steps"] == files.run.status().max_steps
    assert abs(view["taken_at"] - time.time()) < 60
    assert "<style>" in guard.bundles[0]["text/html"] and "nbtrain-live-" in dash.notes.value
    # it names the widget it stands in for by its mark, whose figure carries the step its header shows (a
    # view whose kernel is lost says where it stopped); once the lab extension marks that output's kernel
    # lost, neither style counts the widget as drawn
    assert f"nbtrain-live nbtrain-live-{view['view']}'" in dash.notes.value
    shown = re.search(r"step (\d+)", dash.fig.layout.title.text)
    assert shown and dash.fig.layout.meta == {"nbtrain_step": int(shown[1])}
    assert f":not(.{KERNEL_LOST_CLASS})" in dash.notes.value
    assert f", .{KERNEL_LOST_CLASS})" in guard.bundles[0]["text/html"]
    files.steps(4, 8)
    files.status("completed", step=7)
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    final = handle.bundles[-1]
    assert WIDGET_MIME not in final
    loss = next(t for t in final[PLOTLY_MIME]["data"] if t["name"] == "loss")
    assert loss["x"]["dtype"] == "f8"  # plotly's typed-array encoding
    assert "completed" in final[PLOTLY_MIME]["layout"]["title"]["text"]
    assert "snapshot at" not in final[PLOTLY_MIME]["layout"]["title"]["text"]  # the final state: no time
    assert RUN_VIEW_MIME not in final  # completed: nothing more can happen to it, the figure is the view
    assert "cdn.plot.ly" in final["text/html"]
    assert snap.bundles[-1]["text/html"] == guard.bundles[-1]["text/html"] == ""
    # and the final figure is never hidden on its way: the guard (which hides an output holding no live
    # widget) and the snapshot are emptied before the widget's output turns static, not after
    ending = [h for h, _ in FakeHandle.sent[-3:]]
    assert ending == [guard, snap, handle], ending
    # the widgets are closed: their models are freed in the kernel and the frontend
    assert dash.fig is not None and dash.fig.comm is None and dash.box.comm is None
    assert len(trace(dash, "loss").x) == 7


def test_show_of_a_finished_run_displays_only_a_static_figure(
    files: RunFiles, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 6)
    files.status("completed", step=5)
    dash = Dashboard(files.run)
    dash.show()
    (handle,) = displayed
    assert WIDGET_MIME not in handle.bundles[0] and PLOTLY_MIME in handle.bundles[0]
    assert dash.thread is None and dash.fig is None
    assert dash.follow().state == "completed"


def test_showing_a_long_finished_run_returns_at_once_and_loads_it_in_the_background(
    files: RunFiles, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 2001)
    files.status("completed", step=2000)
    dash = Dashboard(files.run, interval=0.02, chunk_bytes=20_000)
    dash.show()
    handle = displayed[0]
    assert WIDGET_MIME in handle.bundles[0]  # still loading: live until the history is complete
    assert 0 < len(trace(dash, "loss").x) < 2000
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    assert dash.finished and dash.error is None
    assert len(trace(dash, "loss").x) == 2000
    assert WIDGET_MIME not in handle.bundles[-1]


def test_static_mode_redisplays_the_figure_without_widgets(
    files: RunFiles, displayed: list[FakeHandle]
) -> None:
    files.steps(1, 3)
    dash = Dashboard(files.run, interval=0.02, widget=False, static_interval=0.05)
    dash.show()
    (handle,) = displayed
    files.steps(3, 6)
    wait_for(lambda: len(handle.bundles) > 1)
    files.status("completed", step=5)
    assert dash.thread is not None
    dash.thread.join(TIMEOUT)
    assert dash.fig is None
    assert all(WIDGET_MIME not in b for b in handle.bundles)
    loss = next(t for t in handle.bundles[-1][PLOTLY_MIME]["data"] if t["name"] == "loss")
    assert "completed" in handle.bundles[-1]["text/plain"] and loss["x"]["bdata"]


def test_importing_the_dashboard_does_not_import_the_training_stack() -> None:
    code = (
        "import sys, nbtrain.ui.dashboard, nbtrain.ui.figures, nbtrain.control.runs.metrics\n"
        "print([m for m in ('torch', 'transformers', 'bitsandbytes', 'peft', 'trl') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


NOTEBOOK_SETUP = """\
import math, time
from pathlib import Path
from nbtrain.contract.rundir import JsonlWriter, RunPaths, atomic_write_json, write_status
from nbtrain.control.runs.run import Run
from nbtrain.ui.dashboard import Dashboard
p = RunPaths(Path({root!r})); p.make()
atomic_write_json(p.resolved, {{"config": {{}}, "name": "headless"}})
write_status(p, "running", step=0, max_steps=40)
m = JsonlWriter(p.metrics, "metrics")
def write(a, b):
    for i in range(a, b):
        m.write({{"t": time.time(), "step": i, "loss": 3 / math.sqrt(i), "lr": 1e-3}})
write(1, 21)
d = Dashboard(Run(p.root), interval=0.05)
d.show()
"""


def test_notebook_executed_headless_keeps_a_static_figure_of_the_final_state(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        NOTEBOOK_SETUP.format(root=str(tmp_path / "run")),
        # the run ends while a later cell runs; the dashboard's thread finishes on its own
        "write(21, 41); time.sleep(0.3); write_status(p, 'completed', step=40)\n"
        "deadline = time.monotonic() + 30\n"
        "while not d.finished and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0.5)  # let the last display update reach the client",
        "print(d.finished, d.error)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    out, *emptied = nb.cells[0].outputs  # the snapshot and the guard emptied at the end
    assert [o["data"]["text/html"] for o in emptied] == ["", ""]
    assert WIDGET_MIME not in out["data"]
    fig = out["data"][PLOTLY_MIME]
    assert "completed" in fig["layout"]["title"]["text"] and "step 40/40" in fig["layout"]["title"]["text"]
    loss = next(t for t in fig["data"] if t["name"] == "loss")
    steps = np.frombuffer(base64.b64decode(loss["x"]["bdata"]), dtype=loss["x"]["dtype"])
    assert list(steps) == list(range(1, 41))
    assert "cdn.plot.ly" in out["data"]["text/html"]
    assert nb.cells[1].outputs == []  # nothing from the thread leaked into the cell that was running
    assert nb.cells[2].outputs[0]["text"] == "True None\n"


def test_the_live_view_shows_the_first_point_as_a_marker_then_a_line(
    files: RunFiles, dash: Dashboard
) -> None:
    files.steps(1, 2)
    dash.refresh()
    assert list(trace(dash, "loss").x) == [1] and trace(dash, "loss").mode == "lines+markers"
    files.steps(2, 3)
    dash.refresh()
    assert list(trace(dash, "loss").x) == [1, 2] and trace(dash, "loss").mode == "lines"


def test_a_view_that_ended_stopped_comes_back_live_when_its_run_is_resumed(
    files: RunFiles, displayed: list[FakeHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resumed from anywhere (the sidebar, another cell, the CLI), a run's earlier view does not stay on
    "stopped": it turns live in place within a few seconds, follows the new attempt and ends on its
    final state, which is then no longer watched."""
    from nbtrain.ui import dashboard as board

    monkeypatch.setattr(board, "REVIVALS", board.Revivals(every=0.1))
    files.steps(1, 4)
    dash = Dashboard(files.run, interval=0.02)
    try:
        dash.show()
        handle = displayed[0]
        files.status("stopped", step=3)
        assert dash.thread is not None
        dash.thread.join(TIMEOUT)
        assert dash.finished and WIDGET_MIME not in handle.bundles[-1]
        assert "stopped" in handle.bundles[-1][PLOTLY_MIME]["layout"]["title"]["text"]
        assert RUN_VIEW_MIME not in handle.bundles[-1]  # the final figure is plotly's, the watch is beside it
        snap = displayed[1]
        watch = snap.bundles[-1][RUN_VIEW_MIME]  # for a kernel that is gone when the run is resumed
        assert watch == {
            "run_id": files.run.id,
            "name": files.run.name,
            "watch": {"state": "stopped", "step": 3},
        }
        assert board.REVIVALS.watched() == [dash]
        files.status("running", step=3)  # resumed: the run directory says so, and steps follow
        files.steps(4, 7)
        wait_for(lambda: not dash.finished and WIDGET_MIME in handle.bundles[-1])
        wait_for(lambda: "watch" not in snap.bundles[-1][RUN_VIEW_MIME])  # live again: the kernel's snapshot
        wait_for(lambda: dash.fig is not None and len(trace(dash, "loss").x) == 6)
        assert "running" in title(dash) and board.REVIVALS.watched() == []
        files.steps(7, 9)
        files.status("completed", step=8)
        wait_for(lambda: dash.finished)
        assert "completed" in handle.bundles[-1][PLOTLY_MIME]["layout"]["title"]["text"]
        assert board.REVIVALS.watched() == []  # a completed run does not start again
    finally:
        dash.close()
