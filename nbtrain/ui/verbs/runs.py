"""The run verbs: ``run`` (and a ``%%finetune`` cell, its options ``RUN_OPTIONS``) with its
``--estimate``, ``--probe`` and ``--dry-run``; ``list``, ``stop``, ``checkpoint``, ``resume``,
``attach``, ``launch-function``, ``compare`` and ``record`` -- each verb's call and how its result is
shown in a notebook and printed in a terminal. The table (``nbtrain.ui.verbs``) names them."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Arg, Args, VerbUsageError, arg
from nbtrain.ui.verbs.sweeps import sweep_in_notebook, sweep_in_terminal
from nbtrain.ui.verbs.views import follow_in_terminal, show_view, stopped_text, wait_in_notebook

if TYPE_CHECKING:
    from nbtrain.control import prepare, start
    from nbtrain.control.jobs import grading
    from nbtrain.control.runs import run as run_core
    from nbtrain.control.runs.run import Run
    from nbtrain.control.sweep import sweep as sweep_core
    from nbtrain.ui import run as run_api
    from nbtrain.ui import sweeps as sweeps_api
    from nbtrain.ui import text as ui_text
else:
    # Imported on first use, not by `%load_ext nbtrain` (< 0.3 s): the config schema, presets and
    # planner (pydantic, YAML) are most of the verb table's import time (ui/lazy.py).
    prepare = lazy_module("nbtrain.control.prepare")
    start = lazy_module("nbtrain.control.start")
    grading = lazy_module("nbtrain.control.jobs.grading")
    run_core = lazy_module("nbtrain.control.runs.run")
    run_api = lazy_module("nbtrain.ui.run")
    ui_text = lazy_module("nbtrain.ui.text")
    sweep_core = lazy_module("nbtrain.control.sweep.sweep")
    sweeps_api = lazy_module("nbtrain.ui.sweeps")

# ------------------------------------------------------------------------------------- run / cell

# The options of ``run`` after its config: also the options of a ``%%finetune`` cell.
RUN_OPTIONS: tuple[Arg, ...] = (
    arg("--name", help="run name (letters, digits, '.', '_' or '-')"),
    arg("--dry-run", action="store_true", help="validate and plan only; start nothing"),
    arg("--wait", action="store_true", help="block until the run ends (fails the cell if it fails)"),
    arg(
        "--no-view",
        action="store_true",
        help="do not show the live view (terminal: no progress lines while --wait follows)",
    ),
    arg("--estimate", action="store_true", help="memory estimate and alternatives; start nothing"),
    arg("--probe", action="store_true", help="run a few real steps: measured memory and speed"),
    arg(
        "--on",
        default=None,
        metavar="HARDWARE",
        help="with --estimate or --dry-run: plan for hardware you name, not this machine (e.g. "
        "8xA100-40GB, 2x8xH100-80GB, 1xT4, M3-MAX-64GB)",
    ),
)


def estimate(config: Any, on: str | None = None) -> Any:
    """nbtrain.ui.estimate_chart.estimate, imported when first asked for: it draws with plotly, which
    ``%load_ext nbtrain`` does not load."""
    from nbtrain.ui.estimate_chart import estimate as draw

    return draw(config, on=on)


def _is_estimate(result: Any) -> bool:
    chart = sys.modules.get("nbtrain.ui.estimate_chart")  # not imported: nothing can be one of its reports
    return chart is not None and isinstance(result, chart.EstimateReport)


def call_run(a: Args) -> Any:
    if a.on is not None and not (a.estimate or a.dry_run):
        raise VerbUsageError(
            f"--on {a.on} plans for hardware other than this machine: add --estimate or --dry-run (a run "
            "starts here, on this machine's hardware; a SLURM config plans for its partition's nodes)"
        )
    if a.estimate:
        return estimate(a.config, on=a.on)
    if a.probe:
        return start.probe(a.config, name=a.name)
    prep = prepare.prepare(a.config, name=a.name, on=a.on)
    if a.dry_run:
        return prep
    if prep.resolved.config.sweep is not None:  # many trials, each a run: the sweep's driver starts them
        return sweeps_api.sweep(a.config, name=a.name, prepared=prep)
    return run_api.handle(start.start(prep))


def show_estimate(report: Any) -> None:
    from IPython.display import display

    display(report)
    fig = report.figure()
    if fig is not None:
        display(fig)


def run_in_notebook(result: Any, a: Args) -> Any:
    if isinstance(result, sweep_core.Sweep):
        return sweep_in_notebook(result, a)
    if _is_estimate(result):
        return show_estimate(result)
    if isinstance(result, start.ProbeReport):
        return result
    if isinstance(result, prepare.Prepared):
        _show_dry_run(result)
        return result  # the plan as the cell's result, below its memory chart
    run: Run = result
    try:
        if a.wait:
            wait_in_notebook(run, None)
        elif not a.no_view:
            show_view(run)
    finally:
        # below the view, and also for a failed run: the notebook keeps the run's record (config,
        # plan, estimate; final metrics once it ends), its evidence for a course
        grading.record(run)
    return run


def _show_dry_run(prep: prepare.Prepared) -> None:
    from nbtrain.ui.estimate_chart import prepared_figure

    fig = prepared_figure(prep)  # the stacked memory bar of the plan's estimate, if it has one
    if fig is not None:
        from IPython.display import display

        display(fig)


def run_in_terminal(result: Any, a: Args) -> int:
    if isinstance(result, sweep_core.Sweep):
        return sweep_in_terminal(result, a)
    if _is_estimate(result) or isinstance(result, start.ProbeReport):
        print(result.text())
        return 0
    if isinstance(result, prepare.Prepared):
        print(result.summary())
        return 0
    run: Run = result
    print(f"started {run.id}\n  dir: {run.dir}")
    return follow_in_terminal(run, None, quiet=a.no_view) if a.wait else 0


# ------------------------------------------------------------------------------------- run verbs


def list_in_terminal(df: Any, a: Args) -> int:
    print(df.to_string(index=False) if len(df) else "no runs yet")
    if line := ui_text.warm_line():
        print(line)
    return 0


def list_in_notebook(df: Any, a: Args) -> Any:
    if line := ui_text.warm_line():
        print(line)
    return df  # the cell's result: the notebook shows it


def stop(a: Args) -> str:
    run = run_core.get_run(a.run)
    before = run.status()
    if not before.done:
        ahead = f"~{before.step_seconds:.0f} s a step" if before.step_seconds else "step time not known yet"
        print(f"run {run.id}: stopping after step {before.step + 1} ({ahead}), then a checkpoint", flush=True)
    st = run.stop(timeout=a.timeout)
    return stopped_text(run, st) if st.state == "stopped" else f"run {run.id}: {st.describe()}"


def checkpoint(a: Args) -> str:
    run = run_core.get_run(a.run)
    run.checkpoint()
    return f"run {run.id}: checkpoint requested; it is saved after the current step"


def resume_in_notebook(run: Run, a: Args) -> Run:
    if a.wait:
        wait_in_notebook(run, None)
    elif not a.no_view:
        show_view(run)
    return run


def resume_in_terminal(run: Run, a: Args) -> int:
    print(f"resumed {run.id}")
    return follow_in_terminal(run, None, quiet=a.no_view) if a.wait else 0


def attach_in_notebook(run: Run, a: Args) -> None:
    show_view(run)  # it updates itself in the background; the cell returns at once


def launch_function(a: Args) -> Run:
    from IPython import get_ipython

    from nbtrain.control.notebook_launch import launch_function as launch

    ip = get_ipython()
    ns = ip.user_ns if ip is not None else {}
    if a.function not in ns:
        raise NbtrainError(f"no function named {a.function!r} in this notebook; define it in a cell first")
    run = launch(ns[a.function], num_processes=a.n, name=a.name, fallback=a.fallback)
    return run_api.handle(run)


def launched_in_notebook(run: Run, a: Args) -> Run:
    if not a.no_view:
        show_view(run)
    return run


def compare_in_notebook(runs: list[Run], a: Args) -> Any:
    """The chart, then the table of the settings the runs differ in."""
    from IPython.display import display

    from nbtrain.ui.figures import compare_figure

    display(compare_figure(runs, key=a.key))
    diff = ui_text.config_differences(runs)
    return diff.set_index("setting") if len(diff) else "the runs' settings are the same"


def compare_in_terminal(runs: list[Run], a: Args) -> int:
    print(ui_text.compare_table(runs, a.key).to_string(index=False))
    diff = ui_text.config_differences(runs)
    print("\nsettings that differ:\n" + diff.to_string(index=False) if len(diff) else "\nthe same settings")
    return 0


def record_in_terminal(run: Run, a: Args) -> int:
    print(json.dumps(grading.run_record(run), indent=2, default=str))
    return 0
