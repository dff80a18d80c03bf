"""A run followed to its end on each surface: the live views this kernel shows, ``wait`` in a notebook
(the view already shown, brought to the final state), progress lines in a terminal, and what a stopped
run says."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.lazy import lazy_module

if TYPE_CHECKING:
    from nbtrain.control.jobs import grading
    from nbtrain.control.runs import follow as following
    from nbtrain.control.runs import metrics as metrics_tail
    from nbtrain.control.runs import run as run_core
    from nbtrain.control.runs.run import Run, RunStatus
    from nbtrain.ui import text as ui_text
    from nbtrain.ui.dashboard import Dashboard
else:
    # Imported on first use, not by `%load_ext nbtrain` (ui/lazy.py).
    grading = lazy_module("nbtrain.control.jobs.grading")
    following = lazy_module("nbtrain.control.runs.follow")
    metrics_tail = lazy_module("nbtrain.control.runs.metrics")
    run_core = lazy_module("nbtrain.control.runs.run")
    ui_text = lazy_module("nbtrain.ui.text")

# Live views this kernel shows (``attach``, a started run): ``wait`` follows the one already shown for a
# run, and the extension closes them all when it is unloaded.
VIEWS: list[Dashboard] = []


def close_views() -> None:
    for view in VIEWS:
        view.close()
    VIEWS.clear()


def _dashboard(run: Run) -> Dashboard:
    from nbtrain.ui.dashboard import Dashboard  # plotly and ipywidgets load on first use, not at %load_ext

    # NBTRAIN_DASHBOARD=static shows plain Plotly figures instead of widgets (no widget state in saved
    # notebooks, for papermill/CI or frontends without ipywidgets).
    return Dashboard(run, widget=os.environ.get("NBTRAIN_DASHBOARD", "widget") != "static")


def show_view(run: Run) -> Dashboard:
    view = _dashboard(run)
    view.show()
    VIEWS.append(view)
    return view


def wait_in_notebook(run: Run, timeout: float | None) -> None:
    # Follow the dashboard this kernel already shows for the run, so that one (in the cell that
    # started it) ends on the final state; a new one only when there is none.
    shown = next((v for v in reversed(VIEWS) if v.run == run and not v.finished), None)
    st = (shown or _dashboard(run)).follow(timeout)
    if shown is not None:
        print(f"run {run.id}: {st.describe()}")
    grading.finalize_records(run)  # the run record in the cell that started it: final metrics, now
    if st.state == "failed":
        raise NbtrainError(run.failure_report(st))
    if st.state == "stopped":  # the cells after a wait expect a trained run: Run All stops here, saying why
        raise NbtrainError(stopped_text(run, st))


def stopped_text(run: Run, st: RunStatus) -> str:
    """A stopped run, for a person: at which step, who stopped it, and how to go on."""
    who = f" (stopped by {st.stop_reason})" if st.stop_reason else ""
    last = run_core.last_checkpoint(run)
    how = (
        f"resume it from its checkpoint ({last.name}) with %finetune resume {run.id}"
        if last is not None
        else "it saved no checkpoint, so start it again"
    )
    return f"run {run.id} was stopped at step {st.step}{who} before it completed; {how}"


def follow_in_terminal(run: Run, timeout: float | None, *, quiet: bool = False) -> int:
    """Print a progress line whenever it changes until the run ends; exit code 0 for completed, 1 for
    failed or stopped, 3 when ``timeout`` passes first (the run goes on)."""
    tail = metrics_tail.MetricsTail(run)
    printed = ""

    def tick() -> Any:
        nonlocal printed
        tail.poll(max_bytes=1 << 20)
        st = run.status()
        line = ui_text.progress_line(run, st, tail.last.get("loss"))
        # while catching up with a long run's metrics the loss shown would be an old one: wait for it
        if tail.caught_up and not quiet and line != printed:
            print(line, flush=True)
            printed = line
        return st

    try:
        st = following.follow(tick, timeout=timeout, interval=1.0, behind=lambda: not tail.caught_up,
                    what=f"run {run.id}")  # fmt: skip
    except TimeoutError:
        print(f"timed out after {timeout} s; the run goes on", file=sys.stderr)
        return 3
    print(ui_text.status_text(run, st))
    return 0 if st.state == "completed" else 1
