"""A sweep's settings and space, without starting anything: the schema's messages for bad spaces, grid
order, parameters set by dotted key, the configs that stand for the space, how many trials run at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.control.config.load import load_config
from nbtrain.control.config.schema.sections import SweepSettings
from nbtrain.control.prepare import prepare
from nbtrain.control.sweep import space
from nbtrain.control.sweep.capacity import PROCESS_BYTES, capacity
from nbtrain.control.sweep.sweep import budget_of, start_sweep
from nbtrain.hardware import Hardware
from tests.conftest import lora_yaml

GIB = 1 << 30


@pytest.mark.parametrize(
    ("sweep", "said"),
    [
        ({"space": {}}, "at least 1 item"),
        ({"space": {"lora.r": []}, "method": "grid"}, "an empty list of choices"),
        ({"space": {"lora.r": [4, 4]}, "method": "grid"}, "listed twice"),
        ({"space": {"train.learning_rate": {"log_uniform": [0, 1e-3]}}, "trials": 4}, "low above 0"),
        ({"space": {"train.lr": {"uniform": [1e-3, 1e-5]}}, "trials": 4}, "low must be below high"),
        ({"space": {"lora.r": {"unifrom": [1, 2]}}, "trials": 4}, "did you mean uniform"),
        ({"space": {"lora.r": {"int": [1.5, 4]}}, "trials": 4}, "whole numbers"),
        ({"space": {"lora.r": {"uniform": [1, 2]}}, "method": "grid"}, "grid takes lists"),
        ({"space": {"lora.r": [4, 8]}}, "needs trials:"),
        ({"space": {"lora.r": [4, 8]}, "metric": "eval_exact", "trials": 2}, "direction: maximize"),
        ({"space": {"name": ["a", "b"]}, "method": "grid"}, "cannot be swept"),
        ({"space": {"lora": [{"r": 4}], "lora.r": [4]}, "method": "grid"}, "one key inside the other"),
        ({"space": {"lora r": [4]}, "method": "grid"}, "not a dotted config key"),
        ({"space": {"lora.r": [4]}, "method": "grid", "at_once": 0}, "from 1 to 64"),
    ],
)
def test_a_bad_sweep_is_refused_naming_the_key_and_the_fix(workdir: Path, sweep: dict, said: str) -> None:
    cfg = {"model": "./tiny-llama", "data": {"train": "data/add.jsonl"}, "sweep": sweep}
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert said in str(e.value), str(e.value)
    assert "sweep" in str(e.value)


def test_a_grid_is_every_combination_in_the_order_listed() -> None:
    s = SweepSettings.model_validate({"space": {"a.x": [1, 2], "b": ["p", "q", "r"]}, "method": "grid"})
    assert s.grid() == [{"a.x": x, "b": b} for x in (1, 2) for b in ("p", "q", "r")]
    assert budget_of(s) == 6
    fewer = SweepSettings.model_validate({**s.model_dump(), "trials": 4})
    assert budget_of(fewer) == 4
    assert s.goal == "minimize"  # eval_loss by default: a loss is minimised


def test_parameters_are_set_by_dotted_key_making_sections_where_missing() -> None:
    base = {"model": "m", "train": {"max_steps": 5}}
    cfg = space.apply(base, {"train.learning_rate": 1e-4, "lora.r": 8, "data.mix": space.encode([1, 2])})
    assert cfg == {"model": "m", "train": {"max_steps": 5, "learning_rate": 1e-4}, "lora": {"r": 8},
                   "data": {"mix": [1, 2]}}  # fmt: skip
    assert base == {"model": "m", "train": {"max_steps": 5}}  # the base is left as it was
    with pytest.raises(NbtrainError, match="model is 'm' in the config, not a section"):
        space.apply(base, {"model.x": 1})


def test_the_space_is_checked_at_every_choice_and_each_ranges_ends() -> None:
    sets = space.corners({"lr": {"log_uniform": [1e-5, 1e-3]}, "r": [4, 8, 16]})
    assert sets == [{"lr": 1e-5, "r": 4}, {"lr": 1e-3, "r": 8}, {"lr": 1e-3, "r": 16}]
    assert space.describe({"train.learning_rate": 3e-4, "lora.r": 8}) == "learning_rate=0.0003 r=8"


def test_a_value_of_the_space_that_breaks_the_config_is_refused_before_anything_starts(workdir: Path) -> None:
    cfg = lora_yaml(20) + "sweep:\n  space:\n    lora.r: [4, -2]\n  method: grid\n"
    with pytest.raises(ConfigError, match=r"a trial with lora.r=-2") as e:
        start_sweep(cfg)
    assert "lora.r" in str(e.value)
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())  # nothing written


def test_trials_at_once_share_the_cores_within_the_memory(workdir: Path) -> None:
    big = Hardware(cpu_count=8, ram_total=64 * GIB, ram_available=48 * GIB)
    prep = prepare(lora_yaml(20), hardware=big)
    cap = capacity(prep, budget=12)
    assert (cap.at_once, cap.threads) == (8, 1), cap
    assert "8 at once (limited by cores): 1 core each" in cap.why
    assert capacity(prep, budget=3).at_once == 3 and capacity(prep, budget=3).threads == 2
    # little memory: as many as fit in 80% of it
    small = Hardware(cpu_count=8, ram_total=4 * GIB, ram_available=int(2.5 * PROCESS_BYTES / 0.8) + 1)
    cap = capacity(prepare(lora_yaml(20), hardware=small), budget=12)
    assert cap.at_once <= 2 and "limited by memory" in cap.why, cap
    assert capacity(prep, budget=12, asked=3).why.startswith("3 at once as asked: 2 cores each")
