"""Your own hooks from the notebook: what ``hooks:`` may name, how each is called, and capturing them.

    hooks:
      callbacks: [PrintEvery, log_to_sheet]   # TrainerCallback subclasses (made with no arguments),
                                              # instances of one, or functions called as on_log
      compute_metrics: exact_match            # fn(eval_pred) -> {name: number}, logged as eval_<name>
      loss: focal_loss                        # fn(outputs, labels, num_items_in_batch=None) -> loss
      preprocess: add_system_prompt           # fn(row) -> row, each data row before it is formatted
      preprocess_logits_for_metrics: argmax   # fn(logits, labels) -> tensor kept for compute_metrics

Each name is a function or class defined in the notebook (or imported into it). They are captured as every
notebook object a run uses is (``nbtrain.contract.notebook``): looked up and cloudpickled when the run is
prepared, so a missing name, an object that cannot be called the way the trainer calls it, or one that
cannot be serialised is refused before anything starts, naming the key; ``start`` writes them to
``<run dir>/hooks.pkl`` and the worker loads them from there (``nbtrain.worker.hooks``).

Nothing here imports transformers: a callback class is recognised by the names of its bases.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbtrain.contract.notebook import dumps, missing, notebook_namespace, pickle_problem
from nbtrain.contract.notebook import load as load_captured

HOOKS_FILE = "hooks.pkl"

# Each hook and how the trainer calls it (what the refusals and the docs say).
CALLS = {
    "callbacks": "a transformers TrainerCallback subclass (made with no arguments), an instance of one, or a "
    "function called at each log as on_log(args, state, control, logs=..., **kwargs)",
    "compute_metrics": "compute_metrics(eval_pred) -> dict of numbers; eval_pred.predictions are the "
    "logits (or what preprocess_logits_for_metrics returned), eval_pred.label_ids the labels",
    "loss": "loss(outputs, labels, num_items_in_batch=None) -> the loss tensor; outputs.logits are the "
    "model's, labels are not shifted",
    "preprocess": "preprocess(row) -> row: each data row as it is in the file, before data: columns: and "
    "the format; the columns it returns replace or add to the row's",
    "preprocess_logits_for_metrics": "preprocess_logits_for_metrics(logits, labels) -> tensor, per "
    "evaluation batch, kept for compute_metrics in place of the logits (e.g. logits.argmax(-1))",
}
KEYS = tuple(CALLS)

# (positional arguments, keyword arguments) each function hook is called with, to check it can be.
_ARGS: dict[str, tuple[int, tuple[str, ...]]] = {
    "compute_metrics": (1, ()),
    "loss": (2, ("num_items_in_batch",)),
    "preprocess": (1, ()),
    "preprocess_logits_for_metrics": (2, ()),
}
_EXAMPLE = {
    "compute_metrics": "def {name}(eval_pred)",
    "loss": "def {name}(outputs, labels, num_items_in_batch=None)",
    "preprocess": "def {name}(row)",
    "preprocess_logits_for_metrics": "def {name}(logits, labels)",
}


def is_callback_class(cls: type) -> bool:
    """Whether ``cls`` subclasses transformers' TrainerCallback (told from its bases' names, so the kernel
    imports nothing: a notebook that defines one imported transformers itself)."""
    return any(
        c.__name__ == "TrainerCallback" and c.__module__.startswith("transformers") for c in cls.__mro__
    )


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: the call will tell


def _call_problem(key: str, name: str, fn: Callable[..., Any]) -> str | None:
    sig = _signature(fn)
    if sig is None:
        return None
    n, kw = _ARGS[key]
    try:
        sig.bind(*([None] * n), **dict.fromkeys(kw))
    except TypeError:
        example = _EXAMPLE[key].format(name=name)
        return f"{name}{sig} cannot be called as the trainer calls it: {CALLS[key]}. Write it as {example}"
    return None


def _callback_problem(name: str, obj: Any) -> str | None:
    if isinstance(obj, type):
        if not is_callback_class(obj):
            return (
                f"{name} is a class that does not subclass transformers.TrainerCallback; write it as "
                f"class {name}(TrainerCallback) with the on_* methods you need (from transformers import "
                f"TrainerCallback), or give a function called as on_log"
            )
        sig = _signature(obj)
        try:
            if sig is not None:
                sig.bind()
        except TypeError:
            return (
                f"{name}{sig} needs arguments, and a callback class is made with none; make one in the "
                f"notebook (my_callback = {name}(...)) and name that instance in hooks: callbacks"
            )
        return None
    if is_callback_class(type(obj)):
        return None  # an instance, used as it is
    if not callable(obj):
        return f"{name!r} in the notebook is a {type(obj).__name__}, not a TrainerCallback or a function"
    sig = _signature(obj)
    if sig is None:
        return None
    varkw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    try:
        sig.bind(None, None, None, logs=None)
    except TypeError:
        varkw = False
    if varkw:
        return None
    return (
        f"{name}{sig} cannot be called as a callback function is: on_log(args, state, control, logs=..., "
        f"**kwargs) (the Trainer passes the model, optimizer and more as keywords). Write it as "
        f"def {name}(args, state, control, logs=None, **kwargs)"
    )


def capture(
    hooks: Mapping[str, Any], namespace: Mapping[str, Any] | None = None
) -> tuple[bytes | None, list[tuple[tuple[str | int, ...], str]]]:
    """Serialise the objects ``hooks:`` names ({key: name, callbacks: [names]}); returns (payload,
    [(key path under hooks:, problem), ...]). The payload is None when there are problems or no hooks."""
    ns = notebook_namespace() if namespace is None else namespace
    entries: dict[str, Any] = {}
    objects: list[Any] = []
    problems: list[tuple[tuple[str | int, ...], str]] = []

    def one(path: tuple[str | int, ...], key: str, name: str) -> dict[str, Any] | None:
        obj = ns.get(name)
        noun = "callback (class or function)" if key == "callbacks" else "function"
        if obj is None:
            problems.append((path, f"hooks: {key}: {missing(name, ns, noun)} ({CALLS[key]})"))
            return None
        if key == "callbacks":
            problem = _callback_problem(name, obj)
        elif not callable(obj):
            problem = f"{name!r} in the notebook is a {type(obj).__name__}, not a function ({CALLS[key]})"
        else:
            problem = _call_problem(key, name, obj)
        problem = problem or pickle_problem(obj, f"{name!r}")
        if problem:
            problems.append((path, f"hooks: {key}: {problem}"))
            return None
        objects.append(obj)
        return {"name": name, "obj": obj}

    for key in KEYS:
        value = hooks.get(key)
        if value is None:
            continue
        if key == "callbacks":
            found = [one((key, i), key, name) for i, name in enumerate(value)]
            entries[key] = [e for e in found if e is not None]
        else:
            entries[key] = one((key,), key, value)
    if problems or not entries:
        return None, problems
    return dumps(entries, objects), []


def load(path: str | Path) -> dict[str, Any]:
    """The hooks of a run: {key: {"name", "obj"}, "callbacks": [{"name", "obj"}, ...]}. The file is loaded
    only when it is yours and nobody else can write it (nbtrain.contract.pickles); else ``UntrustedPickle``
    says why."""
    entries: dict[str, Any] = load_captured(path)
    return entries


__all__ = ["CALLS", "HOOKS_FILE", "KEYS", "capture", "is_callback_class", "load"]
