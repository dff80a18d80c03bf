"""data: several sources mixed by weight, streaming, row-count eval splits: parsed and checked before
anything starts, with errors that name the key path, the YAML line and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from nbtrain.examples import write_dataset


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(text)
    return [p.render() for p in ei.value.problems]


def config(data: str, train: str = "  max_steps: 5\n") -> str:
    return f"model: ./tiny-llama\ndata:\n{data}train:\n{train}"


@pytest.fixture
def sources(workdir: Path) -> Path:
    write_dataset(workdir / "data" / "alpaca.jsonl", "alpaca", n=30, seed=1)
    write_dataset(workdir / "data" / "text.jsonl", "text", n=30)
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(20)]
    (workdir / "data" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


def test_train_list_resolves_every_source_with_its_own_format_columns_and_weight(sources: Path) -> None:
    res = load_config(
        config(
            "  train:\n"
            "    - {path: data/add.jsonl, weight: 3}\n"
            "    - {path: data/alpaca.jsonl, weight: 1}\n"
            "    - path: data/qa.jsonl\n"
            "      weight: 0.5\n"
            "      format: alpaca\n"
            "      columns: {instruction: question, output: answer}\n"
        )
    )
    got = [(Path(s.location).name, s.format, s.weight, s.columns) for s in res.train_sources]
    assert got == [
        ("add.jsonl", "messages", 3.0, None),
        ("alpaca.jsonl", "alpaca", 1.0, None),
        ("qa.jsonl", "alpaca", 0.5, {"instruction": "question", "output": "answer"}),
    ]
    assert res.train_data == res.train_sources[0]
    train = res.config.data.train
    assert isinstance(train, list) and all(Path(s.path).is_absolute() for s in train)
    assert res.config.data.stopping_strategy == "all_exhausted"
    assert "3 sources mixed by weight" in res.notes[0]


def test_a_plain_string_stays_one_source_and_an_unweighted_list_concatenates(sources: Path) -> None:
    res = load_config(config("  train: data/add.jsonl\n"))
    assert [s.format for s in res.train_sources] == ["messages"]
    assert isinstance(res.config.data.train, str)
    res = load_config(config("  train: [{path: data/add.jsonl}, {path: data/alpaca.jsonl}]\n"))
    assert "2 sources concatenated" in res.notes[0]


def test_weights_must_be_positive_and_given_for_all_sources_or_none(sources: Path) -> None:
    out = problems(
        config("  train:\n    - {path: data/add.jsonl, weight: 2}\n    - {path: data/alpaca.jsonl}\n")
    )
    assert len(out) == 1 and out[0].startswith("- data.train (line 3")
    assert "give every source a weight" in out[0]
    out = problems(
        config(
            "  train:\n    - {path: data/add.jsonl, weight: 2}\n    - {path: data/alpaca.jsonl, weight: 0}\n"
        )
    )
    assert len(out) == 1 and out[0].startswith("- data.train.1.weight (line 5")
    assert "greater than 0" in out[0]


def test_unknown_key_in_a_source_suggests_the_close_match(sources: Path) -> None:
    out = problems(config("  train:\n    - {path: data/add.jsonl, wieght: 2}\n"))
    assert len(out) == 1, out
    assert "data.train.0.wieght (line 4" in out[0] and "did you mean 'weight'?" in out[0]


def test_a_missing_source_file_is_named_by_its_position_in_the_list(sources: Path) -> None:
    out = problems(config("  train:\n    - {path: data/add.jsonl}\n    - {path: data/alpacca.jsonl}\n"))
    assert len(out) == 1 and "data.train.1.path (line 5" in out[0]
    assert "data file not found" in out[0] and "did you mean" in out[0] and "alpaca.jsonl" in out[0]


def test_a_malformed_row_in_a_source_names_the_row_and_the_missing_field(sources: Path) -> None:
    rows = [{"instruction": "q", "output": "a"}, {"instruction": "q", "output": "a"}, {"instruction": "q"}]
    (sources / "data" / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = problems(config("  train:\n    - {path: data/add.jsonl}\n    - {path: data/bad.jsonl}\n"))
    assert len(out) == 1 and "data.train.1.path" in out[0]
    assert "row 3" in out[0] and "field 'output' is missing" in out[0]


def test_conversations_and_plain_text_cannot_be_mixed(sources: Path) -> None:
    out = problems(config("  train:\n    - {path: data/add.jsonl}\n    - {path: data/text.jsonl}\n"))
    assert len(out) == 1 and out[0].startswith("- data.train (line 3")
    assert "conversations: add.jsonl" in out[0] and "plain text: text.jsonl" in out[0]


def test_streaming_requires_max_steps_and_a_row_count_eval_split(sources: Path) -> None:
    out = problems(
        "model: ./tiny-llama\ndata:\n  train: data/add.jsonl\n  streaming: true\n  eval_split: 0.1\n"
    )
    assert len(out) == 2
    assert out[0].startswith("- data.streaming (line 4") and "set train: max_steps" in out[0]
    assert out[1].startswith("- data.eval_split (line 5") and "number of rows" in out[1]
    res = load_config(config("  train: data/add.jsonl\n  streaming: true\n  eval_split: 20\n"))
    assert res.config.data.streaming and res.config.data.eval_split == 20
    assert any("streaming" in n for n in res.notes)


def test_eval_split_is_a_fraction_or_a_positive_row_count(sources: Path) -> None:
    assert load_config(config("  train: data/add.jsonl\n  eval_split: 40\n")).config.data.eval_split == 40
    for bad in ("1.5", "0", "-3"):
        out = problems(config(f"  train: data/add.jsonl\n  eval_split: {bad}\n"))
        assert len(out) == 1 and "data.eval_split" in out[0] and "number of rows" in out[0], out


def test_a_source_may_pick_a_split_of_a_saved_dataset_dict(sources: Path) -> None:
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"text": "a b"}]),
            "extra": datasets.Dataset.from_list([{"text": "c d"}, {"text": "e f"}]),
        }
    )
    dd.save_to_disk(str(sources / "data" / "dd"))
    res = load_config(config("  train: [{path: data/dd, split: extra}]\n"))
    assert res.train_sources[0].kind == "disk" and res.train_sources[0].sample_rows == 2
    out = problems(config("  train: [{path: data/dd, split: nope}]\n"))
    assert "has no split 'nope'" in out[0] and "extra" in out[0]


def test_loss_flags_with_assistant_only_loss_false_are_refused_before_anything_starts(workdir: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "weight": 1},
            ]
        },
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]},
    ]
    (workdir / "data" / "flags.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "\n".join(problems(config("  train: data/flags.jsonl\n", "  assistant_only_loss: false\n")))
    assert "train.assistant_only_loss" in text and "the rows of flags.jsonl mark which turns to train" in text
    assert load_config(config("  train: data/flags.jsonl\n")).train_data.turn_flags  # left out: fine
    assert not load_config(
        config("  train: data/add.jsonl\n", "  assistant_only_loss: false\n")
    ).train_data.turn_flags
