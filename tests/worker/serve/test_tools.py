"""serve/tools: a chat request's tools checked, and the answer (whole or streamed) read for calls."""

from __future__ import annotations

from typing import Any

import pytest

from nbtrain.examples.tools import TOOLS
from nbtrain.worker.serve.request import RequestError
from nbtrain.worker.serve.tools import HoldCalls, ToolRequest, message, openai_calls


def ask(**body: Any) -> ToolRequest | None:
    return ToolRequest.from_body(body, "hermes")


def test_no_tools_or_tool_choice_none_serve_a_plain_chat() -> None:
    assert ask() is None and ask(tools=[]) is None
    assert ask(tools=TOOLS, tool_choice="none") is None
    req = ask(tools=TOOLS)
    assert req is not None and req.opening == "" and req.names == ["get_weather", "add", "convert"]


def test_required_and_named_choices_begin_the_answer_with_the_call() -> None:
    assert ask(tools=TOOLS, tool_choice="required").opening == "<tool_call>\n"  # type: ignore[union-attr]
    named = ask(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert named is not None and named.opening.endswith('{"name": "add", "arguments": ')
    parsed = named.read('{"a": 1, "b": 2}}</tool_call>')
    assert parsed.calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", '"auto", "none", "required"'),
        ({"tools": "get_weather"}, "tools", "must be a list"),
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools",
            "no function name",
        ),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ],
)
def test_a_malformed_tools_request_is_a_400_naming_the_field(
    body: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(RequestError) as e:
        ToolRequest.from_body(body, "hermes")
    assert e.value.param == param and says in str(e.value) and e.value.status == 400


def test_tools_for_a_template_that_writes_no_readable_calls_are_refused() -> None:
    with pytest.raises(RequestError, match="writes no tool calls nbtrain can read back") as e:
        ToolRequest.from_body({"tools": TOOLS}, None)
    assert "<tool_call>" in str(e.value)  # names the conventions that work


def test_an_answer_with_calls_becomes_openai_tool_calls() -> None:
    req = ask(tools=TOOLS, parallel_tool_calls=False)
    assert req is not None
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    )
    parsed = req.read(text)
    msg, finish = message(parsed, text)
    assert finish == "tool_calls" and msg["content"] is None and len(msg["tool_calls"]) == 1  # not parallel
    call = msg["tool_calls"][0]
    assert call["id"].startswith("call_") and call["function"] == {
        "name": "add",
        "arguments": '{"a": 1, "b": 2}',
    }
    assert len({c["id"] for c in openai_calls(req.read(text.replace("1", "5")))}) == 1


def test_a_malformed_call_is_text_with_a_flag_never_an_error() -> None:
    req = ask(tools=TOOLS)
    assert req is not None
    text = '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>'
    msg, finish = message(req.read(text), text)
    assert finish == "stop" and msg["content"] == text and "not valid JSON" in msg["nbtrain_tool_call_error"]
    req = ask(tools=TOOLS, tool_choice="required")
    assert req is not None and "not valid JSON" in str(req.read("I will not call anything.").error)


def test_a_stream_passes_text_on_until_a_call_may_be_starting() -> None:
    req = ask(tools=TOOLS)
    assert req is not None
    hold = HoldCalls(req)
    assert hold.feed("Let me ") == "Let me "
    assert hold.feed("look <tool") == "look "  # "<tool" may begin "<tool_call>"
    assert hold.feed('_call>{"name"') == ""  # a call: held to the end
    assert hold.feed(': "add"}') == "" and hold.passed == "Let me look "
    plain = HoldCalls(req)
    assert plain.feed("I have a <tool") == "I have a " and plain.feed("box.") == "<toolbox."
    required = HoldCalls(ToolRequest.from_body({"tools": TOOLS, "tool_choice": "required"}, "hermes"))  # type: ignore[arg-type]
    assert required.feed("anything") == ""  # begun with the call: nothing goes out before the end
