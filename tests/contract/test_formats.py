from __future__ import annotations

import pytest

from nbtrain.contract.formats import RowError, check_rows, detect_format, to_example
from nbtrain.examples import dataset_rows


@pytest.mark.parametrize("fmt", ["messages", "alpaca", "sharegpt", "text"])
def test_each_format_is_detected_and_normalised(fmt: str) -> None:
    row = dataset_rows(fmt, n=1)[0]
    assert detect_format(row) == fmt
    ex = to_example(row, fmt)
    if fmt == "text":
        assert ex == {"text": row["text"]}
    else:
        roles = [m["role"] for m in ex["messages"]]
        assert roles == ["user", "assistant"]
        q, a = ex["messages"][0]["content"], ex["messages"][1]["content"]
        x, y = (int(v) for v in q.removeprefix("What is ").removesuffix("?").split(" + "))
        assert a == f"{x} + {y} = {x + y}"


def test_alpaca_input_and_system_become_part_of_the_prompt() -> None:
    ex = to_example({"instruction": "Add", "input": "2 and 3", "output": "5", "system": "Be brief"}, "alpaca")
    assert ex["messages"] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Add\n\n2 and 3"},
        {"role": "assistant", "content": "5"},
    ]


def test_openai_style_conversations_are_messages() -> None:
    row = {"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    assert detect_format(row) == "messages"
    assert to_example(row, "messages")["messages"][1] == {"role": "assistant", "content": "b"}


@pytest.mark.parametrize(
    ("row", "fmt", "needle"),
    [
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages", "no assistant turn"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "role='robot'"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "sharegpt", "from='alien'"),
        ({"instruction": "x", "output": 5}, "alpaca", "'output' must be a string"),
        ({"text": "   "}, "text", "empty"),
    ],
)
def test_bad_rows_say_what_is_wrong(row: dict, fmt: str, needle: str) -> None:
    with pytest.raises(RowError, match=None) as ei:
        to_example(row, fmt)
    assert needle in str(ei.value)


def test_check_rows_names_the_first_offending_row() -> None:
    rows = [*list(enumerate(dataset_rows("text", n=3), 1)), (4, {"text": 3})]
    fmt, problem = check_rows(rows, "auto")
    assert fmt == "text"
    assert problem is not None and problem.startswith("row 4") and '{"text": 3}' in problem


def test_check_rows_with_explicit_format_rejects_other_formats() -> None:
    _fmt, problem = check_rows([(1, dataset_rows("alpaca", n=1)[0])], "sharegpt")
    assert problem is not None and "row 1 is not valid sharegpt" in problem
