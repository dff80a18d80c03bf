"""The verbs on a run's trained model: ``serve`` (an OpenAI API on 127.0.0.1; a terminal serves until
Ctrl-C), ``chat`` (the widget), ``eval`` (held-out loss, perplexity, lm-eval tasks), ``export`` (a
standalone folder or GGUF files; in a notebook without ``--to``, the export form) and ``gguf-setup``
(llama.cpp for GGUF) -- each verb's call and how its result is shown. The table (``nbtrain.ui.verbs``)
names them."""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Args, VerbUsageError

if TYPE_CHECKING:
    from nbtrain.control.runs import run as run_core
else:
    run_core = lazy_module("nbtrain.control.runs.run")  # on first use, not at `%load_ext` (ui/lazy.py)


def serve(a: Args) -> Any:
    from nbtrain.control.jobs.serve import serve as start_serving
    from nbtrain.control.jobs.serve import stop_serving

    if a.stop:
        return stop_serving(a.run)  # the lines of the servers stopped
    if a.run is None:
        raise VerbUsageError("name the RUN to serve, or pass --stop [RUN] to stop serving")
    return start_serving(a.run, port=a.port, base_only=a.base_only, timeout=a.timeout)


def _served_line(h: Any, key: str) -> str:
    how = "already running" if h.reused else "started"
    return (f"{how}: {', '.join(h.models.values())} at {h.url}  (OpenAI base URL; {h.engine} on {h.device}, "
            f"pid {h.pid}; API key: {key}")  # fmt: skip


def serve_in_notebook(result: Any, a: Args) -> None:
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


def serve_in_terminal(result: Any, a: Args) -> int:
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


def chat(a: Args) -> Any:
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


def call_eval(a: Args) -> Any:
    from nbtrain.control.jobs.evaluate import evaluate

    return evaluate(a.run, compare_base=a.compare_base, file=a.file, tasks=a.tasks, limit=a.limit,
                    batch_size=a.batch_size)  # fmt: skip


def eval_in_notebook(report: Any, a: Args) -> Any:
    from IPython.display import display

    from nbtrain.ui.figures import themed

    display(themed(report.figure()))  # nbtrain's one plotly theme (the report's figure is built in control)
    return report  # the table, as the cell's result


def eval_in_terminal(report: Any, a: Args) -> int:
    print(f"{report.table().to_string()}\n(saved in {report.path})")
    return 0


def export(a: Args) -> Any:
    from nbtrain.control.jobs.export import export as export_run

    if a.to is None:  # the notebook shows the export box; a terminal needs --to
        return None
    return export_run(a.run, to=a.to, merge=a.merge, dtype=a.dtype, overwrite=a.overwrite,
                      push_to_hub=a.push_to_hub, private=not a.public, format=a.format,
                      quant=a.quant)  # fmt: skip


def gguf_setup(a: Args) -> str:
    from nbtrain.control.jobs import llamacpp

    if llamacpp.missing() is None:
        return f"llama.cpp is ready (converter in {llamacpp.tools_dir()})"
    return f"llama.cpp set up: converter in {llamacpp.setup()}"


def export_in_notebook(result: Any, a: Args) -> Any:
    if result is None:
        from nbtrain.ui.export_box import ExportBox

        return ExportBox(a.run)
    return result


def export_in_terminal(result: Any, a: Args) -> int:
    if result is None:
        raise VerbUsageError("give --to DIR, the folder to write (in a notebook, without it a form opens)")
    print(repr(result))
    return 0
