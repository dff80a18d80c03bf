"""GRPO reward functions: the built-ins, and capturing the notebook's own for a detached worker.

    rewards: [my_reward, format_reward, length_reward]

Each name is a function defined in the notebook or a built-in below. A worker is a separate process
that outlives the kernel, so the notebook's functions are serialised with cloudpickle when the run is
prepared (kernel side: stdlib + cloudpickle, never torch) and written to ``<run dir>/rewards.pkl``;
the worker loads them from there. Built-ins travel by name and come from the worker's nbtrain.

TRL calls every reward as ``f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
<each dataset column>=..., ...)`` and wants one float (or None) per completion back, so a reward must
take ``**kwargs``. A completion is a string, or a list of messages when the prompts are conversational.
"""

from __future__ import annotations

import difflib
import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nbtrain.contract.pickles import read_trusted

REWARDS_FILE = "rewards.pkl"

# ------------------------------------------------------------------------------------------ built-ins

_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)


def completion_text(completion: Any) -> str:
    """The text of one completion: itself, or the content of its messages when conversational."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    return str(completion)


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 for the reasoning layout ``<think>...</think><answer>...</answer>``, 0.5 when only an
    ``<answer>...</answer>`` block is there, else 0.0."""
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(1.0 if _THINK_ANSWER.match(text) else 0.5 if _ANSWER.search(text) else 0.0)
    return out


def length_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Favours concise completions: 1.0 up to ``target_length`` characters, falling linearly to 0.0 at
    twice that. ``target_length`` is read from a dataset column of that name when there is one
    (default 200 characters)."""
    targets = kwargs.get("target_length") or [200] * len(completions)
    out = []
    for c, target in zip(completions, targets, strict=False):
        n, t = len(completion_text(c)), max(1, int(target))
        out.append(max(0.0, min(1.0, 2.0 - n / t)))
    return out


BUILTINS: dict[str, Callable[..., list[float]]] = {
    "format_reward": format_reward,
    "length_reward": length_reward,
}

# --------------------------------------------------------------------------------- kernel: capture


def notebook_namespace() -> Mapping[str, Any]:
    """The namespace names in ``rewards:`` are looked up in: the IPython user namespace when running in a
    kernel (the magic, the panel, ``nbtrain.finetune`` from a cell), else the ``__main__`` module."""
    if "IPython" in sys.modules:  # only ask IPython when it is already there; never import it
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            ns: Mapping[str, Any] = ip.user_ns
            return ns
    main = sys.modules.get("__main__")
    return vars(main) if main is not None else {}


def _by_value(fn: Any) -> list[Any]:
    """Modules of ``fn`` that the worker cannot import (a .py file next to the notebook): cloudpickle
    pickles functions of importable modules by reference, which would fail in the worker's directory."""
    import cloudpickle

    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(mod, "__file__", None)
    if mod is None or mod.__name__ == "__main__" or not path:
        return []
    if mod.__name__ in cloudpickle.list_registry_pickle_by_value():
        return []  # the user registered it already; leave their registration alone
    try:
        Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return []
    return [mod]


def _signature_problem(name: str, fn: Callable[..., Any]) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: TRL will tell
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return (
        f"reward function {name}{sig} must accept **kwargs: TRL calls it as {name}(prompts=..., "
        f"completions=..., completion_ids=..., trainer_state=..., <each dataset column>=...) and takes "
        f"one float per completion back. Write it as def {name}(completions, **kwargs)"
    )


def capture(
    names: Sequence[str], namespace: Mapping[str, Any] | None = None
) -> tuple[bytes | None, list[tuple[int, str]]]:
    """Serialise the rewards named in ``rewards:``; returns (payload, [(index, problem), ...]).

    A name found in the namespace is the notebook's function (even if it shadows a built-in); other
    names must be built-ins. The payload is None when there are problems.
    """
    import cloudpickle

    ns = notebook_namespace() if namespace is None else namespace
    entries: list[dict[str, Any]] = []
    problems: list[tuple[int, str]] = []
    for i, name in enumerate(names):
        fn = ns.get(name)
        if fn is None or fn is BUILTINS.get(name):
            if name in BUILTINS:
                entries.append({"name": name, "builtin": name})
                continue
            known = [k for k, v in ns.items() if callable(v) and not k.startswith("_")] + list(BUILTINS)
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? Otherwise define" if close else "define"
            problems.append(
                (
                    i,
                    f"no function named {name!r} in the notebook; {hint} it in a cell run before this "
                    f"one, or use a built-in reward ({', '.join(BUILTINS)})",
                )
            )
            continue
        if not callable(fn):
            problems.append((i, f"{name!r} in the notebook is a {type(fn).__name__}, not a function"))
            continue
        sig_problem = _signature_problem(name, fn)
        if sig_problem:
            problems.append((i, sig_problem))
            continue
        modules = _by_value(fn)
        try:
            for m in modules:
                cloudpickle.register_pickle_by_value(m)
            cloudpickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - any pickling failure gets the same advice
            problems.append(
                (
                    i,
                    f"reward function {name!r} cannot be serialised for the training process "
                    f"({type(e).__name__}: {e}); make it self-contained: import inside it, and do not "
                    f"capture open files, locks, generators or live connections",
                )
            )
            continue
        finally:
            for m in modules:
                cloudpickle.unregister_pickle_by_value(m)
        entries.append({"name": name, "fn": fn, "by_value": [m.__name__ for m in modules]})
    if problems:
        return None, problems
    # Several rewards may come from one local module: register it once (unregistering twice fails).
    by_value = list({n: sys.modules[n] for e in entries for n in e.get("by_value", [])}.values())
    try:
        for m in by_value:
            cloudpickle.register_pickle_by_value(m)
        payload: bytes = cloudpickle.dumps(entries)
    finally:
        for m in by_value:
            cloudpickle.unregister_pickle_by_value(m)
    return payload, []


# ---------------------------------------------------------------------------------- worker: load


def load(path: str | Path) -> list[Callable[..., Any]]:
    """The reward functions of a run, in the order of ``rewards:``. The file is loaded only when it is
    yours and nobody else can write it (nbtrain.contract.pickles); else ``UntrustedPickle`` says why."""
    import cloudpickle

    entries = cloudpickle.loads(read_trusted(path))
    return [BUILTINS[e["builtin"]] if "builtin" in e else e["fn"] for e in entries]
