"""A sweep's search space: each ``space:`` entry as an Optuna distribution, a trial's parameters set into
the base config by dotted key, and the few configs that stand for the whole space when it is checked
before anything starts (every choice, each range's ends)."""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError

if TYPE_CHECKING:  # the kernel never imports optuna: only the driver asks for distributions
    from optuna.distributions import BaseDistribution

PRIMITIVE = (type(None), bool, int, float, str)


def encode(choice: Any) -> Any:
    """A choice as Optuna keeps it: a number, string, bool or None as it is; a list or mapping (a data mix)
    as its JSON text, decoded again by :func:`decode`."""
    return choice if isinstance(choice, PRIMITIVE) else "json:" + json.dumps(choice, sort_keys=True)


def decode(value: Any) -> Any:
    return json.loads(value[5:]) if isinstance(value, str) and value.startswith("json:") else value


def distributions(space: dict[str, Any]) -> dict[str, BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, BaseDistribution] = {}
    for key, spec in space.items():
        if isinstance(spec, list):
            out[key] = CategoricalDistribution([encode(c) for c in spec])
            continue
        ((kind, bounds),) = spec.items()
        if kind in ("uniform", "log_uniform"):
            out[key] = FloatDistribution(float(bounds[0]), float(bounds[1]), log=kind == "log_uniform")
        else:
            step = bounds[2] if len(bounds) == 3 else 1
            out[key] = IntDistribution(bounds[0], bounds[1], log=kind == "log_int", step=step)
    return out


def apply(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The base config with each parameter set at its dotted key (sections made where missing)."""
    cfg = copy.deepcopy(base)
    for key, value in params.items():
        *parents, last = key.split(".")
        node = cfg
        for i, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise NbtrainError(
                    f"space: {key}: {where} is {child!r} in the config, not a section with keys; vary "
                    f"{where} itself"
                )
            node = child
        node[last] = decode(value)
    return cfg


def corners(space: dict[str, Any], limit: int = 6) -> list[dict[str, Any]]:
    """Parameter sets that stand for the space when checking it: every range at its low end, then at its
    high end, then each further choice of a list, at most ``limit`` sets."""

    def at(i: int) -> dict[str, Any]:
        out = {}
        for key, spec in space.items():
            if isinstance(spec, list):
                out[key] = spec[min(i, len(spec) - 1)]
            else:
                ((_, bounds),) = spec.items()
                out[key] = bounds[min(i, 1)]
        return out

    most = max([2] + [len(s) for s in space.values() if isinstance(s, list)])
    sets: list[dict[str, Any]] = []
    for i in range(most):
        s = at(i)
        if s not in sets:
            sets.append(s)
    return sets[:limit]


def describe(params: dict[str, Any]) -> str:
    """A trial's parameters in one line: ``learning_rate=3e-4 r=8`` (the last part of each key)."""

    def fmt(v: Any) -> str:
        v = decode(v)
        return f"{v:.3g}" if isinstance(v, float) else json.dumps(v) if not isinstance(v, str) else v

    return " ".join(f"{k.split('.')[-1]}={fmt(v)}" for k, v in params.items())
