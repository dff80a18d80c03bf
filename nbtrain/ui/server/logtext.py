"""A run's log as a person reads it on the run's page: transformers' trainer prints each logging step as a
Python dict (``{'loss': '3.086', 'grad_norm': '2.494', 'learning_rate': '0.0002167', 'epoch': '0.96'}``);
such a line reads ``loss 3.086 · grad_norm 2.494 · learning_rate 0.0002167 · epoch 0.96``. Every other line
is left as it is. The one place the server formats log lines (``handlers.run_logs``)."""

from __future__ import annotations

import ast
import math
import re

# A dict printed by the trainer: string keys, flat values. Longer lines are left alone (parsing is bounded).
_DICT_LINE = re.compile(r"^\{'[^']+': .*\}$")
MAX_LINE = 4000


def _value(v: object) -> str | None:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(v) if not math.isfinite(v) else f"{v:.4g}"
    if isinstance(v, str):
        return v
    return None  # nested: not the trainer's flat record


def readable_line(line: str) -> str:
    """``line`` with a printed metrics dict written as ``key value · key value``; any other line as it is."""
    text = line.strip()
    if len(text) > MAX_LINE or not _DICT_LINE.match(text):
        return line
    try:
        record = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return line
    if not isinstance(record, dict) or not record:
        return line
    parts = []
    for key, value in record.items():
        shown = _value(value)
        if not isinstance(key, str) or shown is None:
            return line
        parts.append(f"{key} {shown}")
    return " · ".join(parts)


def readable(text: str) -> str:
    """Every line of ``text`` through :func:`readable_line`."""
    return "\n".join(readable_line(line) for line in text.split("\n"))
