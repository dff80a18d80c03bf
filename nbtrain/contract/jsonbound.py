"""JSON read with its nesting bounded (stdlib only): the one reader for JSON that comes from outside
nbtrain -- a model server's request body, a warm-start request, a tool's schema or a call's arguments
given as a JSON string in a row or a chat message.

``json.loads`` recurses once per level: JSON nested some thousands deep (``[[[[...]]]]``, 200 KB of it)
raises RecursionError, which no ``except ValueError`` catches, and one nested a few hundred deep parses
but makes whatever walks it next (a chat template's ``tojson``, ``json.dumps(indent=...)``) recurse past
the limit instead. ``loads`` refuses anything nested more than MAX_DEPTH levels before parsing it, with
``TooDeep``, a ValueError naming the limit, so every caller that handles bad JSON handles this too.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# The most levels of arrays and objects nbtrain reads. A chat request is about 6 deep, a tool's JSON
# schema rarely 20; Python's recursion limit (1000) is far above it, so nothing that walks what was read
# recurses too deep either.
MAX_DEPTH = 100

# A JSON string (one left open at the end of the text too: its brackets are not structure either), and
# anything that is not a bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class TooDeep(ValueError):
    """JSON nested more than MAX_DEPTH levels; the message names the limit."""

    def __init__(self, depth: int | None, limit: int) -> None:
        deep = f"{depth} levels deep" if depth is not None else "too deep to parse"
        super().__init__(
            f"nested {deep}, past the {limit} levels of arrays and objects nbtrain reads "
            f"(nbtrain.contract.jsonbound.MAX_DEPTH); flatten it"
        )
        self.depth = depth
        self.limit = limit


def depth(text: str) -> int:
    """How many levels of arrays and objects ``text`` nests (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, **kwargs: Any) -> Any:
    """``json.loads(data, **kwargs)`` for JSON nested at most ``max_depth`` levels; TooDeep (a
    ValueError) for deeper JSON, checked before it is parsed; otherwise json.loads' own ValueErrors."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") if not isinstance(data, str) else data
    if text.count("[") + text.count("{") > max_depth and (found := depth(text)) > max_depth:
        raise TooDeep(found, max_depth)
    try:
        return json.loads(text, **kwargs)
    except RecursionError:  # only when the caller's own stack was already deep
        raise TooDeep(None, max_depth) from None
