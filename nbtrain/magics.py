"""IPython magics: ``%%finetune`` (a YAML cell) and ``%finetune VERB ...`` (line verbs).

A thin shim over nbtrain.api: parse arguments, call the core, display. Errors are raised as
``UsageError`` (shown without a traceback, and they stop Run All), never printed and swallowed.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from nbtrain import api
from nbtrain.errors import NbtrainError
from nbtrain.grading import close_records, finalize_records, record
from nbtrain.runs import Run, get_run
from nbtrain.ui.text import runs_table, status_text

if TYPE_CHECKING:
    from nbtrain.ui.dashboard import Dashboard

_VIEWS: list[Dashboard] = []  # live views of this kernel, closed when the extension unloads


def _parser(prog: str, description: str) -> MagicArgumentParser:
    # The plain formatter: IPython's adds reST markup that reads badly in an error message.
    return MagicArgumentParser(
        prog=prog, description=description, add_help=False, formatter_class=argparse.HelpFormatter
    )


def _cell_parser() -> MagicArgumentParser:
    p = _parser("%%finetune", "Validate, plan and start a fine-tuning run from the YAML body of the cell.")
    p.add_argument("--name", help="run name (letters, digits, '.', '_' or '-')")
    p.add_argument("--dry-run", action="store_true", help="validate and plan only; start nothing")
    p.add_argument(
        "--wait", action="store_true", help="block until the run ends (fails the cell if it fails)"
    )
    p.add_argument("--no-view", action="store_true", help="do not show the live view")
    p.add_argument("--estimate", action="store_true", help="memory estimate and alternatives; start nothing")
    p.add_argument("--probe", action="store_true", help="run a few real steps: measured memory and speed")
    return p


def _run_arg(p: MagicArgumentParser) -> MagicArgumentParser:
    p.add_argument("run", help="run id, unique id prefix, name, or run directory")
    return p


class Verb:
    def __init__(self, parser: MagicArgumentParser, handler: Callable[[Any], Any]) -> None:
        self.parser = parser
        self.handler = handler


def _verb_list(args: Any) -> Any:
    return runs_table(api.runs())


def _verb_status(args: Any) -> None:
    print(status_text(get_run(args.run)))


def _verb_logs(args: Any) -> None:
    print(get_run(args.run).logs(args.n))


def _verb_stop(args: Any) -> None:
    run = get_run(args.run)
    st = run.stop(timeout=args.timeout)
    print(f"run {run.id}: {st.describe()}")


def _dashboard(run: Run) -> Dashboard:
    from nbtrain.ui.dashboard import Dashboard  # plotly and ipywidgets load on first use, not at %load_ext

    # NBTRAIN_DASHBOARD=static shows plain Plotly figures instead of widgets (no widget state in saved
    # notebooks, for papermill/CI or frontends without ipywidgets).
    return Dashboard(run, widget=os.environ.get("NBTRAIN_DASHBOARD", "widget") != "static")


def _verb_checkpoint(args: Any) -> None:
    run = get_run(args.run)
    run.checkpoint()
    print(f"run {run.id}: checkpoint requested; it is saved after the current step")


def _verb_resume(args: Any) -> Any:
    run = api.resume(args.run)
    if not args.no_view:
        _show(run)
    return run


def _show(run: Run) -> Dashboard:
    view = _dashboard(run)
    view.show()
    _VIEWS.append(view)
    return view


def _verb_attach(args: Any) -> None:
    _show(get_run(args.run))


def _verb_wait(args: Any) -> None:
    _wait(get_run(args.run), args.timeout)


def _wait(run: Run, timeout: float | None) -> None:
    # Follow the dashboard this kernel already shows for the run, so that one (in the cell that
    # started it) ends on the final state; a new one only when there is none.
    shown = next((v for v in reversed(_VIEWS) if v.run == run and not v.finished), None)
    st = (shown or _dashboard(run)).follow(timeout)
    if shown is not None:
        print(f"run {run.id}: {st.describe()}")
    finalize_records(run)  # the run record in the cell that started it: final metrics, now
    if st.state == "failed":
        raise UsageError(run.failure_report(st))


def _verb_launch_function(args: Any) -> Any:
    from IPython import get_ipython

    from nbtrain.notebook_launch import launch_function

    ip = get_ipython()
    ns = ip.user_ns if ip is not None else {}
    if args.function not in ns:
        raise UsageError(f"no function named {args.function!r} in this notebook; define it in a cell first")
    run = launch_function(ns[args.function], num_processes=args.n, name=args.name, fallback=args.fallback)
    if not args.no_view:
        _show(run)
    return run


def _verb_compare(args: Any) -> Any:
    from nbtrain.ui.figures import compare_figure

    return compare_figure([get_run(r) for r in args.runs], key=args.key)


def _verb_panel(args: Any) -> Any:
    from nbtrain.ui.panel import ConfigPanel, panel

    return ConfigPanel.from_run(args.run) if args.run else panel(None)


def _show_estimate(report: Any) -> None:
    from IPython.display import display

    display(report)
    fig = report.figure()
    if fig is not None:
        display(fig)


def _verb_record(args: Any) -> None:
    record(get_run(args.run))


def _verb_estimate(args: Any) -> None:
    _show_estimate(api.estimate(args.config))


def _verb_preview(args: Any) -> None:
    from IPython.display import display

    from nbtrain.datapreview import preview

    display(preview(args.config, n=args.n, stats_rows=args.stats_rows))


def _verb_serve(args: Any) -> None:
    from nbtrain.serve.control import serve, stop_serving

    if args.stop:
        lines = stop_serving(args.run)
        print("\n".join(lines) if lines else "no server started from this kernel is running")
        return
    if args.run is None:
        raise UsageError("%finetune serve RUN [--port N] [--base-only], or %finetune serve --stop [RUN]")
    h = serve(args.run, port=args.port, base_only=args.base_only, timeout=args.timeout)
    how = "already running" if h.reused else "started"
    print(f"{how}: {', '.join(h.models.values())} at {h.url}  (OpenAI base URL; {h.engine} on {h.device}, "
          f"pid {h.pid}; stop with %finetune serve --stop {get_run(args.run).id})")  # fmt: skip


def _verb_chat(args: Any) -> Any:
    from nbtrain.ui.chat import ChatWidget

    return ChatWidget(args.run, compare_base=args.compare_base, temperature=args.temperature,
                      max_tokens=args.max_tokens, top_p=args.top_p)  # fmt: skip


def _verb_eval(args: Any) -> Any:
    from IPython.display import display

    from nbtrain.evaluate import evaluate

    report = evaluate(args.run, compare_base=args.compare_base, file=args.file, tasks=args.tasks,
                      limit=args.limit, batch_size=args.batch_size)  # fmt: skip
    display(report.figure())
    return report  # the table, as the cell's result


def _verb_export(args: Any) -> Any:
    from nbtrain.export import export

    return export(args.run, to=args.to, merge=args.merge, dtype=args.dtype, overwrite=args.overwrite,
                  push_to_hub=args.push_to_hub, private=not args.public)  # fmt: skip


def _verb_tensorboard(args: Any) -> Any:
    from IPython.display import IFrame, display

    from nbtrain.tracking import stop_tensorboard, tensorboard

    run = get_run(args.run)
    if args.stop:
        print(f"run {run.id}: TensorBoard {'stopped' if stop_tensorboard(run.dir) else 'was not running'}")
        return None
    tb = tensorboard(run.dir)
    display(tb)
    return IFrame(tb.url, width="100%", height=720)


def _verbs() -> dict[str, Verb]:
    v: dict[str, Verb] = {}
    v["list"] = Verb(_parser("%finetune list", "List runs (a DataFrame)."), _verb_list)
    v["status"] = Verb(
        _run_arg(_parser("%finetune status", "A run's state, and its error if it failed.")), _verb_status
    )
    p = _run_arg(_parser("%finetune logs", "The last lines of a run's log."))
    p.add_argument("-n", type=int, default=40, help="number of lines (default 40)")
    v["logs"] = Verb(p, _verb_logs)
    p = _run_arg(_parser("%finetune stop", "Stop a run after its current step (it saves a checkpoint)."))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before the process group is killed")
    v["stop"] = Verb(p, _verb_stop)
    v["checkpoint"] = Verb(
        _run_arg(_parser("%finetune checkpoint", "Save a checkpoint after the current step, keep training.")),
        _verb_checkpoint,
    )
    p = _run_arg(_parser("%finetune resume", "Continue a stopped or failed run from its last checkpoint."))
    p.add_argument("--no-view", action="store_true")
    v["resume"] = Verb(p, _verb_resume)
    v["attach"] = Verb(
        _run_arg(_parser("%finetune attach", "Show a run's live view (any kernel).")), _verb_attach
    )
    p = _run_arg(_parser("%finetune wait", "Block until a run ends; fail the cell if it failed."))
    p.add_argument("--timeout", type=float, default=None)
    v["wait"] = Verb(p, _verb_wait)
    p = _parser(
        "%finetune launch-function",
        "Run a training function of this notebook on N processes (accelerate's notebook_launcher).",
    )
    p.add_argument("function", help="name of a function defined in the notebook")
    p.add_argument("-n", type=int, default=1, help="number of processes (default 1)")
    p.add_argument("--name", default=None, help="run name (default: the function's name)")
    p.add_argument("--fallback", choices=["refuse", "detached"], default="refuse",
                   help="when the kernel is not safe to fork: refuse (default) or run detached")  # fmt: skip
    p.add_argument("--no-view", action="store_true")
    v["launch-function"] = Verb(p, _verb_launch_function)
    p = _parser("%finetune compare", "Overlay the loss curves of several runs on one chart.")
    p.add_argument("runs", nargs="+", help="two or more runs")
    p.add_argument("--key", default="loss", help="the metric to compare (default loss)")
    v["compare"] = Verb(p, _verb_compare)
    p = _parser("%finetune panel", "A form that builds a run config (and launches it) without YAML.")
    p.add_argument("run", nargs="?", default=None, help="fill the form from this run's config")
    v["panel"] = Verb(p, _verb_panel)
    p = _parser("%finetune estimate", "Will it fit? Memory estimate of a config file and the alternatives.")
    p.add_argument("config", help="a .yaml config file (or use %%finetune --estimate with a YAML cell)")
    v["estimate"] = Verb(p, _verb_estimate)
    p = _run_arg(_parser("%finetune record", "Save a run's record (config, plan, metrics) in this notebook."))
    v["record"] = Verb(p, _verb_record)
    p = _parser(
        "%finetune preview",
        "The first examples as the model sees them (chat template applied, masked tokens marked) and "
        "token-length statistics.",
    )
    p.add_argument("config", help="a .yaml config file, or a run (id, name, directory)")
    p.add_argument("-n", type=int, default=5, help="examples to show (default 5)")
    p.add_argument("--stats-rows", type=int, default=2000, help="rows measured for the statistics")
    v["preview"] = Verb(p, _verb_preview)
    p = _parser("%finetune serve", "Serve a run's model on 127.0.0.1 (OpenAI API), or stop serving.")
    p.add_argument("run", nargs="?", default=None, help="the run (with --stop: default all started here)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--base-only", action="store_true", help="serve only the base model, without the adapter")
    p.add_argument("--stop", action="store_true", help="stop the run's server (no RUN: all started here)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server to listen")
    v["serve"] = Verb(p, _verb_serve)
    p = _run_arg(_parser("%finetune chat", "Chat with a run's fine-tuned model (a widget; Close stops it)."))
    p.add_argument("--compare-base", action="store_true", help="show the base model's answer beside it")
    p.add_argument("--temperature", type=float, default=0.0, help="initial temperature (0: greedy)")
    p.add_argument("--max-tokens", type=int, default=128, help="initial max new tokens")
    p.add_argument("--top-p", type=float, default=1.0, help="initial top_p")
    v["chat"] = Verb(p, _verb_chat)
    p = _run_arg(_parser("%finetune eval", "Held-out loss and perplexity of a run (and lm-eval tasks)."))
    p.add_argument("--compare-base", action="store_true", help="measure the base model too, side by side")
    p.add_argument("--file", default=None, help="SFT data to measure on (default: the run's eval split)")
    p.add_argument("--tasks", nargs="+", default=None, help="lm-eval task names, task YAML files or dirs")
    p.add_argument("--limit", type=float, default=None, help="rows of data / per task (N or a fraction)")
    p.add_argument("--batch-size", type=int, default=8)
    v["eval"] = Verb(p, _verb_eval)
    p = _run_arg(_parser("%finetune export", "Save a run's model as a standalone directory (LoRA merged)."))
    p.add_argument("--to", required=True, help="the directory to write (new or empty)")
    p.add_argument("--merge", action=argparse.BooleanOptionalAction, default=True,
                   help="merge the adapter into the base (default); --no-merge: adapter only")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--overwrite", action="store_true", help="replace what is in --to")
    p.add_argument("--push-to-hub", default=None, metavar="REPO", help="then upload to this hub repo")
    p.add_argument("--public", action="store_true", help="create the hub repo public (default private)")
    v["export"] = Verb(p, _verb_export)
    p = _run_arg(_parser("%finetune tensorboard", "TensorBoard on a run's logs (report_to: tensorboard)."))
    p.add_argument("--stop", action="store_true", help="stop the TensorBoard started for this run")
    v["tensorboard"] = Verb(p, _verb_tensorboard)
    return v


VERBS = _verbs()


def _usage() -> str:
    lines = [
        "%%finetune [--name NAME] [--dry-run] [--wait] [--no-view]   (cell: YAML config)",
        "%finetune VERB ...   verbs:",
    ]
    for verb in VERBS.values():
        lines.append(
            f"  {verb.parser.format_usage().strip().removeprefix('usage: ')}  -- {verb.parser.description}"
        )
    return "\n".join(lines)


@magics_class
class FinetuneMagics(Magics):
    @line_cell_magic
    def finetune(self, line: str, cell: str | None = None) -> Any:
        try:
            if cell is None:
                return self._line(line)
            return self._cell(line, cell)
        except NbtrainError as e:
            raise UsageError(str(e)) from None

    def _line(self, line: str) -> Any:
        words = shlex.split(line)
        if not words:
            raise UsageError(_usage())
        verb = VERBS.get(words[0])
        if verb is None:
            close = difflib.get_close_matches(words[0], list(VERBS), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"unknown verb '{words[0]}'.{hint} Verbs: {', '.join(VERBS)}.\n{_usage()}")
        args = verb.parser.parse_args(words[1:])
        return verb.handler(args)

    def _cell(self, line: str, cell: str) -> Any:
        args = _cell_parser().parse_args(shlex.split(line))
        if args.estimate:
            return _show_estimate(api.estimate(cell))
        if args.probe:
            return api.probe(cell, name=args.name)
        prep = api.prepare(cell, name=args.name)
        if args.dry_run:
            from IPython.display import display

            est = prep.plan.estimate
            if est is not None:
                from nbtrain.memory import estimate_for, load_model_config
                from nbtrain.ui.estimate_chart import estimate_figure

                mc = load_model_config(prep.resolved.config.model)
                if mc is not None:
                    display(estimate_figure(estimate_for(prep.resolved.config, prep.plan, mc),
                                            est["capacity_bytes"]))  # fmt: skip
            return prep  # the plan as the cell's result, below its memory chart
        run = api.start(prep)
        try:
            if args.wait:
                _wait(run, None)
            elif not args.no_view:
                _show(run)
        finally:
            # below the view, and also for a failed run: the notebook keeps the run's record (config,
            # plan, estimate; final metrics once it ends), its evidence for a course
            record(run)
        return run


FinetuneMagics.finetune.__doc__ = f"Fine-tune from a notebook.\n\n{_usage()}"


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(FinetuneMagics)


def unload_ipython_extension(ipython: Any) -> None:
    for view in _VIEWS:
        view.close()
    _VIEWS.clear()
    close_records()
