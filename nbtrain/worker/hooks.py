"""The notebook's hooks inside the training process: loaded from ``RUN_DIR/hooks.pkl`` (captured by the
kernel when the run started, ``nbtrain.contract.hooks``), each wrapped so that an exception it raises
fails the run naming the hook, and handed to the data loader and the trainer::

    hooks = load_run_hooks(paths, cfg)   # RunHooks (empty without hooks:)
    hooks.preprocess                     # fn(row) -> row, mapped over the rows (nbtrain.worker.data)
    hooks.trainer_kwargs()               # compute_metrics, compute_loss_func, preprocess_logits_for_metrics
    hooks.callbacks                      # TrainerCallback instances
    hooks.metric_keys                    # the names compute_metrics returned (the run-directory callback
                                         # marks them in metrics.jsonl, for the dashboard)

A hook that raises ends the run as failed with ``HookError``: "hooks: compute_metrics (my_metrics) raised
ValueError: ...", the hook's own traceback chained below it in the log and in status.json.

Callbacks: a TrainerCallback subclass is made with no arguments, an instance is used as it is, and a
function becomes the ``on_log`` of a callback of its own (called as ``on_log(args, state, control,
logs=..., **kwargs)``). The callbacks come before the run-directory callback, so what one adds to
``logs`` in ``on_log`` is written to metrics.jsonl too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract import hooks as contract
from nbtrain.contract.rundir import RunPaths
from nbtrain.worker.lean import unhide_packages


class HookError(RuntimeError):
    """A hook of the notebook raised, or returned what the trainer cannot use; the message names the key
    and the object, and the hook's own error is chained (its traceback is in the log)."""


def guard(key: str, name: str, fn: Callable[..., Any], check: Callable[[Any], Any] | None = None) -> Any:
    """``fn`` that raises ``HookError`` naming ``hooks: key (name)`` when it raises, or when ``check`` finds
    a problem with what it returned."""
    label = f"hooks: {key} ({name})"

    @functools.wraps(fn, updated=())  # a class's __dict__ is not a function's
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except HookError:
            raise
        except Exception as e:  # the user's code: every failure is reported as the hook's
            raise HookError(f"{label} raised {type(e).__name__}: {e}") from e
        problem = check(out) if check is not None else None
        if problem:
            raise HookError(f"{label} {problem}")
        return out

    return call


def _a_row(out: Any) -> str | None:
    if isinstance(out, Mapping):
        return None
    return f"returned {type(out).__name__}, not the row: return a dict of columns"


def _a_loss(out: Any) -> str | None:
    if hasattr(out, "backward"):
        return None
    return f"returned {type(out).__name__}, not a loss tensor: keep it a torch tensor (no .item(), float())"


def _a_dict(out: Any) -> str | None:
    if isinstance(out, Mapping):
        return None
    return f"returned {type(out).__name__}, not a dict of metrics ({{'name': number}})"


def _event_names() -> list[str]:
    from transformers import TrainerCallback

    return [n for n in vars(TrainerCallback) if n.startswith("on_")]


def guard_callback(callback: Any, name: str) -> Any:
    """``callback`` (a TrainerCallback instance) with each event method its class defines wrapped by
    ``guard``, on the instance itself: it stays what it is (its class, its state for checkpoints)."""
    from transformers import TrainerCallback

    for event in _event_names():
        own = getattr(type(callback), event, None)
        if own is None or own is getattr(TrainerCallback, event):
            continue
        # (a class with __slots__ is left as it is: its errors still fail the run, without the hook's name)
        with contextlib.suppress(AttributeError):
            setattr(callback, event, guard("callbacks", f"{name}.{event}", getattr(callback, event)))
    return callback


def function_callback(fn: Callable[..., Any], name: str) -> Any:
    """A TrainerCallback whose ``on_log`` is ``fn``."""
    from transformers import TrainerCallback

    guarded = guard("callbacks", name, fn)

    class NotebookFunction(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            return guarded(args, state, control, **kwargs)

    NotebookFunction.__name__ = NotebookFunction.__qualname__ = f"on_log:{name}"
    return NotebookFunction()


def make_callback(obj: Any, name: str) -> Any:
    """The trainer's callback for one entry of ``hooks: callbacks``."""
    if isinstance(obj, type):
        made = guard("callbacks", name, obj)()  # its __init__ raising names it too
        return guard_callback(made, obj.__name__)
    if contract.is_callback_class(type(obj)):
        return guard_callback(obj, name)
    return function_callback(obj, name)


@dataclass
class RunHooks:
    """The hooks of one run, wrapped; every field None (or empty) when ``hooks:`` does not name it."""

    preprocess: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    compute_metrics: Callable[..., Any] | None = None
    loss: Callable[..., Any] | None = None
    preprocess_logits_for_metrics: Callable[..., Any] | None = None
    callbacks: list[Any] = field(default_factory=list)
    metric_keys: set[str] = field(default_factory=set)  # what compute_metrics returned so far

    def trainer_kwargs(self) -> dict[str, Any]:
        """The trainer's own keywords for the hooks that have one."""
        out: dict[str, Any] = {}
        if self.compute_metrics is not None:
            out["compute_metrics"] = self.compute_metrics
        if self.loss is not None:
            out["compute_loss_func"] = self.loss
        if self.preprocess_logits_for_metrics is not None:
            out["preprocess_logits_for_metrics"] = self.preprocess_logits_for_metrics
        return out


def _entries(paths: RunPaths) -> dict[str, Any]:
    path = paths.root / contract.HOOKS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the hooks: objects are captured there when the run is started from a "
            f"notebook (nbtrain.finetune / %%finetune); start the run again"
        )
    # The lean rules hide scipy from this process; the notebook's code may use it (or sklearn, which does).
    unhide_packages(("scipy",))
    return contract.load(path)


def _named(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (cfg.get("hooks") or {}).items() if v}


def load_run_preprocess(paths: RunPaths, cfg: Mapping[str, Any]) -> Any:
    """Only the run's ``hooks: preprocess``, wrapped (None without one): for a job that reads the run's rows
    as training did (the evaluation), and makes none of its callbacks."""
    if not _named(cfg).get("preprocess"):
        return None
    e = _entries(paths)["preprocess"]
    return guard("preprocess", e["name"], e["obj"], _a_row)


def load_run_hooks(paths: RunPaths, cfg: Mapping[str, Any]) -> RunHooks:
    """The run's hooks from ``RUN_DIR/hooks.pkl`` (none when its config has no ``hooks:``)."""
    named = _named(cfg)
    if not named:
        return RunHooks()
    entries = _entries(paths)
    hooks = RunHooks()
    for key in ("preprocess", "loss", "preprocess_logits_for_metrics"):
        if key in entries:
            e = entries[key]
            check = {"preprocess": _a_row, "loss": _a_loss}.get(key)
            setattr(hooks, key, guard(key, e["name"], e["obj"], check))
    if "compute_metrics" in entries:
        e = entries["compute_metrics"]
        checked = guard("compute_metrics", e["name"], e["obj"], _a_dict)

        def compute_metrics(*args: Any, **kwargs: Any) -> Any:
            out = checked(*args, **kwargs)
            hooks.metric_keys.update(str(k) for k in out)
            return out

        hooks.compute_metrics = compute_metrics
    hooks.callbacks = [make_callback(e["obj"], e["name"]) for e in entries.get("callbacks", [])]
    print(f"nbtrain: hooks: {describe(named)}", flush=True)
    return hooks


def describe(named: Mapping[str, Any]) -> str:
    return "; ".join(f"{k} {', '.join(v) if isinstance(v, list) else v}" for k, v in named.items())


__all__ = ["HookError", "RunHooks", "guard", "load_run_hooks", "load_run_preprocess", "make_callback"]
