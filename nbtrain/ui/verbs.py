"""The verb table: every ``%finetune VERB`` and every ``nbtrain VERB`` is generated from it.

A verb is its name, its help, its arguments (``argparse.add_argument`` specs), the control function(s)
it calls (``call``: parsed arguments -> a result, the same on every surface) and how that result is
shown in a notebook (``notebook``: display it, return the cell's result) and printed in a terminal
(``terminal``: print it, return the exit code). A verb without ``terminal`` only makes sense in a
notebook (a widget, a function of the kernel): the CLI lists it and says where to run it.

``%%finetune`` cells are the ``run`` verb with the cell body as its config, so a cell, ``%finetune run
FILE`` and ``nbtrain run FILE`` take the same options.

Nothing here imports IPython, widgets or plotly at import time: the CLI imports this module.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Arg, Args, Verb, VerbUsageError, arg

if TYPE_CHECKING:
    from nbtrain.control import prepare, start
    from nbtrain.control.config import reference
    from nbtrain.control.jobs import grading
    from nbtrain.control.runs import follow as following
    from nbtrain.control.runs import metrics as metrics_tail
    from nbtrain.control.runs import run as run_core
    from nbtrain.control.runs.run import Run, RunStatus
    from nbtrain.ui import run as run_api
    from nbtrain.ui import text as ui_text
    from nbtrain.ui.dashboard import Dashboard
else:
    # Imported on first use, not by `%load_ext nbtrain` (< 0.3 s): the config schema, presets and
    # planner (pydantic, YAML) and the metrics reader (numpy) are most of the verb table's import time.
    prepare = lazy_module("nbtrain.control.prepare")
    start = lazy_module("nbtrain.control.start")
    grading = lazy_module("nbtrain.control.jobs.grading")
    metrics_tail = lazy_module("nbtrain.control.runs.metrics")
    following = lazy_module("nbtrain.control.runs.follow")
    run_core = lazy_module("nbtrain.control.runs.run")
    run_api = lazy_module("nbtrain.ui.run")
    ui_text = lazy_module("nbtrain.ui.text")
    reference = lazy_module("nbtrain.control.config.reference")

# --------------------------------------------------------------------------------------- helpers


def _print(result: Any, args: Args) -> int:
    print(result)
    return 0


def _print_in_notebook(result: Any, args: Args) -> None:
    print(result)


def _returned(result: Any, args: Args) -> Any:
    return result  # the cell's result: the notebook shows it


def _display(result: Any, args: Args) -> None:
    from IPython.display import display

    display(result)


def _print_text(result: Any, args: Args) -> int:
    print(result.text())
    return 0


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


def _run_arg(**options: Any) -> Arg:
    return arg("run", help="run id, unique id prefix, name, or run directory", **options)


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


def _call_run(a: Args) -> Any:
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
    return prep if a.dry_run else run_api.handle(start.start(prep))


def _show_estimate(report: Any) -> None:
    from IPython.display import display

    display(report)
    fig = report.figure()
    if fig is not None:
        display(fig)


def _run_in_notebook(result: Any, a: Args) -> Any:
    if _is_estimate(result):
        return _show_estimate(result)
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


def _run_in_terminal(result: Any, a: Args) -> int:
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


def _list_in_terminal(df: Any, a: Args) -> int:
    print(df.to_string(index=False) if len(df) else "no runs yet")
    if line := ui_text.warm_line():
        print(line)
    return 0


def _list_in_notebook(df: Any, a: Args) -> Any:
    if line := ui_text.warm_line():
        print(line)
    return df  # the cell's result: the notebook shows it


def _stop(a: Args) -> str:
    run = run_core.get_run(a.run)
    before = run.status()
    if not before.done:
        ahead = f"~{before.step_seconds:.0f} s a step" if before.step_seconds else "step time not known yet"
        print(f"run {run.id}: stopping after step {before.step + 1} ({ahead}), then a checkpoint", flush=True)
    st = run.stop(timeout=a.timeout)
    return stopped_text(run, st) if st.state == "stopped" else f"run {run.id}: {st.describe()}"


def _checkpoint(a: Args) -> str:
    run = run_core.get_run(a.run)
    run.checkpoint()
    return f"run {run.id}: checkpoint requested; it is saved after the current step"


def _resume_in_notebook(run: Run, a: Args) -> Run:
    if a.wait:
        wait_in_notebook(run, None)
    elif not a.no_view:
        show_view(run)
    return run


def _resume_in_terminal(run: Run, a: Args) -> int:
    print(f"resumed {run.id}")
    return follow_in_terminal(run, None, quiet=a.no_view) if a.wait else 0


def _attach_in_notebook(run: Run, a: Args) -> None:
    show_view(run)  # it updates itself in the background; the cell returns at once


def _launch_function(a: Args) -> Run:
    from IPython import get_ipython

    from nbtrain.control.notebook_launch import launch_function

    ip = get_ipython()
    ns = ip.user_ns if ip is not None else {}
    if a.function not in ns:
        raise NbtrainError(f"no function named {a.function!r} in this notebook; define it in a cell first")
    run = launch_function(ns[a.function], num_processes=a.n, name=a.name, fallback=a.fallback)
    return run_api.handle(run)


def _launched_in_notebook(run: Run, a: Args) -> Run:
    if not a.no_view:
        show_view(run)
    return run


def _compare_in_notebook(runs: list[Run], a: Args) -> Any:
    """The chart, then the table of the settings the runs differ in."""
    from IPython.display import display

    from nbtrain.ui.figures import compare_figure

    display(compare_figure(runs, key=a.key))
    diff = ui_text.config_differences(runs)
    return diff.set_index("setting") if len(diff) else "the runs' settings are the same"


def _compare_in_terminal(runs: list[Run], a: Args) -> int:
    print(ui_text.compare_table(runs, a.key).to_string(index=False))
    diff = ui_text.config_differences(runs)
    print("\nsettings that differ:\n" + diff.to_string(index=False) if len(diff) else "\nthe same settings")
    return 0


def _panel(a: Args) -> Any:
    from nbtrain.ui.panel import ConfigPanel, panel

    return ConfigPanel.from_run(a.run) if a.run else panel(None)


def _record_in_terminal(run: Run, a: Args) -> int:
    print(json.dumps(grading.run_record(run), indent=2, default=str))
    return 0


def _preview(a: Args) -> Any:
    from nbtrain.ui.preview import preview

    return preview(a.config, n=a.n, stats_rows=a.stats_rows)


# ------------------------------------------------------------------------------------ model verbs


def _serve(a: Args) -> Any:
    from nbtrain.control.jobs.serve import serve, stop_serving

    if a.stop:
        return stop_serving(a.run)  # the lines of the servers stopped
    if a.run is None:
        raise VerbUsageError("name the RUN to serve, or pass --stop [RUN] to stop serving")
    return serve(a.run, port=a.port, base_only=a.base_only, timeout=a.timeout)


def _served_line(h: Any, key: str) -> str:
    how = "already running" if h.reused else "started"
    return (f"{how}: {', '.join(h.models.values())} at {h.url}  (OpenAI base URL; {h.engine} on {h.device}, "
            f"pid {h.pid}; API key: {key}")  # fmt: skip


def _serve_in_notebook(result: Any, a: Args) -> None:
    if a.stop:
        print("\n".join(result) if result else "no server started from this kernel is running")
        return
    run_id = run_core.get_run(a.run).id
    # Not the key itself: a saved notebook keeps its cells' output on disk.
    key = f'nbtrain.get_run({run_id!r}).serve().api_key, or "api_key" in {result.run_dir / "serve.json"}'
    print(f"{_served_line(result, key)}; stop with %finetune serve --stop {run_id})")


class _Terminated(Exception):
    """SIGTERM while a terminal serves: stop the server as Ctrl-C does."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _serve_in_terminal(result: Any, a: Args) -> int:
    if a.stop:
        print("\n".join(result) if result else "no server started from this process is running; "
              "name its run: nbtrain serve --stop RUN")  # fmt: skip
        return 0
    run_id = run_core.get_run(a.run).id
    key = result.api_key or "none"
    if result.reused:  # another process's server: it is that process's to stop
        print(f"{_served_line(result, key)}; stop with nbtrain serve --stop {run_id})", flush=True)
        return 0
    # The server belongs to this command (a process that exits stops the servers it started): it
    # serves in the foreground until Ctrl-C, SIGTERM, or `nbtrain serve --stop RUN` elsewhere.
    # The line is printed inside the try: a Ctrl-C that comes the moment it is read (a script that waits
    # for it, then interrupts) still stops the server, and one during the stop does not cut the stop short.
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        print(f"{_served_line(result, key)}; Ctrl-C stops it)", flush=True)
        while result.alive():
            time.sleep(0.5)
    except (KeyboardInterrupt, _Terminated):
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            print(f"stopped the server of {run_id} ({result.stop()})", flush=True)
        finally:
            signal.signal(signal.SIGINT, previous_int)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"the server of {run_id} stopped", flush=True)
    return 0


def _chat(a: Args) -> Any:
    from nbtrain.ui.chat import ChatWidget

    tools = None
    if a.tools:
        from IPython import get_ipython

        from nbtrain.ui.chat_tools import from_names

        shell = get_ipython()
        tools = from_names(a.tools, shell.user_ns if shell is not None else {})
    return ChatWidget(a.run, compare_base=a.compare_base, temperature=a.temperature,
                      max_tokens=a.max_tokens, top_p=a.top_p, tools=tools,
                      confirm_tools=not a.no_confirm)  # fmt: skip


def _eval(a: Args) -> Any:
    from nbtrain.control.jobs.evaluate import evaluate

    return evaluate(a.run, compare_base=a.compare_base, file=a.file, tasks=a.tasks, limit=a.limit,
                    batch_size=a.batch_size)  # fmt: skip


def _eval_in_notebook(report: Any, a: Args) -> Any:
    from IPython.display import display

    from nbtrain.ui.figures import themed

    display(themed(report.figure()))  # nbtrain's one plotly theme (the report's figure is built in control)
    return report  # the table, as the cell's result


def _eval_in_terminal(report: Any, a: Args) -> int:
    print(f"{report.table().to_string()}\n(saved in {report.path})")
    return 0


def _export(a: Args) -> Any:
    from nbtrain.control.jobs.export import export

    if a.to is None:  # the notebook shows the export box; a terminal needs --to
        return None
    return export(a.run, to=a.to, merge=a.merge, dtype=a.dtype, overwrite=a.overwrite,
                  push_to_hub=a.push_to_hub, private=not a.public, format=a.format,
                  quant=a.quant)  # fmt: skip


def _gguf_setup(a: Args) -> str:
    from nbtrain.control.jobs import llamacpp

    if llamacpp.missing() is None:
        return f"llama.cpp is ready (converter in {llamacpp.tools_dir()})"
    return f"llama.cpp set up: converter in {llamacpp.setup()}"


def _export_in_notebook(result: Any, a: Args) -> Any:
    if result is None:
        from nbtrain.ui.export_box import ExportBox

        return ExportBox(a.run)
    return result


def _export_in_terminal(result: Any, a: Args) -> int:
    if result is None:
        raise VerbUsageError("give --to DIR, the folder to write (in a notebook, without it a form opens)")
    return _print_repr(result, a)


def _print_repr(result: Any, a: Args) -> int:
    print(repr(result))
    return 0


def _warm(a: Args) -> str:
    from nbtrain.contract.warm import ENV_OFF, enabled
    from nbtrain.control.launch import warm

    if a.action == "start":
        if warm.start():
            return "warm process starting"
        if why := warm.memory_short():
            return f"no warm process started: {why}"
        return "a warm process answers already (or is starting)"
    if a.action == "stop":
        return f"stopped {warm.stop()} warm process(es)"
    rows = warm.status(every_home=True)  # the bound (NBTRAIN_WARM_MAX) is per user, whatever the home
    lines = [] if enabled() else [f"warm start is off ({ENV_OFF}=0): every run starts cold"]
    for r in rows:
        idle = f"idle {r['idle_s']:.0f} s, " if r["idle_s"] is not None else ""
        ready = f", ready after {r['ready_s']} s" if r["ready_s"] is not None else ""
        lines.append(
            f"warm process {r['pid']}: {r['rss_bytes'] / 2**20:.0f} MiB held, {idle}up {r['uptime_s']:.0f} s"
            f"{ready}, environment {r['key']} ({r['python']}, {r['folder']})"
            + (", serves this kernel" if r["this_kernel"] else "")
        )
    return "\n".join(lines or ["no warm process (the next run starts one; `start` starts it now)"])


def _tensorboard(a: Args) -> Any:
    from nbtrain.control.launch.tracking import stop_tensorboard, tensorboard

    run = run_core.get_run(a.run)
    if a.stop:
        return f"run {run.id}: TensorBoard {'stopped' if stop_tensorboard(run.dir) else 'was not running'}"
    return tensorboard(run.dir)


def _tensorboard_in_notebook(result: Any, a: Args) -> Any:
    if isinstance(result, str):
        print(result)
        return None
    from IPython.display import IFrame, display

    display(result)
    return IFrame(result.url, width="100%", height=720)


def _tensorboard_in_terminal(result: Any, a: Args) -> int:
    print(result if isinstance(result, str) else f"{result!r}; stop with nbtrain tensorboard {a.run} --stop")
    return 0


# ---------------------------------------------------------------------------------------- table

_CONFIG_OR_RUN = "a .yaml config file, or a run (id, name, directory)"

TABLE: tuple[Verb, ...] = (
    Verb(
        "run",
        "Validate, plan and start a run from a YAML config file (in a notebook also: a %%finetune "
        "cell, with the same options).",
        (arg("config", help="a .yaml config file"), *RUN_OPTIONS),
        _call_run,
        _run_in_notebook,
        _run_in_terminal,
    ),
    Verb(
        "list",
        "List runs (a DataFrame in a notebook, a table in a terminal).",
        (),
        lambda a: ui_text.runs_table(start.runs()),
        _list_in_notebook,
        _list_in_terminal,
        aliases=("ls",),
    ),
    Verb(
        "status",
        "A run's state, and its error if it failed.",
        (_run_arg(),),
        lambda a: ui_text.status_text(run_core.get_run(a.run)),
        _print_in_notebook,
        _print,
    ),
    Verb(
        "logs",
        "The last lines of a run's log.",
        (_run_arg(), arg("-n", type=int, default=40, help="number of lines (default 40)")),
        lambda a: run_core.get_run(a.run).logs(a.n),
        _print_in_notebook,
        _print,
    ),
    Verb(
        "stop",
        "Stop a run after its current step (it saves a checkpoint).",
        (
            _run_arg(),
            arg(
                "--timeout",
                type=float,
                default=None,
                help="seconds before the process group is killed (default: long enough for the step in "
                "progress and its checkpoint, from the run's step time)",
            ),
        ),
        _stop,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "checkpoint",
        "Save a checkpoint after the current step, keep training.",
        (_run_arg(),),
        _checkpoint,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "resume",
        "Continue a stopped or failed run from its last checkpoint.",
        (
            _run_arg(),
            arg("--wait", action="store_true", help="block until the run ends"),
            arg(
                "--no-view",
                action="store_true",
                help="do not show the live view (terminal: no progress lines while --wait follows)",
            ),
        ),
        lambda a: run_api.handle(start.resume(a.run)),
        _resume_in_notebook,
        _resume_in_terminal,
    ),
    Verb(
        "attach",
        "Show a run's live view (any kernel); in a terminal, print its progress until it ends.",
        (
            _run_arg(),
            arg(
                "--timeout",
                type=float,
                default=None,
                help="terminal: seconds to follow before giving up (the run goes on)",
            ),
        ),
        lambda a: run_core.get_run(a.run),
        _attach_in_notebook,
        lambda run, a: follow_in_terminal(run, a.timeout),
    ),
    Verb(
        "wait",
        "Block until a run ends; fail the cell (exit 1) if it did not complete.",
        (
            _run_arg(),
            arg(
                "--timeout",
                type=float,
                default=None,
                help="seconds to wait before giving up (the run goes on)",
            ),
        ),
        lambda a: run_core.get_run(a.run),
        lambda run, a: wait_in_notebook(run, a.timeout),
        lambda run, a: follow_in_terminal(run, a.timeout, quiet=True),
    ),
    Verb(
        "launch-function",
        "Run a training function of this notebook on N processes (accelerate's notebook_launcher).",
        (
            arg("function", help="name of a function defined in the notebook"),
            arg("-n", type=int, default=1, help="number of processes (default 1)"),
            arg("--name", default=None, help="run name (default: the function's name)"),
            arg(
                "--fallback",
                choices=["refuse", "detached"],
                default="refuse",
                help="when the kernel is not safe to fork: refuse (default) or run detached",
            ),
            arg("--no-view", action="store_true", help="do not show the live view"),
        ),
        _launch_function,
        _launched_in_notebook,
    ),
    Verb(
        "compare",
        "Overlay the loss curves of several runs on one chart (a table in a terminal), and list the "
        "settings they differ in.",
        (
            arg("runs", nargs="+", help="two or more runs"),
            arg("--key", default="loss", help="the metric to compare (default loss)"),
        ),
        lambda a: [run_core.get_run(r) for r in a.runs],
        _compare_in_notebook,
        _compare_in_terminal,
    ),
    Verb(
        "panel",
        "A form that builds a run config (and launches it) without YAML.",
        (arg("run", nargs="?", default=None, help="fill the form from this run's config"),),
        _panel,
        _returned,
    ),
    Verb(
        "estimate",
        "Will it fit? Memory estimate of a config file and the alternatives.",
        (
            arg("config", help="a .yaml config file (or use %%finetune --estimate with a YAML cell)"),
            arg(
                "--on",
                default=None,
                metavar="HARDWARE",
                help="plan for hardware you name, not this machine: 8xA100-40GB, 2x8xH100-80GB, 1xT4, "
                "4090, L4, A10G, H200, MI300X, M3-MAX-64GB, cpu-16",
            ),
        ),
        lambda a: estimate(a.config, on=a.on),
        lambda r, a: _show_estimate(r),
        _print_text,
    ),
    Verb(
        "probe",
        "Run a few real steps of a config: measured peak memory and speed.",
        (
            arg("config", help="a .yaml config file (or use %%finetune --probe with a YAML cell)"),
            arg("--steps", type=int, default=5, help="steps to run (default 5)"),
            arg("--name", default=None, help="run name (the probe run is named NAME-probe)"),
        ),
        lambda a: start.probe(a.config, name=a.name, steps=a.steps),
        _returned,
        _print_text,
    ),
    Verb(
        "record",
        "Save a run's record (config, plan, metrics) in this notebook; JSON in a terminal.",
        (_run_arg(),),
        lambda a: run_core.get_run(a.run),
        lambda run, a: grading.record(run),
        _record_in_terminal,
    ),
    Verb(
        "preview",
        "The first examples as the model sees them (chat template applied, masked tokens "
        "marked) and token-length statistics.",
        (
            arg("config", help=_CONFIG_OR_RUN),
            arg("-n", type=int, default=5, help="examples to show (default 5)"),
            arg("--stats-rows", type=int, default=2000, help="rows measured for the statistics"),
        ),
        _preview,
        _display,
        _print_text,
    ),
    Verb(
        "serve",
        "Serve a run's model on 127.0.0.1 (OpenAI API), or stop serving; a terminal serves until Ctrl-C.",
        (
            arg("run", nargs="?", default=None, help="the run (with --stop: default all started here)"),
            arg("--port", type=int, default=0, help="port (default: a free one)"),
            arg("--base-only", action="store_true", help="serve only the base model, without the adapter"),
            arg("--stop", action="store_true", help="stop the run's server (no RUN: all started here)"),
            arg("--timeout", type=float, default=300.0, help="seconds to wait for the server to listen"),
        ),
        _serve,
        _serve_in_notebook,
        _serve_in_terminal,
    ),
    Verb(
        "chat",
        "Chat with a run's fine-tuned model (a widget; Close stops it).",
        (
            _run_arg(),
            arg("--compare-base", action="store_true", help="show the base model's answer beside it"),
            arg("--temperature", type=float, default=0.0, help="initial temperature (0: greedy)"),
            arg("--max-tokens", type=int, default=128, help="initial max new tokens"),
            arg("--top-p", type=float, default=1.0, help="initial top_p"),
            arg("--tools", default=None, metavar="F,G", help="notebook functions the model may call"),
            arg("--no-confirm", action="store_true", help="run the model's tool calls without asking"),
        ),
        _chat,
        _returned,
    ),
    Verb(
        "eval",
        "Held-out loss and perplexity of a run (and lm-eval tasks).",
        (
            _run_arg(),
            arg(
                "--compare-base",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="measure the base model too, side by side (the default; --no-compare-base: tuned only)",
            ),
            arg("--file", default=None, help="SFT data to measure on (default: the run's eval split)"),
            arg("--tasks", nargs="+", default=None, help="lm-eval task names, task YAML files or dirs"),
            arg("--limit", type=float, default=None, help="rows of data / per task (N or a fraction)"),
            arg("--batch-size", type=int, default=8, help="examples per forward pass (default 8)"),
        ),
        _eval,
        _eval_in_notebook,
        _eval_in_terminal,
    ),
    Verb(
        "export",
        "Save a run's model as a standalone directory (LoRA merged), or as GGUF files (--format gguf).",
        (
            _run_arg(),
            arg(
                "--to",
                default=None,
                help="the directory to write (new or empty); in a notebook, leave it out for a form",
            ),
            arg(
                "--merge",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="merge the adapter into the base (default); --no-merge: adapter only",
            ),
            arg("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"]),
            arg(
                "--format",
                default="hf",
                choices=["hf", "gguf"],
                help="hf: safetensors (default); gguf: for llama.cpp, Ollama, LM Studio",
            ),
            arg(
                "--quant",
                default=None,
                metavar="TYPES",
                help="gguf: types to write, e.g. f16,q8_0,q4_k_m (default f16)",
            ),
            arg("--overwrite", action="store_true", help="replace an earlier export in --to"),
            arg("--push-to-hub", default=None, metavar="REPO", help="then upload to this hub repo"),
            arg("--public", action="store_true", help="create the hub repo public (default private)"),
        ),
        _export,
        _export_in_notebook,
        _export_in_terminal,
    ),
    Verb(
        "gguf-setup",
        "Set up llama.cpp for --format gguf: builds llama-cpp-python once per machine (~5 min on 2 cores).",
        (),
        _gguf_setup,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "tensorboard",
        "TensorBoard on a run's logs (report_to: tensorboard).",
        (_run_arg(), arg("--stop", action="store_true", help="stop the TensorBoard started for this run")),
        _tensorboard,
        _tensorboard_in_notebook,
        _tensorboard_in_terminal,
    ),
    Verb(
        "warm",
        "The warm process that starts runs in a fraction of a second: status (default), start or stop.",
        (arg("action", nargs="?", default="status", choices=["status", "start", "stop"]),),
        _warm,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "help",
        "What a config key means: its type, default and examples (without KEY: every top-level key).",
        (
            arg("key", nargs="?", help="a key path: lora.r, data.train, distributed.slurm.time, train.beta"),
            arg("--objective", default="sft", help="the objective whose TRL config train: keys are (sft)"),
        ),
        lambda a: reference.describe(a.key, a.objective) if a.key else reference.overview(),
        _print_in_notebook,
        _print,
    ),
    Verb(
        "tiny-model",
        "Build the tiny local test model (a few MB, seconds) in DIR.",
        (arg("dir", help="where to write it"),),
        lambda a: start.make_tiny_model(a.dir),
        _print_in_notebook,
        _print,
    ),
    Verb(
        "example-data",
        "Write the addition example dataset (the demo's data) to FILE.",
        (
            arg("file", help="the .jsonl file to write"),
            arg("--format", default="messages", choices=["messages", "alpaca", "sharegpt", "text"]),
        ),
        lambda a: start.example_data(a.file, a.format),
        _print_in_notebook,
        _print,
    ),
)

VERBS: dict[str, Verb] = {v.name: v for v in TABLE}
_BY_NAME: dict[str, Verb] = {n: v for v in TABLE for n in (v.name, *v.aliases)}


def find(name: str) -> Verb | None:
    """The verb called ``name`` (or one of its aliases)."""
    return _BY_NAME.get(name)


def unknown_verb(word: str) -> str:
    """What to say about a word that names no verb: the closest verb, and all of them."""
    close = difflib.get_close_matches(word, list(_BY_NAME), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"unknown verb '{word}'.{hint} Verbs: {', '.join(VERBS)}."


def notebook_only_message(verb: Verb) -> str:
    return f"`nbtrain {verb.name}` is a notebook verb: run `%finetune {verb.name}` in a notebook"
