"""The example data is written in the file format its name says, or refused with what would work."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.examples import write_dataset


def test_alpaca_to_a_csv_file_is_csv_with_the_alpaca_columns(tmp_path: Path) -> None:
    out = nbtrain.example_data(tmp_path / "add.csv", fmt="alpaca", n=20)
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20 and {"instruction", "output"} <= set(rows[0])


def test_a_json_file_holds_one_array_and_jsonl_one_row_per_line(tmp_path: Path) -> None:
    arr = json.loads(write_dataset(tmp_path / "a.json", "alpaca", n=5).read_text(encoding="utf-8"))
    lines = write_dataset(tmp_path / "a.ndjson", "alpaca", n=5).read_text(encoding="utf-8").splitlines()
    assert arr == [json.loads(line) for line in lines]


def test_conversations_to_csv_and_unknown_suffixes_are_refused_with_what_works(tmp_path: Path) -> None:
    with pytest.raises(NbtrainError, match=r"add\.csv: messages rows hold lists .*write \.jsonl"):
        nbtrain.example_data(tmp_path / "add.csv", fmt="messages", n=20)
    with pytest.raises(NbtrainError, match=r"\.jsonl, \.ndjson, \.json or \.csv, not '\.txt'"):
        nbtrain.example_data(tmp_path / "add.txt", fmt="alpaca", n=20)
    assert not (tmp_path / "add.csv").exists() and not (tmp_path / "add.txt").exists()


def test_word_rejections_pair_each_sum_with_a_few_words_and_other_kinds_are_refused() -> None:
    from nbtrain.examples import WORDS, preference_rows

    rows = preference_rows("preference", n=20, rejected="words", conversational=False)
    for row in rows:
        assert " = " in row["chosen"] and any(ch.isdigit() for ch in row["chosen"])
        assert 3 <= len(row["rejected"].split()) <= 6 and set(row["rejected"].split()) <= set(WORDS)
    with pytest.raises(ValueError, match=r"rejected is 'wrong' .* or 'words' .*, not 'noise'"):
        preference_rows("preference", n=2, rejected="noise")


def test_the_package_runs_as_a_command_that_builds_the_tiny_model(tmp_path: Path) -> None:
    """``python -m nbtrain.examples model DIR`` (what nbtrain.make_tiny_model runs, and lab 4 calls)."""
    import nbtrain

    out = nbtrain.make_tiny_model(tmp_path / "tiny")
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
