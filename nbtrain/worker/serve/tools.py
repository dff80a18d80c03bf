"""Tools in the OpenAI chat API, for the built-in server: a request's ``tools`` / ``tool_choice`` /
``parallel_tool_calls`` checked, and the model's answer read back as ``tool_calls``.

The chat template renders the tools (a template that does not is refused with a 400: the model would
only answer in text), the answer is parsed in the family's convention the template writes calls in
(contract/tools.call_style: Hermes/Qwen ``<tool_call>``, Llama 3.x JSON, Mistral ``[TOOL_CALLS]``,
nbtrain's example ``<call>``). ``tool_choice: required`` or a named function starts the answer with the
call's opening (the model then writes the rest), ``none`` leaves the tools out. A malformed call (not
JSON, an unknown function) comes back as the answer's text with ``nbtrain_tool_call_error`` saying what
is wrong, never as a server error.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.errors import RowError
from nbtrain.contract.tools import CALL_STYLES, ParsedCalls, normalise_tools, parse_tool_calls
from nbtrain.worker.serve.request import RequestError

# What starts a call in each style: the answer is begun with it when a call is required (``{name}``:
# the named function's, when tool_choice names one).
OPENINGS = {
    "hermes": ("<tool_call>\n", '<tool_call>\n{{"name": "{name}", "arguments": '),
    "nbtrain": ("<call>", "<call>{name} "),
    "mistral": ("[TOOL_CALLS]", '[TOOL_CALLS][{{"name": "{name}", "arguments": '),
    "llama3": ('{"name": "', '{{"name": "{name}", "parameters": '),
}
# Text that may be the start of a call: held back from a stream until it is known not to be.
MARKERS = {"hermes": "<tool_call>", "nbtrain": "<call>"}


@dataclass
class ToolRequest:
    """A chat request's tools, checked: ``tools`` as the template takes them, the ``style`` calls are
    read in, the ``opening`` the answer is begun with (tool_choice required / named), and whether more
    than one call may come back."""

    tools: list[dict[str, Any]]
    style: str
    opening: str = ""
    parallel: bool = True
    names: list[str] = field(default_factory=list)

    @classmethod
    def from_body(cls, body: dict[str, Any], style: str | None) -> ToolRequest | None:
        """None when the request has no tools or tool_choice is "none"; RequestError for a malformed
        one, or tools for a model whose template writes no calls nbtrain can read."""
        raw, choice = body.get("tools"), body.get("tool_choice")
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise RequestError(
                f"parallel_tool_calls must be true or false, not {parallel!r}", "parallel_tool_calls"
            )
        if raw is None or raw == []:
            if choice not in (None, "none", "auto"):
                raise RequestError("tool_choice needs tools: add the functions to tools", "tool_choice")
            return None
        if not isinstance(raw, list):
            raise RequestError("tools must be a list of {type: function, function: {name, ...}}", "tools")
        try:
            tools = normalise_tools(raw)
        except RowError as e:
            raise RequestError(str(e), "tools") from None
        names = [t["function"]["name"] for t in tools]
        if choice is None or choice == "auto":
            opening_for = None
        elif choice == "none":
            return None
        elif choice == "required":
            opening_for = ""
        elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
            opening_for = choice["function"]["name"]
            if opening_for not in names:
                raise RequestError(
                    f"tool_choice names {opening_for!r}, which is not in tools ({', '.join(names)})",
                    "tool_choice",
                )
        else:
            raise RequestError(
                'tool_choice must be "auto", "none", "required" or '
                '{"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        if style is None:
            raise RequestError(
                "this model's chat template writes no tool calls nbtrain can read back, so it would answer "
                f"tools in plain text; serve a model whose template writes calls as one of: "
                f"{'; '.join(CALL_STYLES.values())} (or leave tools out)",
                "tools",
            )
        opening = ""
        if opening_for is not None:
            anyone, named = OPENINGS[style]
            opening = named.format(name=opening_for) if opening_for else anyone
        return cls(tools, style, opening, parallel, names)

    def read(self, text: str) -> ParsedCalls:
        """The answer (begun with ``opening``) read for calls; with parallel_tool_calls false, the first."""
        parsed = parse_tool_calls(self.opening + text, self.style, self.tools)
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        if self.opening and not parsed.calls and parsed.error is None:
            parsed.error = "tool_choice asked for a call, and the answer is not one"
        return parsed


def message(parsed: ParsedCalls, text: str) -> tuple[dict[str, Any], str]:
    """The chat completion's message and finish_reason for an answer read for calls."""
    if parsed.calls:
        content = parsed.content or None
        return {"role": "assistant", "content": content, "tool_calls": openai_calls(parsed)}, "tool_calls"
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if parsed.error:
        msg["nbtrain_tool_call_error"] = parsed.error
    return msg, "stop"


def openai_calls(parsed: ParsedCalls) -> list[dict[str, Any]]:
    """The calls as OpenAI returns them: an id each, the arguments as a JSON string."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
        }
        for c in parsed.calls
    ]


class HoldCalls:
    """A stream's text with the calls held back: text is passed on until a call may be starting (its
    marker, or for styles without one in the text any answer at all), then kept until the end."""

    def __init__(self, req: ToolRequest) -> None:
        self.marker = MARKERS.get(req.style)
        self.holding = bool(req.opening) or self.marker is None
        self.text = ""  # all the text so far
        self.passed = ""  # what was passed on

    def feed(self, piece: str) -> str:
        """The part of the text so far that may go out now."""
        self.text += piece
        if self.holding or self.marker is None:
            return ""
        at = self.text.find(self.marker)
        if at >= 0:
            self.holding = True
            safe = self.text[:at]
        else:  # hold a tail that may be the marker's start
            keep = next(
                (n for n in range(len(self.marker) - 1, 0, -1) if self.text.endswith(self.marker[:n])), 0
            )
            safe = self.text[: len(self.text) - keep]
        out, self.passed = safe[len(self.passed) :], safe if len(safe) > len(self.passed) else self.passed
        return out
