"""Preference, unpaired (KTO) and prompt (GRPO) rows: detection per objective, normalisation, and the
problems the kernel reports before anything starts (the offending row shown)."""

from __future__ import annotations

import pytest

from nbtrain.contract.formats import RowError, apply_columns, check_rows, detect_format, to_example
from nbtrain.examples import dataset_rows, preference_rows


def numbered(rows: list[dict]) -> list[tuple[int, dict]]:
    return list(enumerate(rows, 1))


@pytest.mark.parametrize("conversational", [True, False])
@pytest.mark.parametrize(
    ("fmt", "objective"),
    [("preference", "dpo"), ("preference", "orpo"), ("unpaired", "kto"), ("prompt", "grpo")],
)
def test_generated_rows_are_detected_for_their_objective_and_pass(
    fmt: str, objective: str, conversational: bool
) -> None:
    rows = preference_rows(fmt, n=20, conversational=conversational)
    assert detect_format(rows[0], objective) == fmt
    assert check_rows(numbered(rows), "auto", objective) == (fmt, None)


def test_preference_chosen_is_the_correct_sum_and_rejected_a_wrong_one() -> None:
    for row in preference_rows("preference", n=50, conversational=False):
        q, good, bad = row["prompt"], row["chosen"], row["rejected"]
        a, b = (int(v) for v in q.removeprefix("What is ").strip().removesuffix("?").split(" + "))
        assert good == f"{a} + {b} = {a + b}"
        assert bad.startswith(f"{a} + {b} = ") and bad != good


def test_kto_rows_hold_both_labels_and_prompt_rows_carry_the_answer() -> None:
    labels = {r["label"] for r in preference_rows("unpaired", n=10)}
    assert labels == {True, False}
    row = preference_rows("prompt", n=1)[0]
    a, b = (
        int(v) for v in row["prompt"][0]["content"].removeprefix("What is ").removesuffix("?").split(" + ")
    )
    assert row["answer"] == str(a + b)


def test_kto_accepts_paired_preference_rows_too() -> None:
    # KTOTrainer unpairs chosen/rejected itself.
    row = preference_rows("preference", n=1)[0]
    assert detect_format(row, "kto") == "preference"


def test_implicit_prompt_preference_rows_are_accepted() -> None:
    row = {
        "chosen": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
        "rejected": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "3"}],
    }
    assert to_example(row, "preference") == row


def test_kto_labels_from_csv_text_or_integers_become_bools() -> None:
    base = {"prompt": "p", "completion": "c"}
    assert to_example({**base, "label": "True"}, "unpaired")["label"] is True
    assert to_example({**base, "label": 0}, "unpaired")["label"] is False
    with pytest.raises(RowError, match="true \\(desirable\\) or false"):
        to_example({**base, "label": "maybe"}, "unpaired")


def test_prompt_rows_keep_only_the_prompt_normalised() -> None:
    row = {"prompt": [{"role": "user", "content": "hi"}], "answer": "5"}
    assert to_example(row, "prompt") == {"prompt": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("row", "fmt", "needle"),
    [
        ({"prompt": "p", "chosen": "", "rejected": "r"}, "preference", "'chosen' is empty"),
        ({"prompt": "p", "chosen": 3, "rejected": "r"}, "preference", "'chosen' must be a string"),
        (
            {"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "r"},
            "preference",
            "but the row is plain text",
        ),
        (
            {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "r"},
            "preference",
            "the row is conversational",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "q"}],
                "chosen": [{"role": "user", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "r"}],
            },
            "preference",
            "must end with an assistant turn",
        ),
        ({"prompt": None, "chosen": "a", "rejected": "r"}, "preference", "'prompt' is null"),
        ({"prompt": "p", "completion": "c"}, "unpaired", "'label' must be true"),
        ({"prompt": ""}, "prompt", "'prompt' is empty"),
        (
            {"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "prompt",
            "ends with an assistant turn",
        ),
        ({"prompt": [{"role": "robot", "content": "q"}]}, "prompt", "role='robot'"),
    ],
)
def test_bad_preference_rows_say_what_is_wrong(row: dict, fmt: str, needle: str) -> None:
    with pytest.raises(RowError) as ei:
        to_example(row, fmt)
    assert needle in str(ei.value)


def test_sft_data_for_dpo_names_the_row_and_what_it_is() -> None:
    rows = numbered(dataset_rows("messages", n=2))
    _fmt, problem = check_rows(rows, "auto", "dpo")
    assert problem is not None
    assert problem.startswith("row 1 is not data objective: dpo trains on")
    assert "It looks like SFT data (messages), which objective: sft trains on" in problem
    assert '"chosen": "..."' in problem and "What is" in problem  # the expected shape and the row itself


def test_preference_data_for_sft_suggests_a_preference_objective() -> None:
    _fmt, problem = check_rows(numbered(preference_rows("preference", n=1)), "auto", "sft")
    assert problem is not None and "matches no known format" in problem
    assert "preference data (chosen/rejected), which objective: dpo, orpo, kto or reward trains on" in problem


def test_a_later_row_that_changes_shape_is_named() -> None:
    rows = preference_rows("preference", n=3, conversational=False)
    rows[2] = {"chosen": "x", "rejected": "y"}  # no prompt, unlike the first row
    _fmt, problem = check_rows(numbered(rows), "auto", "dpo")
    assert problem is not None and problem.startswith("row 3 does not match the first row")
    assert '{"chosen": "x", "rejected": "y"}' in problem


def test_columns_map_odd_names_and_a_missing_column_is_reported() -> None:
    row = {"question": "q", "good": "a", "bad": "b"}
    cols = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    assert apply_columns(row, cols) == {"prompt": "q", "chosen": "a", "rejected": "b"}
    assert check_rows([(1, row)], "auto", "dpo", cols) == ("preference", None)
    _fmt, problem = check_rows([(1, {"question": "q", "good": "a"})], "auto", "dpo", cols)
    assert problem is not None and "row 1 does not fit data: columns" in problem
    assert "no column 'bad'" in problem
