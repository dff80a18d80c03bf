"""%finetune preview / nbtrain.preview: the first examples as the model sees them, from a real kernel
that never imports transformers (the tokenising runs in a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.examples import variable_length_rows, write_dataset
from tests.notebook import error_of, execute, text_of

HEAVY = "import sys; print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"

CONFIG = """\
model: ./tiny-llama
data:
  train: data/var.jsonl
train:
  max_steps: 5
  max_length: 64
  assistant_only_loss: true
"""


def test_preview_magic_marks_masked_tokens_and_shows_length_stats_with_a_histogram(workdir: Path) -> None:
    rows = variable_length_rows(120, seed=5)
    (workdir / "data" / "var.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (workdir / "cfg.yaml").write_text(CONFIG)
    (workdir / "bad.yaml").write_text(CONFIG.replace("max_length", "max_lenght"))
    nb = execute(
        ["%load_ext nbtrain", "%finetune preview cfg.yaml -n 2", "%finetune preview bad.yaml", HEAVY],
        workdir,
        allow_errors=True,
    )
    outputs = nb.cells[1]["outputs"]
    html = "".join(o["data"].get("text/html", "") for o in outputs if o["output_type"] == "display_data")
    assert html.count("<mark>") == 1 + 2  # the legend, then one trained span (the answer) per example
    assert "<span class='nbtrain-masked'" in html and "&lt;|user|&gt;" in html
    assert "exceed max_length 64 and are truncated" in html
    plain = text_of(nb.cells[1])
    assert plain.count("‹<|user|>") == 2 and "‹…› = masked (no loss)" in plain
    plots = [o["data"] for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 1
    hist = plots[0]["application/vnd.plotly.v1+json"]["data"][0]
    assert hist["type"] == "histogram" and len(hist["x"]) == 120
    err = error_of(nb.cells[2])
    assert err is not None and err[0] == "UsageError" and "did you mean 'max_length'" in err[1]
    assert text_of(nb.cells[3]).strip() == "[]"  # the kernel stayed light


def test_preview_refuses_a_bad_config_and_other_objectives_with_the_cause(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'max_length'"):
        nbtrain.preview(CONFIG.replace("max_length", "max_lenght").replace("var.jsonl", "add.jsonl"))
    write_dataset(workdir / "data" / "pref.jsonl", "preference", n=20)
    dpo = "model: ./tiny-llama\nobjective: dpo\ndata:\n  train: data/pref.jsonl\ntrain: {max_steps: 2}\n"
    with pytest.raises(NbtrainError, match="covers objective: sft; this run is objective: dpo"):
        nbtrain.preview(dpo)
