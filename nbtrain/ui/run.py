"""The run handle a notebook user holds: the control layer's ``Run`` plus the verbs that sit above it.

``nbtrain.control.runs.run.Run`` knows a run directory: its state, metrics, logs, stop and wait. The verbs
(resume, serve, chat, evaluate, export, plot, TensorBoard) are control functions that take a run, and
two of them (chat, plot) are notebook views, so they cannot be methods of the control handle without an
import cycle. This class adds them; every function of the Python API that returns a run (``nbtrain.
finetune``, ``start``, ``resume``, ``get_run``, ``runs``, ``last_run``, ``launch_function``) returns one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import RunFailed
from nbtrain.control import start as _start
from nbtrain.control.runs import run as _core

if TYPE_CHECKING:
    from nbtrain.control.jobs.evaluate import EvalReport
    from nbtrain.control.jobs.export import ExportResult
    from nbtrain.control.jobs.serve import ServerHandle
    from nbtrain.control.launch.tracking import TensorBoardLaunched
    from nbtrain.control.start import Prepared
    from nbtrain.ui.chat import ChatWidget

RunStatus = _core.RunStatus


class Run(_core.Run):
    """A handle on one run directory, with everything a notebook does with a run."""

    def wait(self, timeout: float | None = None, *, poll: float = 0.5, check: bool = True) -> RunStatus:
        """Block until the run ends (see the control Run's wait); the run records this kernel shows of it
        (nbtrain.record) are brought to the final state before it returns."""
        from nbtrain.control.jobs.grading import finalize_records

        st = super().wait(timeout, poll=poll, check=False)
        finalize_records(self)
        if check and st.state == "failed":
            raise RunFailed(self.failure_report(st))
        return st

    def resume(self) -> Run:
        """Continue this stopped or failed run from its last complete checkpoint (see nbtrain.resume)."""
        return handle(_start.resume(self))

    def plot(self) -> Any:
        """A static Plotly figure of the run (loss, lr, grad norm, tokens/s, memory per rank)."""
        from nbtrain.ui.figures import run_plot

        return run_plot(self)

    # ------------------------------------------------------------------- trying the model (serve)
    def serve(self, *, port: int = 0, base_only: bool = False, **kwargs: Any) -> ServerHandle:
        """Start (or reuse) this run's OpenAI-compatible server on 127.0.0.1; ``.url``, ``.stop()``."""
        from nbtrain.control.jobs.serve import serve

        return serve(self, port=port, base_only=base_only, **kwargs)

    def stop_serving(self) -> list[str]:
        """Stop this run's server (its process group)."""
        from nbtrain.control.jobs.serve import stop_serving

        return stop_serving(self)

    def generate(self, prompts: str | list[Any], **kwargs: Any) -> list[str]:
        """Replies of the tuned model (``base=True``: the base) to ``prompts``, greedy by default; see
        ``nbtrain.control.jobs.serve.generate`` for max_new_tokens, temperature, top_p, seed, stop, chat and
        (a
        vision-language run) images."""
        from nbtrain.control.jobs.serve import generate

        return generate(self, prompts, **kwargs)

    def chat(self, compare_base: bool = False, **settings: Any) -> ChatWidget:
        """A chat widget answered by the tuned model (beside the base model with ``compare_base``)."""
        from nbtrain.ui.chat import ChatWidget

        return ChatWidget(self, compare_base=compare_base, **settings)

    # ------------------------------------------------------------------ evaluate, export, track
    def evaluate(self, *, compare_base: bool = True, **kwargs: Any) -> EvalReport:
        """Held-out loss and perplexity (and lm-eval ``tasks=``) of this run's model; see nbtrain.evaluate."""
        from nbtrain.control.jobs.evaluate import evaluate

        return evaluate(self, compare_base=compare_base, **kwargs)

    def export(
        self, to: str | Path, *, merge: bool = True, dtype: str = "auto", **kwargs: Any
    ) -> ExportResult:
        """Write this run's model to ``to`` (merged into the base by default); see nbtrain.export."""
        from nbtrain.control.jobs.export import export

        return export(self, to=to, merge=merge, dtype=dtype, **kwargs)

    def tensorboard(self) -> TensorBoardLaunched:
        """Start (or find) TensorBoard on this run's event files (``train: report_to: [tensorboard]``)."""
        from nbtrain.control.launch.tracking import tensorboard

        return tensorboard(self.dir)


def handle(run: _core.Run) -> Run:
    """The notebook handle of a control-layer run (the same directory, nothing re-read)."""
    if isinstance(run, Run):
        return run
    return Run(run.dir, run_id=run.id, name=run._name)


# The Python API's run-returning functions: the control functions, handing back notebook handles.
def get_run(ref: str | Path | _core.Run) -> Run:
    """A run by id, unique id prefix, name (the newest run of that name) or run directory path."""
    return handle(_core.get_run(ref))


def runs() -> list[Run]:
    """All known runs, oldest first."""
    return [handle(r) for r in _core.all_runs()]


def last_run() -> Run:
    """The run this process started most recently."""
    return handle(_start.last_run())


def start(prep: Prepared) -> Run:
    """Create the run directory and start the detached worker(s); see nbtrain.control.start.start."""
    return handle(_start.start(prep))


def resume(ref: str | Path | _core.Run) -> Run:
    """Continue a stopped or failed run from its last complete checkpoint, in the same run directory."""
    return handle(_start.resume(ref))


def finetune(
    config: str | Path | dict[str, Any],
    name: str | None = None,
    *,
    namespace: Mapping[str, Any] | None = None,
) -> Run:
    """Validate, plan and start a fine-tuning run in the background; returns its handle at once.
    ``namespace``: where the names in ``rewards:`` and ``hooks:`` are looked up (default: the notebook's)."""
    return handle(_start.start(_start.prepare(config, name=name, namespace=namespace)))


def launch_function(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Run:
    """Run a training function written in the notebook through accelerate's notebook_launcher; see
    nbtrain.control.notebook_launch.launch_function."""
    from nbtrain.control.notebook_launch import launch_function as launch

    return handle(launch(fn, *args, **kwargs))
