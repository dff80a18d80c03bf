"""Describe TRL's SFTConfig fields as JSON, so the kernel can validate ``train:`` without importing TRL.

    python -m nbtrain.worker.introspect OUT.json

The kernel ships a snapshot (nbtrain/assets/sft_fields.json) made by this module for the pinned
versions, and re-runs it in a subprocess when the installed TRL/transformers differ.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any


def _classify(tp: Any) -> tuple[set[str], list[str] | None, bool]:
    kinds: set[str] = set()
    choices: list[str] | None = None
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
        elif isinstance(origin, type) and issubclass(origin, enum.Enum):
            kinds.add("str")
            choices = sorted({str(m.value) for m in origin})
        elif origin in (list, tuple):
            kinds.add("list")
        elif origin is dict:
            kinds.add("dict")
        else:
            kinds.add("any")
    return kinds, choices, optional


def _jsonable(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    try:
        json.dumps(v)
        return v
    except TypeError:
        return str(v)


def field_specs() -> dict[str, Any]:
    import transformers
    import trl
    from trl import SFTConfig

    try:
        hints = typing.get_type_hints(SFTConfig)
    except Exception:  # noqa: BLE001 - a forward ref we cannot resolve: fall back to raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(SFTConfig):
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
    return {"versions": {"trl": trl.__version__, "transformers": transformers.__version__}, "fields": fields}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(field_specs(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
