"""The panel validates with the one entry Launch goes by: what it shows as valid launches, and what it
flags is what ``prepare`` refuses, in the same words (checks that need the plan, the preset's memory cap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.prepare import launch_refusal, prepare
from nbtrain.examples import write_dataset
from nbtrain.ui.panel import ConfigPanel


def shown(p: ConfigPanel) -> set[str]:
    """Every message the panel shows, inline or above the form, without the key path it prefixes."""
    inline = {m for msg in p.errors.values() for m in msg.split("\n")}
    general = {m.split(": ", 1)[1] for m in p.general_errors}
    return inline | general


def kto(batch: int) -> str:
    return (
        "model: ./tiny-llama\nobjective: kto\ndata: {train: data/kto.jsonl}\n"
        f"train: {{max_steps: 2, per_device_train_batch_size: {batch}}}\n"
    )


GRPO = (
    "model: ./tiny-llama\nobjective: grpo\nrewards: [format_reward]\ndata: {train: data/prompt.jsonl}\n"
    "train: {max_steps: 2, per_device_train_batch_size: 3, num_generations: 2}\n"
)
SFT = (
    "model: ./tiny-llama\ndata: {train: data/add.jsonl}\n"
    "train: {max_steps: 2, per_device_train_batch_size: 2}\n"
)


@pytest.fixture
def data(workdir: Path) -> Path:
    write_dataset(workdir / "data" / "kto.jsonl", "unpaired", 16)
    write_dataset(workdir / "data" / "prompt.jsonl", "prompt", 16)
    return workdir


@pytest.mark.parametrize(
    ("text", "preset", "message"),
    [
        (kto(1), None, "KTO estimates its KL term from the other completions in a batch"),
        (GRPO, None, "must be a multiple of num_generations (2)"),
        (SFT, "max_memory_gb: 0.001\n", "rule 'max_memory_gb'"),
    ],
    ids=["kto batch", "grpo divisibility", "preset memory cap"],
)
def test_what_the_panel_flags_is_what_prepare_refuses_in_the_same_words(
    data: Path, make_panel: type[ConfigPanel], text: str, preset: str | None, message: str
) -> None:
    if preset is not None:
        (data / "nbtrain.lab.yaml").write_text(preset)
    p = make_panel(text)
    assert p.settle(60)
    with pytest.raises(ConfigError) as e:
        prepare(p.to_yaml())
    refused = {problem.message for problem in e.value.problems}
    assert any(message in m for m in refused)
    assert shown(p) == refused


@pytest.mark.parametrize("text", [kto(2), GRPO.replace("num_generations: 2", "num_generations: 3"), SFT])
def test_a_config_the_panel_shows_as_valid_launches(
    data: Path, make_panel: type[ConfigPanel], text: str
) -> None:
    p = make_panel(text)
    assert p.settle(60)
    assert p.errors == {} and p.general_errors == []
    prep = prepare(p.to_yaml())  # the dry run of Launch: it raises for any problem
    assert launch_refusal(prep) is None
