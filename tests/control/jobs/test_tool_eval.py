"""control/tool_eval: held-out tool-calling rows read as cases, and answers scored as OpenAI returns them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nbtrain.contract.errors import RowError
from nbtrain.control.jobs.tool_eval import held_out_case, score
from nbtrain.examples.tools import TOOLS


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


ASK = {"role": "user", "content": "Weather in Oslo?"}
OSLO = {"city": "Oslo"}


def test_a_row_becomes_the_conversation_before_its_last_turn_and_what_that_turn_does() -> None:
    case = held_out_case(
        {
            "tools": TOOLS,
            "messages": [ASK, {"role": "assistant", "tool_calls": [call("get_weather", city="Oslo")]}],
        },
        1,
    )
    assert case["messages"] == [ASK] and case["calls"] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    sharegpt = {"tools": json.dumps(TOOLS), "conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": OSLO})},
        {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "Sunny."}]}  # fmt: skip
    case = held_out_case(sharegpt, 2)  # LLaMA-Factory's tool turns: the answer after the result is measured
    assert (
        case["calls"] == []
        and case["text"] == "Sunny."
        and case["messages"][1]["tool_calls"][0]["id"] == "call0"
    )
    assert json.loads(case["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"text": "hi"}, "row 3 is not a conversation"),
        ({"messages": [ASK, {"role": "assistant", "content": "x"}]}, "row 3 offers no tools"),
        (
            {"tools": TOOLS, "messages": [ASK, {"role": "assistant", "content": "x"}, ASK]},
            "does not end with the assistant",
        ),
    ],
)
def test_a_row_that_cannot_be_measured_is_named(row: dict[str, Any], says: str) -> None:
    with pytest.raises(RowError, match=says):
        held_out_case(row, 3)


def test_the_scores_count_names_arguments_and_when_to_call() -> None:
    cases = [
        {"calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}], "text": ""},
        {"calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}], "text": ""},
        {"calls": [{"name": "add", "arguments": {"a": 3, "b": 4}}], "text": ""},
        {"calls": [], "text": "Sunny."},
    ]
    answers = [
        {"tool_calls": [call("get_weather", city="Oslo")]},  # right
        {"tool_calls": [call("add", a=1, b=5)]},  # right name, wrong argument
        {
            "content": "<call>add {bad</call>",
            "nbtrain_tool_call_error": "not valid JSON",
        },  # malformed: no call
        {"content": "Sunny."},
    ]
    got = score(cases, answers)
    assert got["name_accuracy"] == pytest.approx(2 / 3) and got["arguments_exact"] == pytest.approx(1 / 3)
    assert got["called_when_should"] == pytest.approx(2 / 3) and got["answered_when_should"] == 1.0
    assert got["malformed"] == 0.25
    assert score(cases[:1], answers[:1])["answered_when_should"] is None  # no row of that kind
