"""The verb table: every ``%finetune VERB`` and every ``nbtrain VERB`` is generated from it.

A verb is its name, its help, its arguments (``argparse.add_argument`` specs), the control function(s)
it calls (``call``: parsed arguments -> a result, the same on every surface) and how that result is
shown in a notebook (``notebook``: display it, return the cell's result) and printed in a terminal
(``terminal``: print it, return the exit code). A verb without ``terminal`` only makes sense in a
notebook (a widget, a function of the kernel): the CLI lists it and says where to run it.

This module is the table, naming each verb's functions; they live by family beside it: ``runs`` (run
and a ``%%finetune`` cell, estimate, probe, list, stop, checkpoint, resume, attach, wait,
launch-function, compare, record), ``views`` (a run followed to its end: live views, wait, progress
lines), ``models`` (serve, chat, eval, export, gguf-setup), ``background`` (warm, tensorboard) and
``config`` (panel, preview). A verb whose answer is one line is a lambda here.

``%%finetune`` cells are the ``run`` verb with the cell body as its config, so a cell, ``%finetune run
FILE`` and ``nbtrain run FILE`` take the same options.

Nothing here imports IPython, widgets or plotly at import time: the CLI imports this package.
"""

from __future__ import annotations

import argparse
import difflib
from typing import TYPE_CHECKING, Any

from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Arg, Args, Verb, arg
from nbtrain.ui.verbs import background, config, models, runs, sweeps
from nbtrain.ui.verbs.views import follow_in_terminal, wait_in_notebook

if TYPE_CHECKING:
    from nbtrain.control import start
    from nbtrain.control.config import reference
    from nbtrain.control.jobs import grading
    from nbtrain.control.runs import run as run_core
    from nbtrain.ui import run as run_api
    from nbtrain.ui import text as ui_text
else:
    # Imported on first use, not by `%load_ext nbtrain` (< 0.3 s): the config schema, presets and
    # planner (pydantic, YAML) and the metrics reader (numpy) are most of the verb table's import time.
    start = lazy_module("nbtrain.control.start")
    grading = lazy_module("nbtrain.control.jobs.grading")
    run_core = lazy_module("nbtrain.control.runs.run")
    run_api = lazy_module("nbtrain.ui.run")
    ui_text = lazy_module("nbtrain.ui.text")
    reference = lazy_module("nbtrain.control.config.reference")

# ------------------------------------------------------------------ answers shared by several verbs


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


def _run_arg(**options: Any) -> Arg:
    return arg("run", help="run id, unique id prefix, name, or run directory", **options)


# ---------------------------------------------------------------------------------------- table

_CONFIG_OR_RUN = "a .yaml config file, or a run (id, name, directory)"

TABLE: tuple[Verb, ...] = (
    Verb(
        "run",
        "Validate, plan and start a run from a YAML config file (in a notebook also: a %%finetune "
        "cell, with the same options).",
        (arg("config", help="a .yaml config file"), *runs.RUN_OPTIONS),
        runs.call_run,
        runs.run_in_notebook,
        runs.run_in_terminal,
    ),
    Verb(
        "sweep",
        "A sweep (a config with a sweep: section, started like a run): status (its view; a table in a "
        "terminal), list, stop, resume, extend --trials N, clone --trial N --set KEY=VALUE, best (its config "
        "as a %%finetune cell).",
        sweeps.SWEEP_ARGS,
        sweeps.call_sweep,
        sweeps.sweep_in_notebook,
        sweeps.sweep_in_terminal,
    ),
    Verb(
        "list",
        "List runs (a DataFrame in a notebook, a table in a terminal).",
        (),
        lambda a: ui_text.runs_table(start.runs()),
        runs.list_in_notebook,
        runs.list_in_terminal,
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
        runs.stop,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "checkpoint",
        "Save a checkpoint after the current step, keep training.",
        (_run_arg(),),
        runs.checkpoint,
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
        runs.resume_in_notebook,
        runs.resume_in_terminal,
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
        runs.attach_in_notebook,
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
        runs.launch_function,
        runs.launched_in_notebook,
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
        runs.compare_in_notebook,
        runs.compare_in_terminal,
    ),
    Verb(
        "panel",
        "A form that builds a run config (and launches it) without YAML.",
        (arg("run", nargs="?", default=None, help="fill the form from this run's config"),),
        config.panel,
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
        lambda a: runs.estimate(a.config, on=a.on),
        lambda r, a: runs.show_estimate(r),
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
        runs.record_in_terminal,
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
        config.preview,
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
        models.serve,
        models.serve_in_notebook,
        models.serve_in_terminal,
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
        models.chat,
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
        models.call_eval,
        models.eval_in_notebook,
        models.eval_in_terminal,
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
        models.export,
        models.export_in_notebook,
        models.export_in_terminal,
    ),
    Verb(
        "gguf-setup",
        "Set up llama.cpp for --format gguf: builds llama-cpp-python once per machine (~5 min on 2 cores).",
        (),
        models.gguf_setup,
        _print_in_notebook,
        _print,
    ),
    Verb(
        "tensorboard",
        "TensorBoard on a run's logs (report_to: tensorboard).",
        (_run_arg(), arg("--stop", action="store_true", help="stop the TensorBoard started for this run")),
        background.tensorboard,
        background.tensorboard_in_notebook,
        background.tensorboard_in_terminal,
    ),
    Verb(
        "warm",
        "The warm process that starts runs in a fraction of a second: status (default), start or stop.",
        (arg("action", nargs="?", default="status", choices=["status", "start", "stop"]),),
        background.warm,
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
