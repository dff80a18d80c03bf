"""Problems collected into one ConfigError: each with its key path as written, its YAML line and
source, secrets masked; pydantic's errors turned into plain words (allowed values, a close match,
the section a misplaced key belongs in)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import trainargs
from nbtrain.control.config.schema.run import RunConfig
from nbtrain.control.config.schema.sections import (
    DataSettings,
    DistributedSettings,
    LoraSettings,
    QuantSettings,
    SlurmSettings,
)

# ----------------------------------------------------------------------------------------- YAML lines


def line_map(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in a YAML document to the 1-based line of its key."""
    out: dict[tuple[str, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = (*path, str(k.value))
                out[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = (*path, str(i))
                out[p] = v.start_mark.line + 1
                walk(v, p)

    if root is not None:
        walk(root, ())
    return out


class Problems:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.map = line_map(text) if text else {}
        self.items: list[Problem] = []
        # Secrets found in the config: never repeated in a problem (its YAML line is shown masked), and
        # their keys get the secret's problem only (not also "unknown key").
        self.secrets: set[str] = set()
        self.secret_paths: set[str] = set()

    def add(self, path: tuple[str | int, ...], message: str, *, secret: str | None = None) -> None:
        shown = ".".join(str(x) for x in path)
        if secret is not None:
            self.secrets.add(secret)
            self.secret_paths.add(shown)
        elif shown in self.secret_paths:
            return
        p = tuple(str(x) for x in path)
        line = None
        while p and line is None:
            line = self.map.get(p)
            if line is None:
                p = p[:-1]
        src = self.lines[line - 1] if line and line <= len(self.lines) else None
        for s in (s for s in self.secrets if len(s) >= 4):  # shorter would mask ordinary words
            src = src.replace(s, "***") if src is not None else None
            message = message.replace(s, "***")
        self.items.append(Problem(shown, message, line, src))


# ------------------------------------------------------------------------------------- schema errors


def _fields_of(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at ``loc`` (for did-you-mean on unknown keys)."""
    cur: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list of sub-models (data: train: [{path: ...}, ...])
        f = cur.model_fields.get(str(part))
        if f is None:
            return []
        ann = f.annotation
        args = [x for a in getattr(ann, "__args__", (ann,)) for x in getattr(a, "__args__", (a,))]
        sub = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not sub:
            return []
        cur = sub[0]
    return list(cur.model_fields)


# pydantic names the branch of a union in an error's location (eval_split.float, train.str, ...); these
# are those names for the plain types, the others hold brackets (list[...], function-after[...]).
_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _is_branch_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _BRANCH_TAGS or "[" in part or "(" in part)


def _clean_loc(loc: tuple[Any, ...], raw: Any) -> tuple[Any, ...]:
    """Drop pydantic's union-branch tags from an error location, keeping the keys the user wrote (and a
    missing key, which is a real location too)."""
    out: list[Any] = []
    cur, missing = raw, False
    for part in loc:
        if _is_branch_tag(part) and not (isinstance(cur, dict) and part in cur):
            continue  # the tag of a union's branch
        if missing or (isinstance(cur, dict) and part not in cur):
            out.append(part)  # a key the config lacks (or one below it)
            missing = True
        elif isinstance(cur, dict) or (
            isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        ):
            cur = cur[part]
            out.append(part)
    return tuple(out)


def _other_branch(loc: tuple[Any, ...], raw: Any) -> bool:
    """An error from the ``str`` branch of a union (``train: str | list[...]``) when the user wrote a
    list there: the list branch's own errors say what is wrong, this one only adds noise."""
    cur = raw
    for part in loc:
        if part == "str" and isinstance(cur, list | dict):
            return True
        if (isinstance(cur, dict) and part in cur) or (
            isinstance(cur, list) and isinstance(part, int) and part < len(cur)
        ):
            cur = cur[part]
    return False


# What a type error's kind expects, in words (a union's branches are joined: "'auto' or an integer").
_EXPECTS = {
    "float_type": "a number",
    "int_type": "an integer",
    "string_type": "text",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "none_required": "null",
}


def _literal_choices(e: Any) -> tuple[list[str], str]:
    """The choices of a ``literal_error``: the names (for did-you-mean) and pydantic's text of them."""
    expected = str(e.get("ctx", {}).get("expected", ""))
    return re.findall(r"'([^']*)'", expected), expected


def _choice_message(value: Any, e: Any) -> str:
    names, expected = _literal_choices(e)
    close = trainargs.closest(value, names) if isinstance(value, str) and names else []
    hint = f"; did you mean {trainargs.one_of([repr(c) for c in close])}?" if close else "."
    return f"{value!r} is not allowed{hint} Choose one of {expected}"


def _union_message(errors: list[Any], value: Any) -> str:
    """One message for a value no branch of a union accepts: what each branch expects, joined."""
    expects: list[str] = []
    names: list[str] = []
    for e in errors:
        if e["type"] == "literal_error":
            names += _literal_choices(e)[0]
            expects.append(_literal_choices(e)[1])
        elif e["type"] in _EXPECTS and _EXPECTS[e["type"]] not in expects:
            expects.append(_EXPECTS[e["type"]])
    if "a number" in expects and "an integer" in expects:
        expects.remove("an integer")  # a number may be whole
    close = trainargs.closest(value, names) if isinstance(value, str) and names else []
    hint = trainargs.yaml_number_hint(value) if {"a number", "an integer"} & set(expects) else ""
    msg = f"{value!r} is not valid here: expected {trainargs.one_of(expects)}{hint}"
    return msg + (f"; did you mean {trainargs.one_of([repr(c) for c in close])}?" if close else "")


# Keys written in the wrong section, or by another tool's name: where nbtrain takes them.
_ELSEWHERE = {
    "lora_r": "lora.r",
    "rank": "lora.r",
    "lora_rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
    "lora_target": "lora.target_modules",
    "bnb_4bit_quant_type": "quantization.quant_type",
    "bnb_4bit_use_double_quant": "quantization.double_quant",
    "quant_bits": "quantization.bits",
    "dataset": "data.train",
    "datasets": "data.train",
    "train_file": "data.train",
    "train_data": "data.train",
    "dataset_path": "data.train",
    "eval_file": "data.eval",
    "eval_dataset": "data.eval",
    "val_set_size": "data.eval_split",
    "model_name": "model",
    "model_name_or_path": "model",
    "model_id": "model",
    "base_model": "model",
    "pretrained_model_name_or_path": "model",
    "num_gpus": "distributed.num_processes",
    "nproc_per_node": "distributed.num_processes",
    "num_nodes": "distributed.nodes",
    "zero_stage": "distributed.strategy",
}


def sections() -> dict[tuple[str, ...], type[BaseModel]]:
    return {
        (): RunConfig,
        ("data",): DataSettings,
        ("lora",): LoraSettings,
        ("quantization",): QuantSettings,
        ("distributed",): DistributedSettings,
        ("distributed", "slurm"): SlurmSettings,
    }


def home_of(key: str, section: tuple[str, ...], objective: str) -> tuple[str, ...] | None:
    """Where ``key``, unknown in ``section``, belongs: its full path in another section, or None."""
    if section not in sections() and section != ("train",):
        return None  # an entry of a list (data: train: [{path: ...}]): its own keys only
    if key in _ELSEWHERE:
        home = tuple(_ELSEWHERE[key].split("."))
        return home if home[:-1] != section else None
    for where, model in sections().items():
        if where != section and key in model.model_fields and key not in ("train", "data"):
            return (*where, key)
    if section != ("train",) and objective in OBJECTIVES:
        fields = trainargs.fields_for(objective)
        name = key if key in fields else trainargs.RENAMED.get(key)
        if name in fields and name not in trainargs.MANAGED:
            return ("train", name)
    return None


def elsewhere_message(key: str, section: tuple[str, ...], home: tuple[str, ...]) -> str:
    """``epochs`` at the top level: 'put it under train: as train.num_train_epochs'."""
    here = "at the top level" if not section else f"in the {': '.join(section)}: section"
    dotted = ".".join(home)
    if len(home) == 1:
        return f"'{key}' is not a key {here}: put it at the top level, as {home[0]}: (not indented)"
    tail = " (the TRL/transformers name)" if home[0] == "train" and home[-1] != key else ""
    return f"'{key}' is not a key {here}: put it under {': '.join(home[:-1])}: as {dotted}{tail}"


def schema_problems(err: ValidationError, raw: Any, probs: Problems) -> None:
    objective = raw.get("objective", "sft") if isinstance(raw, dict) else "sft"
    objective = objective if isinstance(objective, str) and objective in OBJECTIVES else "sft"
    # A union reports once per branch (eval_split: abc is neither a float nor an int): the errors are
    # grouped by the location the user wrote, and each location gets one message.
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for e in err.errors():
        if not _other_branch(tuple(e["loc"]), raw):
            groups.setdefault(_clean_loc(tuple(e["loc"]), raw), []).append(e)
    for loc, errors in groups.items():
        typed = [e for e in errors if e["type"] in _EXPECTS or e["type"] == "literal_error"]
        # A validator's own message (or a range) says more than "wrong type" from a branch it left.
        specific = [e for e in errors if e not in typed]
        e = specific[0] if specific else errors[0]
        kind, value = e["type"], e.get("input")
        if len(typed) > 1 and not specific:
            probs.add(loc, _union_message(typed, value))
        elif kind == "extra_forbidden":
            key, section = str(loc[-1]), tuple(str(x) for x in loc[:-1] if not isinstance(x, int))
            home = home_of(key, section, objective)
            if home is not None:
                probs.add(loc, elsewhere_message(key, section, home))
                continue
            allowed = _fields_of(RunConfig, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else "."
            probs.add(loc, f"unknown key '{key}'{hint} Allowed here: {', '.join(allowed)}")
        elif kind == "missing":
            probs.add(loc, "required key is missing")
        elif kind == "literal_error":
            probs.add(loc, _choice_message(value, e))
        elif kind.endswith("_type") or kind in {"model_type", "dict_type"}:
            hint = trainargs.yaml_number_hint(value) if kind in ("float_type", "int_type") else ""
            probs.add(loc, f"{value!r} has the wrong type: {e['msg'].lower()}{hint}")
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            probs.add(loc, f"{msg} (got {value!r})" if not isinstance(value, dict) else msg)


def config_values(raw: Any) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every value of a parsed config with its key path, each mapping and list that YAML aliases share
    looked into once (an alias bomb's repeats are not walked again): the walk of the rules that look at
    every value (secrets, NUL bytes)."""
    seen: set[int] = set()
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict | list):
            if id(value) in seen:
                continue
            seen.add(id(value))
        yield path, value
        if isinstance(value, dict):
            stack.extend(((*path, str(k)), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))


def problems_error(text: str, items: list[tuple[tuple[str | int, ...], str]]) -> ConfigError:
    """A ConfigError for problems found after load_config (the notebook's reward functions), pointing
    at the YAML lines of ``text`` as load_config's own problems do."""
    probs = Problems(text)
    for path, message in items:
        probs.add(path, message)
    return ConfigError(sorted(probs.items, key=lambda p: (p.line or 0, p.path)))
