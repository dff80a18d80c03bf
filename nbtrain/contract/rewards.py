"""The rewards of GRPO and RLOO: the built-ins, the notebook's own functions captured for a detached
worker, and reward models.

    rewards: [my_reward, format_reward, length_reward]
    rewards: [{model: rm-run}, format_reward]       # a reward model, with functions or alone

Each name is a function defined in the notebook or a built-in below. ``{model: ...}`` is a reward model
(a sequence classifier with one output): an ``objective: reward`` run (its id, name or directory), a model
folder or a Hub id; the kernel resolves it before anything starts (``nbtrain.control.config.rewardmodels``)
and the worker loads it (``nbtrain.worker.tuned.load_reward_model``). The notebook's functions are
captured as every notebook object a run uses is (``nbtrain.contract.notebook``: cloudpickle, when the run
is prepared) and written to ``<run dir>/rewards.pkl``; the worker loads them from there. Built-ins travel
by name and come from the worker's nbtrain.

TRL calls every reward as ``f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
<each dataset column>=..., ...)`` and wants one float (or None) per completion back, so a reward must
take ``**kwargs``. A completion is a string, or a list of messages when the prompts are conversational.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.notebook import dumps, missing, notebook_namespace, pickle_problem
from nbtrain.contract.notebook import load as load_captured

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

# ------------------------------------------------------------------------------------- reward models


@dataclass(frozen=True)
class RewardModel:
    """A ``{model: ...}`` entry of ``rewards:`` as the kernel resolved it: ``source`` is an nbtrain run
    directory (objective: reward), a model folder (absolute paths) or a Hub id."""

    source: str


def label(entry: Any) -> str:
    """How an entry of ``rewards:`` is shown (the dry run, the log): a function's name, or the model's."""
    if isinstance(entry, RewardModel):
        return f"model {entry.source}"
    if isinstance(entry, Mapping) and "model" in entry:
        return f"model {entry['model']}"
    model = getattr(entry, "model", None)  # the config's {model: ...} entry
    return f"model {model}" if isinstance(model, str) else str(getattr(entry, "__name__", entry))


# --------------------------------------------------------------------------------- kernel: capture


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
    names: Sequence[str | RewardModel], namespace: Mapping[str, Any] | None = None
) -> tuple[bytes | None, list[tuple[int, str]]]:
    """Serialise the rewards named in ``rewards:``; returns (payload, [(index, problem), ...]).

    A name found in the namespace is the notebook's function (even if it shadows a built-in); other
    names must be built-ins. A ``RewardModel`` (resolved by the kernel) travels as its source. The
    payload is None when there are problems.
    """
    ns = notebook_namespace() if namespace is None else namespace
    entries: list[dict[str, Any]] = []
    problems: list[tuple[int, str]] = []
    for i, name in enumerate(names):
        if isinstance(name, RewardModel):
            entries.append({"name": label(name), "model": name.source})
            continue
        fn = ns.get(name)
        if fn is None or fn is BUILTINS.get(name):
            if name in BUILTINS:
                entries.append({"name": name, "builtin": name})
                continue
            hint = missing(name, ns, also=list(BUILTINS))
            problems.append((i, f"{hint}, or use a built-in reward ({', '.join(BUILTINS)})"))
            continue
        if not callable(fn):
            problems.append((i, f"{name!r} in the notebook is a {type(fn).__name__}, not a function"))
            continue
        problem = _signature_problem(name, fn) or pickle_problem(fn, f"reward function {name!r}")
        if problem:
            problems.append((i, problem))
            continue
        entries.append({"name": name, "fn": fn})
    if problems:
        return None, problems
    return dumps(entries, [e["fn"] for e in entries if "fn" in e]), []


# ---------------------------------------------------------------------------------- worker: load


def load(path: str | Path) -> list[Callable[..., Any] | RewardModel]:
    """The rewards of a run, in the order of ``rewards:``: functions, and the reward models to load. The
    file is loaded only when it is yours and nobody else can write it (nbtrain.contract.pickles); else
    ``UntrustedPickle`` says why."""
    entries = load_captured(path)
    return [
        BUILTINS[e["builtin"]] if "builtin" in e else RewardModel(e["model"]) if "model" in e else e["fn"]
        for e in entries
    ]
