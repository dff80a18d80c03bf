"""The one source of meaning for nbtrain's config keys: each key's type, allowed values, default,
description and examples, read from the pydantic fields of ``config/schema/`` (``Field(description=...,
examples=...)``). The editor's completer (the server's config schema), ``%finetune help KEY`` and
docs/config.md all read it here; ``train:`` keys are the objective's TRL config, described by TRL.

    python -m nbtrain.control.config.reference           # writes docs/config.md
    python -m nbtrain.control.config.reference --check   # exit 1 when docs/config.md is stale
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.gendoc import write_or_check

DOC = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def schema_keys(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flatten a pydantic JSON schema into ``{"lora.r": {"type", "enum", "default", "description",
    "examples"}}``: one entry per key path, no $ref left to resolve (what an editor completer needs)."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return resolve(defs[ref.rsplit("/", 1)[-1]]) if isinstance(ref, str) else node

    def describe(node: dict[str, Any]) -> tuple[list[str], list[Any], dict[str, Any] | None]:
        """(types, enum values, nested object schema) of a property, through anyOf / $ref."""
        node = resolve(node)
        types: list[str] = []
        enum: list[Any] = list(node.get("enum", []))
        if "const" in node:
            enum.append(node["const"])
        nested = node if node.get("type") == "object" and "properties" in node else None
        if isinstance(node.get("type"), str):
            types.append(node["type"])
        for alt in node.get("anyOf", []):
            t, e, n = describe(alt)
            types += t
            enum += e
            nested = nested or n
        if "items" in node and isinstance(node["items"], dict) and nested is None:
            _, _, nested_items = describe(node["items"])
            nested = nested_items
        return types, enum, nested

    out: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        required = set(node.get("required", []))
        for name, prop in node.get("properties", {}).items():
            types, enum, nested = describe(prop)
            key = f"{prefix}{name}"
            info: dict[str, Any] = {
                "type": sorted(set(types)),
                "enum": enum or None,
                "required": name in required,
            }
            for k in ("default", "description", "examples"):
                if k in prop:
                    info[k] = prop[k]
            out[key] = info
            if nested is not None:
                walk(nested, key + ".")

    walk(schema, "")
    return out


@cache
def keys() -> dict[str, dict[str, Any]]:
    """nbtrain's own keys (``train:`` holds the objective's TRL config, see ``describe``)."""
    from nbtrain.control.config.schema import RunConfig

    return schema_keys(RunConfig.model_json_schema())


def _kind(info: dict[str, Any]) -> str:
    if info.get("enum"):
        return " | ".join(json.dumps(v) for v in info["enum"] if v is not None) + (
            " | null" if "null" in info["type"] or None in info["enum"] else ""
        )
    return " | ".join(info["type"]) or "any"


def describe(key: str, objective: str = "sft") -> str:
    """What ``key`` (a dotted path: ``lora.r``, ``data.train``, ``train.learning_rate``) means, its type,
    default and examples, in a few lines. Raises NbtrainError for a key nbtrain does not know, naming
    close ones."""
    key = key.strip().rstrip(":")
    if key.startswith("train."):
        from nbtrain.control.config import trainargs

        name = key.split(".", 1)[1]
        fields = trainargs.fields_for(objective)
        if name not in fields:
            close = trainargs.closest(name, list(fields))
            hint = f"; did you mean {', '.join('train.' + c for c in close)}?" if close else ""
            raise NbtrainError(f"train: {name} is not a field of the {objective} TRL config{hint}")
        spec = fields[name]
        lines = [f"train.{name}: {spec.help or '(TRL gives no description)'}"]
        lines.append(f"  type: {' | '.join(spec.kinds)}; default: {json.dumps(spec.default, default=str)}")
        return "\n".join(lines)
    table = keys()
    if key not in table:
        import difflib

        close = difflib.get_close_matches(key, list(table), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise NbtrainError(f"{key!r} is not an nbtrain config key{hint} (%finetune help lists them)")
    info = table[key]
    lines = [f"{key}: {info.get('description', '')}", f"  type: {_kind(info)}"]
    if "default" in info:
        lines[-1] += f"; default: {json.dumps(info['default'])}"
    if info.get("examples"):
        lines.append("  e.g. " + "; ".join(json.dumps(e) for e in info["examples"]))
    subs = [k for k in table if k.startswith(key + ".") and "." not in k[len(key) + 1 :]]
    if subs:
        lines.append(f"  keys: {', '.join(k[len(key) + 1 :] for k in subs)}")
    return "\n".join(lines)


def overview() -> str:
    """Every top-level key with its one-line meaning (``%finetune help`` without a key)."""
    table = keys()
    width = max(len(k) for k in table if "." not in k)
    rows = [f"  {k.ljust(width)}  {v.get('description', '')}" for k, v in table.items() if "." not in k]
    return (
        "nbtrain config keys (%finetune help KEY for one, e.g. lora.r or train.learning_rate):\n"
        + "\n".join(rows)
    )


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """docs/config.md: every nbtrain key, grouped by section."""
    table = keys()
    out = [
        "# Config reference",
        "",
        "Generated from the config's own fields (`nbtrain/control/config/schema/`) by "
        "`python -m nbtrain.control.config.reference`; a test fails when this page is stale. In a notebook "
        "`%finetune help KEY` says the same, and the editor's completer shows it. `train:` takes any field "
        "of the objective's TRL config (SFTConfig, DPOConfig, ...), described by TRL: `%finetune help "
        "train.learning_rate`.",
        "",
    ]
    parents = {k.split(".")[0] for k in table if "." in k}  # keys with keys of their own: a section each
    sections: dict[str, list[str]] = {}
    for key in table:
        top = key.split(".")[0]
        sections.setdefault(top if top in parents else "", []).append(key)
    for section, members in [("", sections.get("", [])), *[(s, m) for s, m in sections.items() if s]]:
        out += [f"## {section + ':' if section else 'Top-level keys'}", ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key in members:
            info = table[key]
            default = f"`{json.dumps(info['default'])}`" if "default" in info else ""
            default = "required" if info.get("required") else default
            meaning = info.get("description", "")
            if info.get("examples"):
                meaning += " E.g. " + ", ".join(f"`{json.dumps(e)}`" for e in info["examples"])
            out.append(f"| `{key}` | {_cell(_kind(info))} | {_cell(default)} | {_cell(meaning)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = markdown()
    return write_or_check(DOC, text, argv, "python -m nbtrain.control.config.reference")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
