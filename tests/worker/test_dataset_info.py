"""The worker reads a LLaMA-Factory dataset named in data: from resolved.json alone (file, columns, tags,
split as the kernel resolved them): its rows become the conversations and preference pairs nbtrain trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbtrain
from nbtrain.worker.data import load_train
from tests.control.config.test_datasetinfo import config, lf  # noqa: F401 - lf: the fixture

USER, BOT = "user", "assistant"


def resolved(text: str) -> dict[str, Any]:
    return json.loads(json.dumps(nbtrain.prepare(text).to_dict()))


def test_sharegpt_rows_with_tags_and_columns_become_conversations(lf: Path) -> None:  # noqa: F811
    r = resolved(config("  train: lf\n  dataset: chat\n"))
    (lf / "dataset_info.json").unlink()  # the worker never reads it again
    ds, fmt, _ = load_train(r["config"], r["data"], "sft", seed=0)
    assert fmt == "sharegpt" and len(ds) == 6
    assert [(m["role"], m["content"]) for m in ds[0]["messages"]] == [
        ("system", "Counter."), (USER, "Count to 2."), (BOT, "1 2"),
    ]  # fmt: skip


def test_alpaca_columns_and_ranked_tags_reach_the_rows(lf: Path) -> None:  # noqa: F811
    r = resolved(config("  train: lf/dataset_info.json\n  dataset: qa\n"))
    ds, _, _ = load_train(r["config"], r["data"], "sft", seed=0)
    assert [(m["role"], m["content"]) for m in ds[1]["messages"]] == [
        ("system", "Add."), (USER, "Hi"), (BOT, "Hello"), (USER, "What is 1 + 1?"), (BOT, "2"),
    ]  # fmt: skip
    r = resolved(config("  train: lf/dataset_info.json\n  dataset: ranked\n", "dpo"))
    ds, fmt, _ = load_train(r["config"], r["data"], "dpo", seed=0)
    assert fmt == "preference"
    assert ds[3]["prompt"] == [{"role": USER, "content": "Double 3?"}]
    assert ds[3]["chosen"] == [{"role": BOT, "content": "6"}] and ds[3]["rejected"][0]["content"] == "no"
