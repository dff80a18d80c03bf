"""Property-based bad input: whatever YAML or dict is thrown at the validator, it is either accepted
into a valid config or rejected with a readable ConfigError; never a traceback from inside nbtrain,
never a started process, never a written run dir."""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config

KEYS = ["model", "method", "data", "train", "lora", "quantization", "precision", "distributed", "name",
        "resume", "trust_remote_code", "methd", "lr", "max_steps", "format", "r", "strategy"]  # fmt: skip
VALUES = [
    "./tiny-llama",
    "lora",
    "qlora",
    "full",
    "auto",
    "data/add.jsonl",
    "zero3",
    "none",
    "../x",
    "",
    "3e-4",
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(string.printable, max_size=20), st.sampled_from(VALUES),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)  # fmt: skip
configs = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
# Half-valid configs exercise the deeper checks (paths, formats, TRL keys, distributed combinations).
near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(["./tiny-llama", "./nope", "org/model"]),
     "data": st.fixed_dictionaries({"train": st.sampled_from(["data/add.jsonl", "data/none.jsonl", "x/y"])},
                                   optional={"format": st.sampled_from(["auto", "text", "alpaca", "bad"]),
                                             "eval_split": scalars}),
     "train": st.dictionaries(
         st.sampled_from(["max_steps", "learning_rate", "optim", "lr", "bf16", "output_dir"]), scalars,
         max_size=4,
     )},
    optional={"method": st.sampled_from(["lora", "full", "qlora", "dpo"]), "lora": values,
              "distributed": st.dictionaries(
                  st.sampled_from(["strategy", "offload", "num_processes", "nodes"]),
                  scalars | st.sampled_from(["zero3", "ddp", "optimizer"]), max_size=3,
              )},
)  # fmt: skip

# 250 examples a test in the suite (~20 s in all); NBTRAIN_FUZZ_EXAMPLES for a longer hunt.
EXAMPLES = int(os.environ.get("NBTRAIN_FUZZ_EXAMPLES", "250"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def check(source: Any, workdir: Path) -> None:
    try:
        res = load_config(source)
    except ConfigError as e:
        text = str(e)
        assert text.startswith("Invalid nbtrain config") and "Nothing was started" in text
        assert all(p.message for p in e.problems)
    else:
        assert res.config.model and res.train_data is not None
    assert not (workdir / "runs").exists()


@FUZZ
@given(configs)
def test_random_config_dicts_are_accepted_or_rejected_readably(workdir: Path, cfg: dict[str, Any]) -> None:
    check(cfg, workdir)


@FUZZ
@given(near_valid)
def test_near_valid_configs_are_accepted_or_rejected_readably(workdir: Path, cfg: dict[str, Any]) -> None:
    check(cfg, workdir)


@FUZZ
@given(
    st.text(string.printable, max_size=200)
    | configs.map(lambda c: yaml.safe_dump(c, default_flow_style=bool(len(c) % 2)))
)
def test_random_yaml_text_is_accepted_or_rejected_readably(workdir: Path, text: str) -> None:
    if text.strip().endswith((".yaml", ".yml")) and "\n" not in text:
        text += "\n"  # a one-line name ending in .yaml is read as a path, which is tested elsewhere
    check(text, workdir)


def test_nothing_was_started_by_the_fuzzing(workdir: Path) -> None:
    with pytest.raises(ConfigError):
        nbtrain.finetune({"model": "./nope", "data": {"train": "none.jsonl"}})
    assert nbtrain.runs() == []
