"""Real training runs (CPU, tiny model) of the data features: a streamed run, a weighted mix of two
sources, and a packed run that trains on answers only. The three run at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.examples import variable_length_rows, write_dataset

pytestmark = pytest.mark.slow

STREAM = """\
model: ./tiny-llama
data:
  train: data/add.jsonl
  streaming: true
  eval_split: 16
train:
  max_steps: 6
  per_device_train_batch_size: 4
  logging_steps: 1
  eval_strategy: steps
  eval_steps: 3
"""
MIXED = """\
model: ./tiny-llama
data:
  train:
    - {path: data/var.jsonl, weight: 2}
    - {path: data/alpaca.jsonl, weight: 1}
train:
  max_steps: 6
  per_device_train_batch_size: 4
  logging_steps: 1
"""
PACKED = """\
model: ./tiny-llama
data:
  train: data/var.jsonl
train:
  max_steps: 6
  per_device_train_batch_size: 2
  max_length: 128
  packing: true
  assistant_only_loss: true
  logging_steps: 1
"""


def test_streamed_mixed_and_packed_runs_complete(workdir: Path) -> None:
    rows = variable_length_rows(200, seed=2)
    (workdir / "data" / "var.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_dataset(workdir / "data" / "alpaca.jsonl", "alpaca", n=60, seed=4)
    runs = {
        "stream": nbtrain.finetune(STREAM, name="stream"),
        "mixed": nbtrain.finetune(MIXED, name="mixed"),
        "packed": nbtrain.finetune(PACKED, name="packed"),
    }
    for run in runs.values():
        st = run.wait(timeout=600)
        assert st.state == "completed" and st.step == 6, run.logs(40)
    log = runs["stream"].logs(400)
    assert "nbtrain: streaming training rows (messages), streaming eval rows" in log
    assert runs["stream"].metrics()["eval_loss"].notna().sum() == 2  # steps 3 and 6, on the 16 held out
    log = runs["mixed"].logs(400)
    assert "from 2 sources mixed by weight: data/var.jsonl (messages, weight 2), data/alpaca.jsonl" in log
    assert runs["mixed"].resolved["data"]["sources"][1]["format"] == "alpaca"

    packed, mixed = runs["packed"].metrics(), runs["mixed"].metrics()
    assert "Packing train dataset" in runs["packed"].logs(400)
    # Two packed sequences of up to 128 tokens hold more real tokens than four padded rows.
    per_step = packed["num_tokens"].diff().dropna().median()
    assert per_step > 1.5 * mixed["num_tokens"].diff().dropna().median() and per_step <= 256

    pv = nbtrain.preview("packed", n=3, stats_rows=50)  # a run, by name: its own resolved config
    assert pv.source == runs["packed"].id and pv.data["packing"] and pv.data["padding_free"]
    s = pv.stats
    assert s["rows"] == 50 and s["min"] <= s["p50"] <= s["p95"] <= s["max"]
    assert s["over_max_length"] == sum(1 for n in pv.data["lengths"] if n > 128) > 0
    for ex, n in zip(pv.examples, pv.data["lengths"], strict=False):
        assert ex["tokens"] == n and ex["cut"] == max(0, n - 128) and 0 < ex["trained"] < min(n, 128)
    text = pv.text()
    assert text.count("‹<|user|>") == 3  # every prompt is masked, marked with ‹ ›
    assert "tokens per example (first 50 rows)" in text and "loss on assistant turns only" in text
    assert "exceed max_length 128 and are truncated" in text and "packing: bfd" in text
    assert pv.figure().data[0].type == "histogram"
