"""The evaluation worker (nbtrain.worker.jobs.evaluate), run in this process on the shared QLoRA run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from nbtrain.contract.rundir import read_jsonl
from nbtrain.worker.jobs import evaluate as worker

pytestmark = pytest.mark.slow


def test_the_eval_split_is_the_one_training_held_out(qlora_run: Path, tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    assert worker.main([str(qlora_run), "--result", str(result)]) == 0
    report = json.loads(Path(json.loads(result.read_text())["path"]).read_text())
    assert report["data"]["rows"] == 8 and "eval_split" in report["data"]["source"]  # 12.5% of 64 rows
    assert "base" not in report["models"] and report["tasks"] is None
    tuned = report["models"]["tuned"]
    assert tuned["perplexity"] == pytest.approx(math.exp(tuned["loss"]))
    # The same rows, tokenised the same way, as the trainer's own evaluation at the last step.
    last_eval = [r["eval_loss"] for r in read_jsonl(qlora_run / "metrics.jsonl") if "eval_loss" in r][-1]
    assert tuned["loss"] == pytest.approx(last_eval, rel=1e-3)


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_a_local_lm_eval_task_runs_offline_for_tuned_and_base(qlora_run: Path, tmp_path: Path) -> None:
    rows = [{"question": f"What is {a} + {b}?", "choices": [f"{a} + {b} = {a + b}", "blue is a color"],
             "label": 0} for a, b in ((2, 3), (10, 7), (4, 4), (1, 6))]  # fmt: skip
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = tmp_path / "tiny_sums.yaml"
    task.write_text(
        "task: tiny_sums\n"
        "dataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{test: {data}}}}}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\n'
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n"
    )
    result = tmp_path / "result.json"
    assert worker.main([str(qlora_run), "--compare-base", "--tasks", str(task), "--limit", "4",
                        "--result", str(result)]) == 0  # fmt: skip
    report = json.loads(Path(json.loads(result.read_text())["path"]).read_text())
    assert set(report["tasks"]) == {"tuned", "base"}
    for who in ("tuned", "base"):
        assert set(report["tasks"][who]) == {"tiny_sums"}
        assert 0.0 <= report["tasks"][who]["tiny_sums"]["acc"] <= 1.0
    assert report["data"]["rows"] == 4  # --limit applies to the held-out rows too
