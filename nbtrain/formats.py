"""Training-data formats: detect, check and normalise rows (stdlib only).

The kernel uses this to reject bad data before anything starts; the worker uses the same functions to
turn every row into what TRL's SFTTrainer takes (conversational ``messages`` or plain ``text``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

FORMATS = ("messages", "alpaca", "sharegpt", "text")

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
}
_ROLES = ("system", "user", "assistant", "tool")

FORMAT_HELP = {
    "messages": '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}',
    "alpaca": '{"instruction": "...", "input": "(optional)", "output": "..."}',
    "sharegpt": '{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}',
    "text": '{"text": "..."}',
}


class RowError(ValueError):
    """A row does not match the format; the message says what is wrong with it."""


def detect_format(row: Mapping[str, Any]) -> str | None:
    """The format a single row is in, judged by its keys, or None."""
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        conv = row["conversations"]
        if isinstance(conv, list) and conv and isinstance(conv[0], Mapping) and "role" in conv[0]:
            return "messages"
        return "sharegpt"
    if "instruction" in row and "output" in row:
        return "alpaca"
    if "text" in row:
        return "text"
    return None


def _str_field(row: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    v = row.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str):
        raise RowError(f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def to_example(row: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """Normalise one row to ``{"messages": [...]}`` or ``{"text": ...}``; RowError if not ``fmt``."""
    if not isinstance(row, Mapping):
        raise RowError(f"row must be an object, got {type(row).__name__}")
    if fmt == "text":
        text = _str_field(row, "text")
        if not text.strip():
            raise RowError("field 'text' is empty")
        return {"text": text}
    if fmt == "alpaca":
        instruction = _str_field(row, "instruction")
        extra = _str_field(row, "input", required=False)
        output = _str_field(row, "output")
        system = _str_field(row, "system", required=False)
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
        if system.strip():
            msgs.insert(0, {"role": "system", "content": system})
        return {"messages": msgs}
    if fmt == "sharegpt":
        conv = row.get("conversations")
        if not isinstance(conv, list) or not conv:
            raise RowError("field 'conversations' must be a non-empty list")
        msgs = []
        for i, turn in enumerate(conv):
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                raise RowError(f"conversations[{i}] must have 'from' and 'value'")
            role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise RowError(
                    f"conversations[{i}].from={turn['from']!r} is not one of {sorted(_SHAREGPT_ROLES)}"
                )
            if not isinstance(turn["value"], str):
                raise RowError(f"conversations[{i}].value must be a string")
            msgs.append({"role": role, "content": turn["value"]})
        return {"messages": _check_messages(msgs, "conversations")}
    if fmt == "messages":
        key = "messages" if "messages" in row else "conversations"
        items = row.get(key)
        if not isinstance(items, list) or not items:
            raise RowError(f"field {key!r} must be a non-empty list of {{role, content}} objects")
        return {"messages": _check_messages(items, key)}
    raise RowError(f"unknown format {fmt!r}")


def _check_messages(msgs: list[Any], key: str) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise RowError(f"{key}[{i}] must have 'role' and 'content'")
        if m["role"] not in _ROLES:
            raise RowError(f"{key}[{i}].role={m['role']!r} is not one of {list(_ROLES)}")
        if not isinstance(m["content"], str):
            raise RowError(f"{key}[{i}].content must be a string")
        out.append({"role": str(m["role"]), "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise RowError(f"{key} has no assistant turn, so there is nothing to learn")
    return out


def show_row(row: Any, limit: int = 300) -> str:
    text = json.dumps(row, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_rows(rows: Iterable[tuple[int, Any]], fmt: str) -> tuple[str, str | None]:
    """Check numbered rows against ``fmt`` (or detect it when 'auto').

    Returns ``(format, problem)``: problem is None when every row fits, else one sentence naming the
    first offending row (its number and content) and the formats that were expected.
    """
    resolved = fmt
    for n, row in rows:
        if resolved == "auto":
            detected = detect_format(row) if isinstance(row, Mapping) else None
            if detected is None:
                keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
                return fmt, (
                    f"row {n} matches no known format (keys: {keys}): {show_row(row)}. "
                    f"Expected one of: " + "; ".join(f"{k}: {v}" for k, v in FORMAT_HELP.items())
                )
            resolved = detected
        try:
            to_example(row, resolved)
        except RowError as e:
            return resolved, f"row {n} is not valid {resolved} data ({e}): {show_row(row)}"
    return resolved, None
