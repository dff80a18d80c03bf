"""nbtrain.control.jobs.evaluate from the kernel side: held-out loss and perplexity of a run, base beside
tuned, kept in the run directory and shown as a table and a bar chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError


@pytest.mark.slow
def test_on_its_training_data_the_tuned_model_beats_the_base_and_the_report_is_kept(
    run_copy: Path, tuned_run: Path
) -> None:
    report = nbtrain.evaluate(run_copy, compare_base=True, file=tuned_run.parent.parent / "rep.jsonl")
    tuned, base = report.models["tuned"], report.models["base"]
    assert tuned["loss"] < base["loss"] - 0.1  # the adapter learned these replies (prompts count too)
    for m in (tuned, base):
        assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-9)
        assert m["tokens"] > 0 and m["tokens"] == tuned["tokens"]  # the same batches for both
    assert report.data["data"]["rows"] == 64

    files = sorted(p.name for p in (run_copy / "eval").iterdir())
    assert len(files) == 2 and "latest.json" in files
    assert json.loads((run_copy / "eval" / "latest.json").read_text()) == report.data
    assert nbtrain.latest_eval(run_copy).data == report.data

    table = report.table()
    assert list(table.columns) == ["base", "tuned", "change"]
    assert table.loc[("held-out", "loss"), "tuned"] == tuned["loss"]
    assert table.loc[("held-out", "perplexity"), "change"] == pytest.approx(
        tuned["perplexity"] - base["perplexity"]
    )
    fig = report.figure()
    bars = [(t.name, t.y[0]) for t in fig.data]
    assert bars == [("base", base["loss"]), ("tuned", tuned["loss"]),
                    ("base", base["perplexity"]), ("tuned", tuned["perplexity"])]  # fmt: skip
    assert "<table" in report._repr_html_()
    # a LoRA run: the eval process left bitsandbytes out (scipy stays: lm-eval's metrics may use it)
    log = (run_copy / "logs" / "eval.log").read_text()
    assert "nbtrain eval: not loaded (this run does not use them): bitsandbytes\n" in log


def test_bad_arguments_are_refused_before_anything_starts(run_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(NbtrainError) as err:
        nbtrain.evaluate(
            run_copy, file=tmp_path / "missing.jsonl", tasks=[str(tmp_path / "no_task.yaml")], limit=0
        )
    msg = str(err.value)
    assert "data file not found" in msg and "task file or directory not found" in msg
    assert "limit must be positive" in msg
    assert not (run_copy / "logs" / "eval.log").exists() and not (run_copy / "eval").exists()
    with pytest.raises(NbtrainError, match="has not been evaluated yet"):
        nbtrain.latest_eval(run_copy)


def test_task_scores_get_their_own_rows_and_panels_beside_the_held_out_ones(tmp_path: Path) -> None:
    data = {
        "run_id": "r1", "step": 30, "data": {"source": "file x", "rows": 8},
        "models": {"tuned": {"loss": 1.0, "perplexity": math.e, "tokens": 10},
                   "base": {"loss": 2.0, "perplexity": math.e**2, "tokens": 10}},
        "tasks": {"tuned": {"sums": {"acc": 0.75}}, "base": {"sums": {"acc": 0.25}}},
    }  # fmt: skip
    report = nbtrain.EvalReport(tmp_path / "r.json", data)
    table = report.table()
    assert list(table.index) == [("held-out", "loss"), ("held-out", "perplexity"), ("sums", "acc")]
    assert table.loc[("sums", "acc")].tolist() == [0.25, 0.75, 0.5]
    fig = report.figure()
    assert [a.text for a in fig.layout.annotations] == ["loss", "perplexity", "sums: acc"]
    assert len(fig.data) == 6 and [t.showlegend for t in fig.data[:2]] == [True, True]
    tuned_only = {**data, "models": {"tuned": data["models"]["tuned"]}, "tasks": None}
    only_tuned = nbtrain.EvalReport(tmp_path / "r.json", tuned_only)
    assert list(only_tuned.table().columns) == ["tuned"]


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        ("579", "579"),
        ("It is\nsunny.<|end|>\n<|user|>\nAnd you?", "It is sunny. …"),  # ran on into a turn it made up
        ("<|assistant|>\nHello there<|end|>", "Hello there"),  # the turn's own marks are left out
        ("<|im_start|>assistant\nI am SmolLM.<|im_end|>\n", "I am SmolLM."),
        ("two\n\nlines", "two lines"),
        ("<|system|>\n<|system|>\n<|", "(template tokens only)"),  # and one cut off by max_new_tokens
        ("", ""),
    ],
)
def test_a_reports_table_shows_an_answers_own_turn_on_one_line(answer: str, shown: str) -> None:
    from nbtrain.control.jobs.evaluate import shown_answer

    assert shown_answer(answer) == shown
