"""Runs: create a run directory, find runs, read their state and metrics, stop and wait for them.

``Run`` is the handle every surface returns. It holds only the run directory's path; every call reads
the directory again, so a handle made in another kernel (or after a restart) sees the same run.
"""

from __future__ import annotations

import html
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain import launch, registry
from nbtrain.errors import NbtrainError, RunFailed, RunNotFound
from nbtrain.paths import runs_root
from nbtrain.rundir import (
    ACTIVE_STATES,
    COMPLETE_MARKER,
    TERMINAL_STATES,
    RunPaths,
    read_json,
    read_jsonl,
    request_control,
    tail_text,
    write_status,
)

if TYPE_CHECKING:
    import pandas as pd

    from nbtrain.evaluate import EvalReport
    from nbtrain.export import ExportResult
    from nbtrain.serve.control import ServerHandle
    from nbtrain.tracking import TensorBoardLaunched
    from nbtrain.ui.chat import ChatWidget

LOST_MESSAGE = (
    "the run's processes ended without writing a final state (killed, out of memory, or the "
    "machine restarted)"
)


@dataclass
class RunStatus:
    state: str
    step: int = 0
    max_steps: int | None = None
    error: dict[str, Any] | None = None
    updated: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    def describe(self) -> str:
        prog = f"step {self.step}/{self.max_steps}" if self.max_steps else f"step {self.step}"
        s = f"{self.state} ({prog})"
        if self.error:
            s += f": {self.error.get('type', 'error')}: {self.error.get('message', '')}"
        return s


def _slug(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-._")
    return (s or "run")[:40]


def new_run_id(name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}-{secrets.token_hex(2)}"


class Run:
    """A handle on one run directory."""

    def __init__(self, run_dir: str | Path, *, run_id: str | None = None, name: str | None = None) -> None:
        self.dir = Path(run_dir)
        self.paths = RunPaths(self.dir)
        self.id = run_id or self.dir.name
        self._name = name

    # ------------------------------------------------------------------------------------ reading
    @property
    def name(self) -> str:
        if self._name is None:
            self._name = str(self.resolved.get("name") or self.id)
        return self._name

    @property
    def resolved(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = read_json(self.paths.resolved)
            return data
        except FileNotFoundError:
            raise RunNotFound(f"{self.dir} is not a run directory (no resolved.json)") from None

    @property
    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = self.resolved["config"]
        return cfg

    @property
    def output_dir(self) -> Path:
        return self.paths.output

    def status(self) -> RunStatus:
        """The run's state; a run whose processes are gone without a final state reads as failed (lost)."""
        raw = self._read_status()
        if raw.get("state") in ACTIVE_STATES:
            info = launch.read_launch(self.paths)
            if info is not None and launch.is_local(info) and not launch.run_alive(info):
                raw = self._read_status()  # it may have finished between the two reads
                if raw.get("state") in ACTIVE_STATES:
                    err = {
                        "type": "lost",
                        "message": LOST_MESSAGE,
                        "log_tail": tail_text(self.paths.rank_log(0), 30),
                    }
                    raw = write_status(self.paths, "failed", error=err)
        st = RunStatus(
            state=str(raw.get("state", "queued")),
            step=int(raw.get("step") or 0),
            max_steps=raw.get("max_steps"),
            error=raw.get("error"),
            updated=raw.get("updated"),
            summary=raw.get("summary") or {},
        )
        return st

    def _read_status(self) -> dict[str, Any]:
        for _ in range(3):
            try:
                data: dict[str, Any] = read_json(self.paths.status)
                return data
            except FileNotFoundError:
                return {"state": "queued"}
            except ValueError:
                time.sleep(0.05)  # replaced atomically, so this is only a reader on a strange filesystem
        return {"state": "queued"}

    def metrics(self) -> pd.DataFrame:
        """Every logged step from rank 0 as a DataFrame (one row per record in metrics.jsonl)."""
        import pandas as pd

        return pd.DataFrame(read_jsonl(self.paths.metrics))

    def system(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(read_jsonl(self.paths.system))

    def checkpoint(self) -> None:
        """Ask the run to save a checkpoint after its current step, without stopping."""
        if self.status().done:
            raise NbtrainError(f"run {self.id} is not running")
        request_control(self.paths, "checkpoint")

    def resume(self) -> Run:
        """Continue this stopped or failed run from its last complete checkpoint (see nbtrain.resume)."""
        from nbtrain.api import resume

        return resume(self)

    def plot(self) -> Any:
        """A static Plotly figure of the run (loss, lr, grad norm, tokens/s, memory per rank)."""
        from nbtrain.ui.figures import run_plot

        return run_plot(self)

    def logs(self, n: int = 40) -> str:
        return tail_text(self.paths.rank_log(0), n)

    # ---------------------------------------------------------------- trying the model (nbtrain.serve)
    def serve(self, *, port: int = 0, base_only: bool = False, **kwargs: Any) -> ServerHandle:
        """Start (or reuse) this run's OpenAI-compatible server on 127.0.0.1; ``.url``, ``.stop()``."""
        from nbtrain.serve.control import serve

        return serve(self, port=port, base_only=base_only, **kwargs)

    def stop_serving(self) -> list[str]:
        """Stop this run's server (its process group)."""
        from nbtrain.serve.control import stop_serving

        return stop_serving(self)

    def generate(self, prompts: str | list[Any], **kwargs: Any) -> list[str]:
        """Replies of the tuned model (``base=True``: the base) to ``prompts``, greedy by default; see
        ``nbtrain.serve.control.generate`` for max_new_tokens, temperature, top_p, seed, stop, chat."""
        from nbtrain.serve.control import generate

        return generate(self, prompts, **kwargs)

    def chat(self, compare_base: bool = False, **settings: Any) -> ChatWidget:
        """A chat widget answered by the tuned model (beside the base model with ``compare_base``)."""
        from nbtrain.ui.chat import ChatWidget

        return ChatWidget(self, compare_base=compare_base, **settings)

    # ------------------------------------------------------ evaluate, export, track (nbtrain.export ...)
    def evaluate(self, *, compare_base: bool = False, **kwargs: Any) -> EvalReport:
        """Held-out loss and perplexity (and lm-eval ``tasks=``) of this run's model; see nbtrain.evaluate."""
        from nbtrain.evaluate import evaluate

        return evaluate(self, compare_base=compare_base, **kwargs)

    def export(
        self, to: str | Path, *, merge: bool = True, dtype: str = "auto", **kwargs: Any
    ) -> ExportResult:
        """Write this run's model to ``to`` (merged into the base by default); see nbtrain.export."""
        from nbtrain.export import export

        return export(self, to=to, merge=merge, dtype=dtype, **kwargs)

    def tensorboard(self) -> TensorBoardLaunched:
        """Start (or find) TensorBoard on this run's event files (``train: report_to: [tensorboard]``)."""
        from nbtrain.tracking import tensorboard

        return tensorboard(self.dir)

    # --------------------------------------------------------------------------------- controlling
    def stop(self, timeout: float = 60.0) -> RunStatus:
        """Ask the run to stop after its current step (it saves a checkpoint), then wait for it.

        After ``timeout`` seconds the run's own process group is killed. Returns the final status.
        """
        st = self.status()
        if st.done:
            return st
        info = launch.read_launch(self.paths)
        request_control(self.paths, "stop")
        if info is None:
            write_status(self.paths, "stopped", note="stopped before it was launched")
            registry.update(self.id, state="stopped")
            return self.status()
        if not launch.is_local(info):
            raise NbtrainError(f"run {self.id} runs on host {info.get('host')}; stop it from there")
        if info.get("notebook"):
            from nbtrain.notebook_launch import stop_notebook_run

            how = stop_notebook_run(self, info, timeout)
        else:
            how = launch.terminate_group(info, grace=timeout)
        final = self._read_status()
        if final.get("state") in ACTIVE_STATES:
            write_status(
                self.paths, "stopped", note=f"stop: process group {how} before it wrote a final state"
            )
        st = self.status()
        registry.update(self.id, state=st.state)
        return st

    def wait(self, timeout: float | None = None, *, poll: float = 0.5, check: bool = True) -> RunStatus:
        """Block until the run ends. With ``check`` (default) a failed run raises RunFailed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if st.done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still {st.describe()} after {timeout} s")
            time.sleep(poll)
        registry.update(self.id, state=st.state)
        if check and st.state == "failed":
            raise RunFailed(self.failure_report(st))
        return st

    def failure_report(self, st: RunStatus | None = None) -> str:
        st = st or self.status()
        err = st.error or {}
        tail = err.get("log_tail") or self.logs(20)
        return (
            f"run {self.id} failed: {err.get('type', 'error')}: {err.get('message', '')}\n"
            f"--- last lines of {self.paths.rank_log(0)} ---\n{tail}"
        )

    # ----------------------------------------------------------------------------------- display
    def __repr__(self) -> str:
        # No state here: a notebook keeps a repr forever, and a state in it would go stale.
        return f"<Run {self.name!r} {self.id} — run.status() for its state>"

    def _repr_html_(self) -> str:
        st = self.status()
        return (
            f"<b>nbtrain run</b> <code>{html.escape(self.id)}</code>: "
            f"{html.escape(st.describe())}<br><small>{html.escape(str(self.dir))}</small>"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.dir.resolve() == self.dir.resolve()

    def __hash__(self) -> int:
        return hash(str(self.dir.resolve()))


def create_run_dir(name: str, config_text: str, resolved: dict[str, Any]) -> Run:
    """Make the directory of a new run and register it (state ``queued``)."""
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(name)
    paths = RunPaths(root / run_id)
    paths.root.mkdir(parents=False, exist_ok=False)
    paths.make()
    paths.config.write_text(config_text, encoding="utf-8")
    from nbtrain.rundir import atomic_write_json

    atomic_write_json(paths.resolved, {**resolved, "id": run_id, "name": name, "run_dir": str(paths.root)})
    write_status(paths, "queued")
    registry.add(run_id, name, paths.root, "queued")
    return Run(paths.root, run_id=run_id, name=name)


def all_runs() -> list[Run]:
    """Every registered run whose directory still exists, oldest first."""
    return [Run(r.run_dir, run_id=r.id, name=r.name) for r in registry.rows() if Path(r.run_dir).is_dir()]


def get_run(ref: str | Path | Run) -> Run:
    """A run by id, unique id prefix, name (the newest run of that name) or run directory path."""
    if isinstance(ref, Run):
        return ref
    text = str(ref)
    if isinstance(ref, Path) or "/" in text or text.startswith("."):
        p = Path(text).expanduser()
        if (p / "resolved.json").exists():
            return Run(p.resolve())
        raise RunNotFound(f"no run directory at {p}")
    found = registry.find(text)
    if not found:
        known = ", ".join(r.id for r in registry.rows()[-5:]) or "none yet"
        raise RunNotFound(f"no run matches {text!r}; recent runs: {known} (list them with %finetune list)")
    ids = {r.id for r in found}
    if len(ids) > 1 and all(r.name != text for r in found):
        raise RunNotFound(f"{text!r} matches several runs ({', '.join(sorted(ids))}); give more of the id")
    r = found[0]
    return Run(r.run_dir, run_id=r.id, name=r.name)


def last_checkpoint(run: Run, *, prune: bool = False) -> Path | None:
    """The newest checkpoint the worker marked complete; with ``prune``, incomplete ones are deleted."""
    import shutil

    best: tuple[int, Path] | None = None
    for d in run.paths.checkpoints.glob("checkpoint-*"):
        try:
            step = int(d.name.split("-", 1)[1])
        except ValueError:
            continue
        if not (d / COMPLETE_MARKER).exists():
            if prune:
                shutil.rmtree(d, ignore_errors=True)
            continue
        if best is None or step > best[0]:
            best = (step, d)
    return best[1] if best else None
