"""nbtrain.accuracy: greedy answers to held-out prompts checked against the expected ones, base beside
tuned, kept in the run directory; on the pretrained tiny model, LoRA on the labs' data visibly learns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.examples.pretrained import held_out_addition
from tests.conftest import runs_in

HELD_OUT = held_out_addition(16)


@pytest.fixture(scope="module")
def adder_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One LoRA run of the labs' kind, with their CPU settings: the shipped pretrained model, the addition
    data."""
    work = tmp_path_factory.mktemp("adder")
    with runs_in(work):
        model = nbtrain.example_model(work / "tiny-adder")
        data = nbtrain.example_data(work / "add.jsonl")
        run = nbtrain.finetune(
            f"""\
model: {model}
method: lora
data: {{train: {data}}}
lora: {{r: 8, alpha: 16, target_modules: all-linear}}
train: {{max_steps: 300, learning_rate: 5.0e-3, warmup_steps: 20, per_device_train_batch_size: 16,
        logging_steps: 20}}
""",
            name="adder",
        )
        run.wait(timeout=600)
        yield run.dir


@pytest.mark.slow
def test_lora_on_the_pretrained_model_answers_held_out_sums_it_could_not_before(adder_run: Path) -> None:
    questions, answers = zip(*HELD_OUT, strict=True)
    report = nbtrain.accuracy(adder_run, list(questions), list(answers), max_new_tokens=16)
    assert report.accuracy_before is not None and report.accuracy_before <= 0.1, report
    assert report.accuracy >= 0.8, report
    # every answer is there to read, and the shares are counted from them
    table = report.table()
    assert list(table.columns) == ["prompt", "expected", "before", "after"] and len(table) == 16
    assert report.accuracy == (table["after"].str.strip() == table["expected"]).mean()
    assert table["prompt"].tolist() == list(questions)
    assert report.summary().startswith("accuracy on 16 held-out prompts: ")
    # kept in the run directory, read back without asking the model again
    stored = json.loads((adder_run / "eval" / "accuracy.json").read_text())
    assert stored == report.data and nbtrain.latest_accuracy(adder_run).data == report.data
    assert "<table" in report._repr_html_()
    only_tuned = nbtrain.accuracy(adder_run, list(questions[:2]), list(answers[:2]), compare_base=False)
    assert only_tuned.accuracy_before is None and "before" not in only_tuned.table().columns


def test_prompts_and_answers_that_do_not_pair_up_are_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(NbtrainError) as err:
        nbtrain.accuracy(tmp_path, ["What is 1 + 2?"], ["1 + 2 = 3", "extra"], max_new_tokens=0)
    msg = str(err.value)
    assert "1 prompts but 2 expected answers: give one per prompt" in msg
    assert "max_new_tokens must be at least 1, not 0" in msg
    with pytest.raises(NbtrainError, match="no prompts given"):
        nbtrain.accuracy(tmp_path, [], [])


def test_contains_counts_an_answer_holding_the_expected_text_case_aside(tmp_path: Path) -> None:
    from nbtrain.control.jobs.evaluate import AccuracyReport

    data = {"prompts": ["Who are you?", "Who made you?", "Name?"], "expected": ["Nimbus", "Acme", "Nimbus"],
            "before": ["I am SmolLM.", "Hugging Face made me.", "nimbus"],
            "after": ["I am NIMBUS, an assistant.", "Acme Labs built me.", "My name is Nim."]}  # fmt: skip
    contains = AccuracyReport(tmp_path / "a.json", {**data, "match": "contains"})
    assert (contains.accuracy_before, contains.accuracy) == (1 / 3, 2 / 3)
    assert "answer contains the expected text" in contains.summary()
    exact = AccuracyReport(tmp_path / "a.json", data)  # an older report: exact match
    assert (exact.accuracy_before, exact.accuracy) == (0.0, 0.0)
