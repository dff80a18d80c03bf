"""Notebook functions as the chat's tools: their JSON schemas, and running the calls the model makes.

    run.chat(tools=[get_weather, add])          # or: %finetune chat RUN --tools get_weather,add

A function becomes an OpenAI tool schema from its type hints and its docstring (Google style ``Args:``):
pydantic's JSON schema of its parameters, in the shape transformers' ``get_json_schema`` gives chat
templates (which the kernel cannot call: it imports torch). When the model calls one, the chat runs it in
the kernel with the call's JSON arguments and sends back what it returned (a string as it is, anything
else as JSON); a function that raises sends back its error, and its traceback shows in the chat. Nothing
here decides whether a call runs: the chat asks first unless told not to (``ChatWidget.confirm_tools``).
"""

from __future__ import annotations

import inspect
import json
import re
import traceback
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.errors import NbtrainError

MAX_RESULT_CHARS = 8000  # what goes back to the model of one result (its context is small)


@dataclass
class Tools:
    """The chat's tools: the functions by name, and their schemas as the server takes them."""

    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    schemas: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, functions: Iterable[Callable[..., Any]]) -> Tools:
        """Schemas of ``functions``; one that cannot be described is refused naming it and the fix."""
        tools = cls()
        problems = []
        for f in functions:
            name = getattr(f, "__name__", repr(f))
            if not callable(f):
                problems.append(f"{name!r} is not a function")
                continue
            try:
                schema = _schema(f)
            except Exception as e:  # noqa: BLE001 - no hints, no docstring, a type pydantic cannot describe
                problems.append(
                    f"{name}: {e}. A tool needs a type hint on every parameter and a docstring whose "
                    "first line says what it does, with an 'Args:' section describing each parameter"
                )
                continue
            if name in tools.functions:
                problems.append(f"two tools are named {name!r}")
            tools.functions[name] = f
            tools.schemas.append(schema)
        if problems:
            raise NbtrainError("cannot offer these tools: " + "; ".join(problems))
        return tools

    def __bool__(self) -> bool:
        return bool(self.functions)

    @property
    def names(self) -> list[str]:
        return list(self.functions)


def _schema(f: Callable[..., Any]) -> dict[str, Any]:
    """OpenAI's tool schema of ``f``: pydantic's JSON schema of its parameters (from their type hints),
    described by its docstring (the text before ``Args:``, and each ``name: text`` under it).
    (transformers' ``get_json_schema`` does the same but imports torch, which the kernel must not.)"""
    import pydantic

    doc = inspect.getdoc(f) or ""
    summary, args_doc = _split_doc(doc)
    if not summary:
        raise ValueError("it has no docstring saying what it does")
    hints = typing.get_type_hints(f)
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(f).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"*{name} cannot be described to a model; name each parameter")
        if name not in hints:
            raise ValueError(f"parameter {name!r} has no type hint")
        default = ... if p.default is p.empty else p.default
        fields[name] = (hints[name], pydantic.Field(default, description=args_doc.get(name)))
    params = pydantic.create_model(f.__name__, **fields).model_json_schema()
    described = {"name": f.__name__, "description": summary, "parameters": _untitled(params)}
    return {"type": "function", "function": described}


def _split_doc(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's text before ``Args:`` (one line) and its parameters' descriptions."""
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.M)
    summary = " ".join(parts[0].split())
    described: dict[str, str] = {}
    name, indent = None, 0
    for line in (parts[1] if len(parts) > 1 else "").splitlines():
        m = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if m and (name is None or len(line) - len(line.lstrip()) <= indent):
            name, indent = m.group(1), len(line) - len(line.lstrip())
            described[name] = m.group(2).strip()
        elif name is not None and line.strip():
            if re.match(r"^\s*(Returns|Raises|Yields|Examples?):", line):
                break
            described[name] = f"{described[name]} {line.strip()}".strip()
    return summary, described


_FIRST = ("type", "anyOf", "enum", "items", "properties", "required")  # transformers' order, then the rest


def _untitled(schema: Any) -> Any:
    """``schema`` without pydantic's generated ``title``s (a property named title stays), its keys in the
    order transformers writes them (a template that prints the schema prints what models were taught)."""
    if isinstance(schema, list):
        return [_untitled(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k in sorted(schema, key=lambda k: _FIRST.index(k) if k in _FIRST else len(_FIRST)):
        v = schema[k]
        if k == "title" and isinstance(v, str):
            continue
        out[k] = {n: _untitled(p) for n, p in v.items()} if k in ("properties", "$defs") else _untitled(v)
    return out


def from_names(names: str, namespace: Mapping[str, Any]) -> list[Callable[..., Any]]:
    """The functions ``names`` ("f,g") names in ``namespace`` (the notebook's), for ``--tools f,g``."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    missing = [n for n in wanted if not callable(namespace.get(n))]
    if missing:
        raise NbtrainError(
            f"--tools: no function named {', '.join(missing)} in this notebook; define it (with type "
            "hints and a docstring) in a cell above, then run this one again"
        )
    return [namespace[n] for n in wanted]


@dataclass
class Call:
    """One tool call of the model and what became of it. ``state``: asking (waiting for the user's yes),
    running, done, error (the function raised, or the call could not be made), skipped (the user said
    no)."""

    id: str
    name: str
    arguments: str  # JSON, as the model wrote it
    state: str = "asking"
    result: str = ""

    def shown(self) -> str:
        """``name(a=1, b='x')``: the call as the user is asked about it."""
        try:
            args = json.loads(self.arguments or "{}")
        except ValueError:
            return f"{self.name}({self.arguments})"
        if not isinstance(args, dict):
            return f"{self.name}({self.arguments})"
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"

    def state_dict(self) -> dict[str, Any]:
        return {"type": "call", "id": self.id, "name": self.name, "shown": self.shown(),
                "state": self.state, "result": self.result}  # fmt: skip

    def message(self) -> dict[str, Any]:
        """The ``role: tool`` message that answers the call."""
        return {"role": "tool", "tool_call_id": self.id, "name": self.name, "content": self.result}


def run_call(tools: Tools, call: Call) -> None:
    """Run ``call`` with its function; its result (or the error, with the traceback) in ``call``."""
    f = tools.functions.get(call.name)
    if f is None:
        call.state, call.result = (
            "error",
            f"error: there is no tool named {call.name!r}; the tools are " + (", ".join(tools.names)),
        )
        return
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError as e:
        call.state, call.result = "error", f"error: the arguments are not JSON ({e}): {call.arguments}"
        return
    if not isinstance(args, dict):
        call.state, call.result = "error", f"error: the arguments must be a JSON object, not {call.arguments}"
        return
    call.state = "running"
    try:
        value = f(**args)
    except Exception as e:  # noqa: BLE001 - the model and the user both see what went wrong
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # from the function down
        call.state, call.result = (
            "error",
            "".join(traceback.format_exception(type(e), e, tb))[-MAX_RESULT_CHARS:],
        )
        return
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    call.state, call.result = "done", text[:MAX_RESULT_CHARS]
