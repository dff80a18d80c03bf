"""A sweep from the form: several values typed in one box, separated by commas (``1e-4, 3e-4, 1e-3`` for the
learning rate), are values to try; the config then gets a ``sweep:`` section whose ``space`` holds them, by
the box's key, and the Sweep group (method, trials, metric, pruning, at once) shows. A loaded config's sweep
over keys the form has boxes for fills those boxes back; the rest of its space is kept as it was.

Only the boxes of one YAML scalar that a sweep varies take several values (the hyperparameters and the LoRA
numbers); what a sweep over anything else needs (a data mix, a range) is written in the YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbtrain.ui.panel.fields import UNSET, PanelField, format_scalar, parse_scalar

SWEEPABLE_SECTIONS = ("train", "lora")


@dataclass(frozen=True)
class Several:
    """A box holding several values: each one a trial tries."""

    values: tuple[Any, ...]


def sweepable(f: PanelField) -> bool:
    return f.kind == "scalar" and f.section in SWEEPABLE_SECTIONS


def read(f: PanelField, text: str) -> Any:
    """What a scalar box holds: ``Several`` for two values or more separated by commas (in a box that a sweep
    can vary), else the one value (``parse_scalar``)."""
    if sweepable(f) and "," in text and not text.strip().startswith(("[", "{")):
        parts = [parse_scalar(p) for p in text.split(",")]
        values = tuple(p for p in parts if p is not UNSET)
        if len(values) >= 2:
            return Several(values)
        return values[0] if values else UNSET
    return parse_scalar(text)


def lift(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with every ``Several`` moved out of its section into ``sweep: space:`` by its dotted key,
    beside the keys a loaded config's space kept; a sweep's settings without any space are left out (they
    sweep nothing). Lists typed in boxes are a grid unless a method was picked."""
    settings = cfg.pop("sweep", None)
    loaded = settings.get("space") if isinstance(settings, dict) else None
    space: dict[str, Any] = dict(loaded) if isinstance(loaded, dict) else {}
    for section in SWEEPABLE_SECTIONS:
        sub = cfg.get(section)
        if not isinstance(sub, dict):
            continue
        lifted = [k for k, v in sub.items() if isinstance(v, Several)]
        for key in lifted:
            space[f"{section}.{key}"] = list(sub.pop(key).values)
        if lifted and not sub:  # emptied by the sweep (an empty section the config wrote stays)
            cfg.pop(section)
    if space:
        settings = dict(settings) if isinstance(settings, dict) else {}
        settings.pop("space", None)
        cfg["sweep"] = {"space": space, **({} if "method" in settings else {"method": "grid"}), **settings}
    return cfg


def fill(extra: dict[str, Any], spec: Mapping[str, PanelField]) -> dict[str, str]:
    """A loaded config's sweep (kept in ``extra``: the form has no box for ``sweep.space``): each list of
    scalars over a key with a box, as the box shows it (``a, b, c``), taken out of the kept space."""
    settings = extra.get("sweep")
    space = settings.get("space") if isinstance(settings, dict) else None
    boxes: dict[str, str] = {}
    if not isinstance(space, dict):
        return boxes
    for key in list(space):
        f, values = spec.get(key), space[key]
        scalars = isinstance(values, list) and len(values) >= 2
        if f is not None and sweepable(f) and scalars and all(_scalar(v) for v in values):
            boxes[key] = ", ".join(format_scalar(v) for v in values)
            del space[key]
    return boxes


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool)) and "," not in str(v)
