"""Rows made for LLaMA-Factory, ms-swift, OpenAI and TRL: detected, normalised to nbtrain's own, and refused
by row, field and fix when malformed (contract/formats_peers.py, contract/tools.py). The rows are our own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nbtrain.contract.formats import RowError, check_rows, detect_format, to_example

U, A, S = "user", "assistant", "system"


def msg(role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_llamafactory_alpaca_with_system_and_history() -> None:
    row = {
        "instruction": "And 4 + 4?",
        "input": "",
        "output": "8",
        "system": "You add numbers.",
        "history": [["What is 1 + 1?", "2"], ["And 2 + 2?", "4"]],
    }
    assert detect_format(row) == "alpaca"
    assert to_example(row, "alpaca")["messages"] == [
        msg(S, "You add numbers."),
        msg(U, "What is 1 + 1?"),
        msg(A, "2"),
        msg(U, "And 2 + 2?"),
        msg(A, "4"),
        msg(U, "And 4 + 4?"),
        msg(A, "8"),
    ]


@pytest.mark.parametrize(
    ("row", "prompt", "answer"),
    [
        ({"query": "Name a fruit.", "response": "pear"}, "Name a fruit.", "pear"),
        ({"question": "Name a fruit.", "answer": "fig"}, "Name a fruit.", "fig"),
        ({"problem": "3 * 3?", "solution": "9"}, "3 * 3?", "9"),
        ({"prompt": "Say hi.", "completion": "hi"}, "Say hi.", "hi"),
        ({"instruction": "Say hi.", "response": "hi"}, "Say hi.", "hi"),
    ],
)
def test_msswift_query_response_and_its_aliases_are_one_turn(row: dict, prompt: str, answer: str) -> None:
    assert detect_format(row) == "alpaca"
    assert to_example(row, "alpaca")["messages"] == [msg(U, prompt), msg(A, answer)]


def test_aliases_never_take_another_objectives_rows() -> None:
    # prompt + completion + label is KTO's unpaired row; prompt alone is GRPO's prompt row.
    kto = {"prompt": "Is it?", "completion": "yes", "label": True}
    assert detect_format(kto) is None and detect_format(kto, "kto") == "unpaired"
    assert detect_format({"prompt": "Solve 2 + 2"}, "grpo") == "prompt"
    assert detect_format({"prompt": "Solve 2 + 2"}) is None
    _, problem = check_rows([(1, kto)], "auto")
    assert problem is not None and "objective: kto" in problem


def test_msswift_history_and_query() -> None:
    row = {"query": "And 3?", "response": "three", "history": [["Count to 1", "one"]], "system": "Count."}
    assert [m["role"] for m in to_example(row, "alpaca")["messages"]] == [S, U, A, U, A]


def test_msswift_messages_with_top_level_system() -> None:
    row = {"system": "Be terse.", "messages": [msg(U, "Hi"), msg(A, "Hello")]}
    assert to_example(row, detect_format(row) or "")["messages"][0] == msg(S, "Be terse.")


def test_msswift_conversation_pairs() -> None:
    row = {"conversation": [{"human": "Hi", "assistant": "Hey"}, {"human": "Bye", "assistant": "Ciao"}]}
    assert detect_format(row) == "sharegpt"
    assert [m["content"] for m in to_example(row, "sharegpt")["messages"]] == ["Hi", "Hey", "Bye", "Ciao"]


def test_sharegpt_preference_rows_become_a_conversational_prompt() -> None:
    row = {
        "conversations": [{"from": "system", "value": "Answer."}, {"from": "human", "value": "2 + 2?"}],
        "chosen": {"from": "gpt", "value": "4"},
        "rejected": {"from": "gpt", "value": "5"},
    }
    assert detect_format(row, "dpo") == "preference"
    assert to_example(row, "preference") == {
        "prompt": [msg(S, "Answer."), msg(U, "2 + 2?")],
        "chosen": [msg(A, "4")],
        "rejected": [msg(A, "5")],
    }


def test_llamafactory_alpaca_ranking_rows() -> None:
    row = {"instruction": "Greet", "input": "politely", "chosen": "Hello there.", "rejected": "Yo."}
    assert to_example(row, detect_format(row, "orpo") or "") == {
        "prompt": "Greet\n\npolitely",
        "chosen": "Hello there.",
        "rejected": "Yo.",
    }


def test_msswift_rejected_response_is_the_other_answer_to_the_last_turn() -> None:
    row = {"messages": [msg(U, "1 + 2?"), msg(A, "3")], "rejected_response": "12"}
    assert detect_format(row, "dpo") == "preference"
    assert detect_format(row) == "messages"  # for objective: sft, ms-swift trains on the messages
    assert to_example(row, "preference") == {
        "prompt": [msg(U, "1 + 2?")],
        "chosen": [msg(A, "3")],
        "rejected": [msg(A, "12")],
    }


def test_openai_preference_rows() -> None:
    row = {
        "input": {"messages": [msg(U, "Capital of France?")]},
        "preferred_output": [msg(A, "Paris")],
        "non_preferred_output": [msg(A, "Lyon")],
    }
    assert detect_format(row, "dpo") == "preference" and detect_format(row, "kto") == "preference"
    assert to_example(row, "preference")["rejected"] == [msg(A, "Lyon")]


@pytest.mark.parametrize(
    "row",
    [
        {
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Go away"}],
            "kto_tag": False,
        },
        {"messages": [msg(U, "Hi"), msg(A, "Go away")], "label": False},
    ],
)
def test_kto_rows_judge_the_last_assistant_turn(row: dict) -> None:
    assert detect_format(row, "kto") == "unpaired"
    assert to_example(row, "unpaired") == {
        "prompt": [msg(U, "Hi")],
        "completion": [msg(A, "Go away")],
        "label": False,
    }


def test_openai_chat_rows_with_tools() -> None:
    row = {
        "tools": [WEATHER],
        "messages": [
            msg(U, "Weather in Oslo?"),
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            }]},
            {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
            msg(A, "It is -3 C."),
        ],
    }  # fmt: skip
    ex = to_example(row, detect_format(row) or "")
    assert ex["tools"] == [WEATHER]
    assert ex["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}, "id": "c1"}
        ],
    }
    assert ex["messages"][2] == {"role": "tool", "content": "-3 C", "name": "weather", "tool_call_id": "c1"}


def test_openai_legacy_functions() -> None:
    row = {
        "functions": [{"name": "weather", "parameters": {"type": "object"}}],
        "messages": [
            msg(U, "Oslo?"),
            {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
            {"role": "function", "name": "weather", "content": "cold"},
            msg(A, "Cold."),
        ],
    }
    ex = to_example(row, "messages")
    assert ex["tools"] == [WEATHER] and ex["messages"][2]["role"] == "tool"


def test_llamafactory_glaive_function_call_and_observation_turns() -> None:
    row = {
        "conversations": [
            {"from": "human", "value": "Weather in Rome?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "weather", "arguments": {"city": "Rome"}}),
            },
            {"from": "observation", "value": '{"temp": 21}'},
            {"from": "gpt", "value": "21 degrees."},
        ],
        "tools": json.dumps([{"name": "weather", "parameters": {"type": "object"}}]),
    }
    assert detect_format(row) == "sharegpt"
    ex = to_example(row, "sharegpt")
    assert ex["tools"] == [WEATHER]
    assert ex["messages"][1]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": {"city": "Rome"},
    }
    assert ex["messages"][2] == {"role": "tool", "content": '{"temp": 21}', "name": "weather"}


def test_msswift_tool_call_and_tool_response_roles() -> None:
    row = {
        "tools": json.dumps([WEATHER]),
        "messages": [
            msg(U, "Oslo and Rome?"),
            msg(A, "Looking both up."),
            msg("tool_call", json.dumps({"name": "weather", "arguments": {"city": "Oslo"}})),
            msg("tool_call", json.dumps({"name": "weather", "arguments": {"city": "Rome"}})),
            msg("tool_response", "cold"),
            msg("tool_response", "warm"),
            msg(A, "Oslo cold, Rome warm."),
        ],
    }
    out = to_example(row, "messages")["messages"]
    assert [m["role"] for m in out] == [U, A, "tool", "tool", A]
    assert out[1]["content"] == "Looking both up." and len(out[1]["tool_calls"]) == 2  # a thought, two calls


@pytest.mark.parametrize(
    ("row", "needles"),
    [
        (
            {
                "tools": [WEATHER],
                "messages": [
                    msg(U, "x"),
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "weather", "arguments": "{city: Oslo}"}}
                        ],
                    },
                ],
            },
            ["messages[1].tool_calls[0].arguments is not JSON", "write the arguments as a JSON object"],
        ),
        (
            {"messages": [msg(U, "x"), msg("tool", "cold"), msg(A, "y")]},
            ["messages[1] is a tool result with no call before it", "put the assistant turn that calls"],
        ),
        (
            {
                "tools": [WEATHER],
                "messages": [msg(U, "x"), msg("tool_call", '{"name": "stocks", "arguments": {}}')],
            },
            ["messages[1] calls 'stocks', which is not in the row's tools (weather)", "add its schema"],
        ),
        (
            {"messages": [msg(U, "x"), msg(A, "y")], "conversations": [{"from": "human", "value": "x"}]},
            ["both 'messages' and 'conversations'", "drop one column"],
        ),
        (
            {"messages": [msg("narrator", "x"), msg(A, "y")]},
            ["messages[0].role='narrator' is not one of", "rename the role"],
        ),
        (
            {"conversations": [{"from": "bard", "value": "x"}]},
            ["conversations[0].from='bard' is not one of", "rename it"],
        ),
        ({"question": "x", "prompt": "y", "answer": "z"}, ["both 'prompt' and 'question'", "drop one"]),
        ({"tools": "[{oops", "messages": [msg(U, "x"), msg(A, "y")]}, ["field 'tools' is not JSON"]),
        (
            {"messages": [msg(U, "x"), msg(A, "y")], "system": "s1", "rejected_response": "z"},
            [],  # fine for sft: system joins the messages
        ),
    ],
)
def test_malformed_rows_are_refused_by_row_field_and_fix(row: dict, needles: list[str]) -> None:
    _fmt, problem = check_rows([(1, row)], "auto")
    if not needles:
        assert problem is None
        return
    assert problem is not None and problem.startswith("row 1 "), problem
    for needle in needles:
        assert needle in problem, problem


def test_a_bad_row_after_good_ones_is_named() -> None:
    good = {"messages": [msg(U, "a"), msg(A, "b")]}
    row = {**good, "conversations": [{"from": "human", "value": "a"}]}
    _fmt, problem = check_rows([(1, good), (2, good), (3, row)], "auto")
    assert problem is not None and problem.startswith("row 3 ") and "ambiguous" in problem


def test_preference_rows_with_tool_calls_are_refused_clearly() -> None:
    row = {
        "prompt": [
            msg(U, "x"),
            {"role": "assistant", "content": "", "tool_calls": [{"name": "weather"}]},
            msg(U, "y"),
        ],
        "chosen": [msg(A, "a")],
        "rejected": [msg(A, "b")],
    }
    with pytest.raises(RowError, match="objective: sft"):
        to_example(row, "preference")


@pytest.mark.parametrize(
    ("turns", "needle"),
    [
        ([msg(U, "x", loss=True), msg(A, "y")], "messages[0] is a user turn marked to train"),
        ([msg(U, "x"), msg(A, "y", weight=0)], "every assistant turn of messages is marked not to train"),
        ([msg(U, "x"), msg(A, "y", weight=0.5)], "messages[1].weight must be 0 or 1"),
        ([msg(U, "x"), msg(A, "y", loss="no")], "messages[1].loss must be true or false"),
    ],
)
def test_per_message_loss_flags_are_checked(turns: list, needle: str) -> None:
    with pytest.raises(RowError, match=None) as ei:
        to_example({"messages": turns}, "messages")
    assert needle in str(ei.value)
