"""Describe a TRL config's fields (or peft's LoraConfig's) as JSON, so the kernel can validate ``train:``
(and ``lora:``) without importing TRL or peft.

    python -m nbtrain.worker.introspect OUT.json [OBJECTIVE|lora]  # one config (default sft)
    python -m nbtrain.worker.introspect --assets DIR               # all: DIR/<name>_fields.json

The kernel ships snapshots (nbtrain/assets/<name>_fields.json: SFTConfig, DPOConfig, ORPOConfig,
KTOConfig, RewardConfig, GRPOConfig, RLOOConfig, peft's LoraConfig) made by this module for the pinned
versions, and re-runs it in a subprocess when the installed TRL/transformers (or peft) differ.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import json
import os
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbtrain.contract.objectives import OBJECTIVES


def _classify(tp: Any) -> tuple[set[str], list[str] | None, bool]:
    kinds: set[str] = set()
    choices: list[str] | None = None
    literal_strs: set[str] = set()
    plain_str = False
    optional = False
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    for a in args:
        origin = typing.get_origin(a) or a
        if a is type(None):
            optional = True
        elif a is bool:
            kinds.add("bool")
        elif a is int:
            kinds.add("int")
        elif a is float:
            kinds.add("float")
        elif a is str:
            kinds.add("str")
            plain_str = True
        elif origin is typing.Literal:  # peft's init_lora_weights: bool | Literal["gaussian", "pissa", ...]
            for v in typing.get_args(a):
                if isinstance(v, str):
                    literal_strs.add(v)
                kinds.add({bool: "bool", int: "int", str: "str"}.get(type(v), "any"))
        elif isinstance(origin, type) and issubclass(origin, enum.Enum):
            kinds.add("str")
            choices = sorted({str(m.value) for m in origin})
        elif origin in (list, tuple):
            kinds.add("list")
        elif origin is dict:
            kinds.add("dict")
        else:
            kinds.add("any")
    if literal_strs and not plain_str:  # strings restricted to the literal ones (any string otherwise)
        choices = sorted({*(choices or []), *literal_strs})
    return kinds, choices, optional


def _jsonable(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    try:
        json.dumps(v)
        return v
    except TypeError:
        return str(v)


LORA = "lora"  # peft's LoraConfig: the fields ``lora:`` takes


def config_class(objective: str) -> Any:
    """The TRL config class of ``objective`` (some live in trl.experimental, which warns on import), or
    peft's LoraConfig for ``lora``."""
    if objective == LORA:
        from peft import LoraConfig

        return LoraConfig
    module, name = OBJECTIVES[objective].config_class.split(":")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return getattr(importlib.import_module(module), name)


def field_specs(objective: str = "sft") -> dict[str, Any]:
    cls = config_class(objective)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a forward ref we cannot resolve: fall back to raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        kinds, choices, optional = _classify(hints.get(f.name, f.type))
        if f.default is not dataclasses.MISSING:
            default = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _jsonable(f.default_factory())
        else:
            default = None
        help_text = str(f.metadata.get("help", "")).strip().split("\n")[0][:200]
        fields[f.name] = {
            "kinds": sorted(kinds),
            "choices": choices,
            "optional": optional,
            "default": default,
            "help": help_text,
        }
    if objective == LORA:
        import peft

        return {"versions": {"peft": peft.__version__}, "config": cls.__name__, "fields": fields}
    import transformers
    import trl

    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    if objective == "sft":  # the SFT snapshot keeps its original shape (no "config" key)
        return {"versions": versions, "fields": fields}
    return {"versions": versions, "config": cls.__name__, "fields": fields}


@functools.cache
def _defaults(objective: str) -> dict[str, Any]:
    return {name: spec["default"] for name, spec in field_specs(objective)["fields"].items()}


def default(objective: str, field: str) -> Any:
    """The installed TRL config's default for ``field`` of ``objective`` (what the kernel's snapshot,
    ``control.config.trainargs.default``, records for it): the worker's one place to read one, never
    re-typed. Imports TRL the first time."""
    return _defaults(objective)[field]


def value(args: Mapping[str, Any], field: str, objective: str = "sft") -> Any:
    """``args[field]`` where the run's training args set it, else TRL's default for it (``default``)."""
    return args[field] if field in args else default(objective, field)


def _write(out: Path, objective: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(field_specs(objective), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0] == "--assets" and len(argv) != 2) or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--assets":
        for name in (*OBJECTIVES, LORA):
            _write(Path(argv[1]) / f"{name}_fields.json", name)
        return 0
    objective = argv[1] if len(argv) == 2 else "sft"
    if objective not in OBJECTIVES and objective != LORA:
        print(f"unknown objective {objective!r}; one of {', '.join(OBJECTIVES)}", file=sys.stderr)
        return 2
    _write(Path(argv[0]), objective)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
