"""The PEFT variants people ask for, for real: ``lora:`` takes peft's own LoraConfig fields (checked in the
kernel against peft's dataclass, as ``train:`` is against TRL's), and DoRA, rsLoRA, PiSSA and LoRA+ runs
train, their adapters reload with peft and measure what training measured, and the estimate counts
DoRA's magnitude vectors."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.contract.rundir import read_jsonl
from nbtrain.examples import write_dataset
from tests.conftest import runs_in


def config(model: Path, data: Path, lora: str, steps: int = 12) -> str:
    return f"""\
model: {model}
method: lora
data: {{train: {data}, eval_split: 16}}
lora: {{r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear, {lora}}}
train: {{max_steps: {steps}, learning_rate: 3.0e-3, per_device_train_batch_size: 8, logging_steps: 4,
         eval_strategy: "no"}}
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Path]:
    w = tmp_path_factory.mktemp("peft")
    write_dataset(w / "add.jsonl", n=200)
    with runs_in(w):
        yield w


def test_lora_keys_are_peft_s_own_and_checked_before_anything_starts(work: Path, tiny_model: Path) -> None:
    data = work / "add.jsonl"
    cases = {
        "use_dorra: true": "unknown key 'use_dorra' in lora:; did you mean 'use_dora'?",
        "use_dora: maybe": "'maybe' is not valid for use_dora: expected true/false",
        "task_type: SEQ_CLS": "'task_type' is not set here",
        "loraplus_lr_ratio: -2": "loraplus_lr_ratio",
        "init_lora_weights: loftq": "init_lora_weights: loftq needs a quantized base",
    }
    for lora, expected in cases.items():
        with pytest.raises(ConfigError) as e:
            nbtrain.prepare(config(tiny_model, data, lora))
        assert expected in str(e.value), (lora, str(e.value))
    assert not (work / "runs").exists() or not os.listdir(work / "runs")


@pytest.mark.slow
@pytest.mark.parametrize(
    "lora, in_config",
    [
        ("use_dora: true", {"use_dora": True}),
        ("use_rslora: true", {"use_rslora": True}),
        ("init_lora_weights: pissa", {"init_lora_weights": True}),  # saved converted to a plain LoRA
    ],
    ids=["dora", "rslora", "pissa"],
)
def test_a_variant_trains_and_its_adapter_reloads_as_the_model_it_trained(
    work: Path, tiny_model: Path, lora: str, in_config: dict[str, object]
) -> None:
    import json

    run = nbtrain.finetune(config(tiny_model, work / "add.jsonl", lora), name=re.sub(r"\W", "-", lora))
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    saved = json.loads((run.paths.output / "adapter_config.json").read_text())
    assert {k: saved[k] for k in in_config} == in_config
    trained = [r["eval_loss"] for r in read_jsonl(run.paths.metrics) if "eval_loss" in r][-1]
    reloaded = nbtrain.evaluate(run).models["tuned"]["loss"]  # base + adapter, loaded by peft
    assert reloaded == pytest.approx(trained, rel=0.02), (trained, reloaded)  # token- vs row-weighted means
    if "dora" in lora:  # the estimate counts the magnitude vectors peft adds
        counted = int(re.search(r"lora adapters: ([\d,]+) trainable", run.logs(400))[1].replace(",", ""))  # type: ignore[index]
        assert run.resolved["plan"]["estimate"]["trainable_params"] == counted


@pytest.mark.slow
def test_lora_plus_trains_b_faster_than_a(work: Path, tiny_model: Path) -> None:
    run = nbtrain.finetune(config(tiny_model, work / "add.jsonl", "loraplus_lr_ratio: 16"), name="loraplus")
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    assert "LoRA+: the B matrices learn at 16x the learning rate (0.048)" in run.logs(400)
