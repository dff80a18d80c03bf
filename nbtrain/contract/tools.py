"""Tool calls in conversations, in the schema Hugging Face chat templates take (stdlib only).

Every source's tool rows become (``tools=`` of ``apply_chat_template``, and its messages):

- a row-level ``tools`` list of JSON schemas ``{"type": "function", "function": {"name", "description",
  "parameters"}}`` (given as a list, or a JSON string of one; a bare ``{"name", "parameters"}`` is wrapped);
- assistant messages with ``tool_calls: [{"type": "function", "function": {"name", "arguments": {...}}}]``
  (the arguments a JSON object, parsed when given as a JSON string; an ``id`` kept when the source has one);
- ``tool`` messages holding a result as ``content``, with the ``name`` of the function (and
  ``tool_call_id``) of the call they answer.

The roles read here: OpenAI's (``tool``; the legacy ``function`` role and an assistant's ``function_call``),
and ``tool_call`` / ``tool_response`` turns whose content is JSON (ms-swift's roles; LLaMA-Factory's
``function_call`` / ``observation`` turns are renamed to these by ``formats_peers``). A malformed tool row is
refused by its field and the fix: arguments that are not a JSON object, a tool result with no call before
it, a call to a function the row's ``tools`` do not list (a row with no ``tools`` may call any).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.errors import RowError
from nbtrain.contract.jsonbound import TooDeep, loads

ROLES = ("system", "user", "assistant", "tool")
# Other names of those roles that conversations use (OpenAI's legacy function results; ms-swift's tool turns).
_ROLE_ALIASES = {"function": "tool", "tool_response": "tool", "observation": "tool"}
CALL_ROLES = ("tool_call", "function_call")  # a turn whose content is the call as JSON
CALL_EXAMPLE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def _json(value: Any, where: str, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return loads(value)
    except TooDeep as e:
        raise RowError(f"{where} is JSON {e}") from None
    except ValueError as e:
        raise RowError(
            f"{where} is not JSON ({getattr(e, 'msg', e)}): {value[:80]!r}; write {what} as JSON"
        ) from None


def normalise_tools(value: Any, key: str = "tools") -> list[dict[str, Any]]:
    """A row's tool schemas as a list of ``{"type": "function", "function": {...}}``; [] for none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    value = _json(
        value, f"field {key!r}", 'a list of function schemas ([{"name": ..., "parameters": {...}}])'
    )
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise RowError(f"field {key!r} must be a list of function schemas, got {type(value).__name__}")
    out = []
    for i, tool in enumerate(value):
        tool = _json(tool, f"{key}[{i}]", "the function schema")
        if not isinstance(tool, Mapping):
            raise RowError(f"{key}[{i}] must be a function schema object, got {type(tool).__name__}")
        fn = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowError(
                f'{key}[{i}] has no function name; a tool is {{"type": "function", "function": '
                f'{{"name": ..., "description": ..., "parameters": {{JSON schema}}}}}}'
            )
        schema = dict(fn)
        if "parameters" in schema:
            schema["parameters"] = _json(schema["parameters"], f"{key}[{i}].parameters", "the JSON schema")
            if not isinstance(schema["parameters"], Mapping):
                raise RowError(f"{key}[{i}].parameters must be a JSON schema object")
        out.append({"type": "function", "function": schema})
    return out


def tool_call(value: Any, where: str) -> dict[str, Any]:
    """One call as a template takes it, from ``{"name", "arguments"}`` or OpenAI's ``{"id"?, "type",
    "function": {...}}`` (either as JSON text)."""
    value = _json(value, where, f"the call, e.g. {CALL_EXAMPLE}")
    if not isinstance(value, Mapping):
        raise RowError(f"{where} must be a call object like {CALL_EXAMPLE}, got {type(value).__name__}")
    fn = value["function"] if isinstance(value.get("function"), Mapping) else value
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RowError(f"{where} has no function name; a call is {CALL_EXAMPLE}")
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads(args) if args.strip() else {}
        except TooDeep as e:
            raise RowError(f"{where}.arguments is JSON {e}") from None
        except ValueError as e:
            raise RowError(
                f"{where}.arguments is not JSON ({getattr(e, 'msg', e)}): {args[:80]!r}; write the arguments "
                f'as a JSON object of the function\'s parameters, e.g. {{"city": "Paris"}}'
            ) from None
    if not isinstance(args, Mapping):
        raise RowError(
            f"{where}.arguments must be a JSON object of the function's parameters, got "
            f'{type(args).__name__}; e.g. {{"city": "Paris"}}'
        )
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
    if isinstance(value.get("id"), str) and value["id"]:
        call["id"] = value["id"]
    return call


def _calls(content: Any, where: str) -> list[dict[str, Any]]:
    """The calls a ``tool_call`` / ``function_call`` turn holds (one JSON object, or a list of them)."""
    content = _json(content, where, f"the call, e.g. {CALL_EXAMPLE}")
    items = content if isinstance(content, list) else [content]
    if not items:
        raise RowError(f"{where} holds no call; a call is {CALL_EXAMPLE}")
    return [
        tool_call(c, f"{where}[{j}]" if isinstance(content, list) else where) for j, c in enumerate(items)
    ]


def _content(value: Any, where: str, *, empty_ok: bool = False, result: bool = False) -> str:
    if value is None and empty_ok:
        return ""
    if result and isinstance(value, Mapping | list):  # a tool's result given as a JSON value
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        raise RowError(f"{where} must be a string, got {type(value).__name__}")
    return value


def _assistant_calls(m: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    raw = m.get("tool_calls")
    if raw is None and isinstance(m.get("function_call"), Mapping):
        raw = [m["function_call"]]  # OpenAI's legacy single call
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RowError(f"{where}.tool_calls must be a list of calls like [{CALL_EXAMPLE}]")
    return [tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(raw)]


def conversation(items: list[Any], key: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (OpenAI, ms-swift or renamed sharegpt turns) as messages a chat template renders; checks
    every call and result against each other and against ``tools``. A call turn after an assistant turn
    joins it (a thought then a call; parallel calls). Other keys of a turn are dropped, except ``train``
    (the per-message loss flag, see ``formats``)."""
    known = {t["function"]["name"] for t in tools}
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # calls not answered yet, in order
    for i, m in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(m, Mapping) or "role" not in m:
            raise RowError(f"{where} must have 'role' and 'content'")
        role = _ROLE_ALIASES.get(str(m["role"]), str(m["role"]))
        if role not in (*ROLES, *CALL_ROLES):
            raise RowError(
                f"{where}.role={m['role']!r} is not one of {[*ROLES, *CALL_ROLES, *_ROLE_ALIASES]}; rename "
                f"the role (user, assistant, system, tool), or drop the turn"
            )
        if role in CALL_ROLES:
            calls = _calls(m.get("content"), f"{where}.content")
            msg: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
        else:
            calls = _assistant_calls(m, where) if role == "assistant" else []
            if "content" not in m and not calls:
                raise RowError(f"{where} must have 'role' and 'content'")
            content = _content(
                m.get("content"), f"{where}.content", empty_ok=bool(calls), result=role == "tool"
            )
            msg = {"role": role, "content": content}
            if calls:
                msg["tool_calls"] = calls
        _check_known(calls, known, where)
        if role == "tool":
            msg.update(_answer(m, pending, where))
        pending.extend(calls)
        if "train" in m:
            msg["train"] = m["train"]
        prev = out[-1] if out else None
        if role in CALL_ROLES and prev is not None and prev["role"] == "assistant":
            prev.setdefault("tool_calls", []).extend(calls)
            continue
        out.append(msg)
    return out


def _check_known(calls: list[dict[str, Any]], known: set[str], where: str) -> None:
    for call in calls:
        name = call["function"]["name"]
        if known and name not in known:
            raise RowError(
                f"{where} calls {name!r}, which is not in the row's tools ({', '.join(sorted(known))}); add "
                f"its schema to tools or fix the function's name"
            )


def _answer(m: Mapping[str, Any], pending: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """The ``name`` / ``tool_call_id`` of the call a tool result answers (taken off ``pending``)."""
    if not pending:
        raise RowError(
            f"{where} is a tool result with no call before it; put the assistant turn that calls the "
            f"function (tool_calls: [{CALL_EXAMPLE}]) before it, or drop the result"
        )
    wanted = m.get("tool_call_id")
    call = pending[0]
    if isinstance(wanted, str) and wanted:
        found = [c for c in pending if c.get("id") == wanted]
        if not found:
            raise RowError(
                f"{where}.tool_call_id={wanted!r} answers no call before it (open calls: "
                f"{[c.get('id') for c in pending]}); fix the id"
            )
        call = found[0]
    pending.remove(call)
    extra = {"name": call["function"]["name"]}
    if isinstance(m.get("name"), str) and m["name"]:
        extra["name"] = m["name"]
    if "id" in call:
        extra["tool_call_id"] = call["id"]
    return extra


# --- Tool calls in a model's output (the server parses its answers; the examples score them)
#
# Each family writes a call its own way; the chat template says which (call_style). A call is parsed into
# {"name", "arguments"} (a JSON object); the text around the calls stays the answer's content.
CALL_STYLES = {
    "hermes": "<tool_call>{JSON}</tool_call> (Hermes, Qwen 2.5 / 3, SmolLM3)",
    "mistral": "[TOOL_CALLS][{JSON}, ...] or [TOOL_CALLS]NAME[ARGS]{JSON} (Mistral)",
    "llama3": "a JSON object {name, parameters} as the whole answer (Llama 3.x)",
    "nbtrain": "<call>NAME {JSON}</call> (nbtrain.examples.tools.TOOLS_TEMPLATE)",
}
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_NBTRAIN = re.compile(r"<call>(\w[\w.-]*) (.*?)</call>", re.DOTALL)
_MISTRAL_ARGS = re.compile(r"\[TOOL_CALLS\]\s*([\w.-]+)\s*\[ARGS\]\s*", re.DOTALL)


def call_style(template: str | None) -> str | None:
    """The convention ``template`` (a chat template's Jinja source) writes tool calls in, one of
    CALL_STYLES; None when it writes none nbtrain can read back."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<call>" in template:
        return "nbtrain"
    if "<|python_tag|>" in template or ("tool_calls" in template and '"parameters"' in template):
        return "llama3"
    return None


@dataclass
class ParsedCalls:
    """A model's answer read for tool calls: its ``content`` (the text around the calls; the whole text
    when there are none or they are malformed), the ``calls`` (``{"name", "arguments"}``) and, for a
    malformed call, ``error`` naming what is wrong (the answer then carries no calls)."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def _read_call(raw: Any, known: set[str]) -> dict[str, Any]:
    """One parsed call from its JSON text or object; ValueError naming what is wrong."""
    if isinstance(raw, str):
        try:
            raw = loads(raw)
        except ValueError as e:
            raise ValueError(
                f"a tool call that is not valid JSON ({getattr(e, 'msg', e)}): {raw[:80]!r}"
            ) from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise ValueError(f"a tool call without a function name: {json.dumps(raw)[:80]}")
    args = raw.get("arguments", raw.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads(args) if args.strip() else {}
        except ValueError:
            raise ValueError(f"{raw['name']}'s arguments are not valid JSON: {args[:80]!r}") from None
    if not isinstance(args, Mapping):
        raise ValueError(f"{raw['name']}'s arguments are not a JSON object: {json.dumps(args)[:80]}")
    if known and raw["name"] not in known:
        raise ValueError(
            f"a call to {raw['name']!r}, which is not one of the tools ({', '.join(sorted(known))})"
        )
    return {"name": raw["name"], "arguments": dict(args)}


def parse_tool_calls(text: str, style: str | None, tools: list[dict[str, Any]] | None = None) -> ParsedCalls:
    """The tool calls in a model's answer ``text``, written in ``style`` (CALL_STYLES); calls to functions
    not in ``tools`` (when given) count as malformed."""
    known = {t["function"]["name"] for t in tools or [] if isinstance(t.get("function"), Mapping)}
    raws: list[Any] = []
    content = text
    if style == "hermes":
        raws = [m.group(1) for m in _HERMES.finditer(text)]
        content = _HERMES.sub("", text) if raws else text
    elif style == "nbtrain":
        found = list(_NBTRAIN.finditer(text))
        raws = [{"name": m.group(1), "arguments": m.group(2)} for m in found]
        content = _NBTRAIN.sub("", text) if found else text
        if "<call>" in content or "</call>" in content:  # "<call>579", a call cut off by max_tokens
            at = content.find("<call>") if "<call>" in content else max(0, content.index("</call>") - 60)
            return ParsedCalls(
                text,
                error=f"a tool call not written as <call>NAME {{JSON}}</call>: {content[at : at + 80]!r}",
            )
    elif style == "mistral" and "[TOOL_CALLS]" in text:
        head, _, rest = text.partition("[TOOL_CALLS]")
        content = head
        named = list(_MISTRAL_ARGS.finditer("[TOOL_CALLS]" + rest))
        if named:  # [TOOL_CALLS]name[ARGS]{...} (one call each)
            src = "[TOOL_CALLS]" + rest
            for i, m in enumerate(named):
                end = named[i + 1].start() if i + 1 < len(named) else len(src)
                raws.append({"name": m.group(1), "arguments": src[m.end() : end].strip()})
        else:
            try:
                value = loads(rest.strip())
            except ValueError as e:
                return ParsedCalls(text, error=f"a tool call that is not valid JSON ({getattr(e, 'msg', e)})")
            raws = value if isinstance(value, list) else [value]
    elif style == "llama3":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if body.startswith("{"):
            parts = [p for p in (s.strip() for s in body.split(";")) if p] if "};" in body else [body]
            raws, content = parts, ""
    if not raws:
        return ParsedCalls(text)
    try:
        calls = [_read_call(r, known) for r in raws]
    except ValueError as e:
        return ParsedCalls(text, error=str(e))
    return ParsedCalls(content.strip(), calls)


# --- Whether a chat template renders tools: a probe conversation, rendered by the kernel (jinja2, before a
# run starts) and by the worker (the tokenizer, for a model or rows the kernel could not see: the Hub's).
PROBE_TOOL, PROBE_CALL = "nbtrain_probe_tool", "nbtrain_probe_call"


def probe_conversation() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a tool-calling conversation whose function names show in any rendering that
    keeps the tools' definitions and the assistant's calls."""
    tools = [{"type": "function", "function": {
        "name": PROBE_TOOL, "description": "a probe", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]  # fmt: skip
    call = {"id": "call0", "type": "function", "function": {"name": PROBE_CALL, "arguments": '{"x": 1}'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Use the probe."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call0", "name": PROBE_CALL, "content": "1"},
        {"role": "assistant", "content": "Done."},
    ]
    return messages, tools


def tools_left_out(rendered: str) -> str | None:
    """What a rendering of ``probe_conversation`` leaves out ("the tools' definitions", "the assistant's
    tool calls", or both), or None when it keeps both."""
    parts = ((PROBE_TOOL, "the tools' definitions"), (PROBE_CALL, "the assistant's tool calls"))
    return " or ".join(what for name, what in parts if name not in rendered) or None


TEMPLATE_FIX = (
    "use a model whose template renders tools (a 'tools' argument and assistant 'tool_calls'), or set "
    "chat_template: chatml-tools (built in, for ChatML models) or chat_template: to a Jinja template file "
    "that does (TRL's train: chat_template_path; nbtrain.examples.tools.TOOLS_TEMPLATE is a small one)"
)
