"""rewards: [{model: ...}] (objective: grpo / rloo) checked before anything starts: a reference that is not
an objective: reward run with trained weights, a reward-model folder or a Hub id is refused naming the
fix; rewards: under objective: reward points to the two-cell recipe. (Reward runs that train and are
used: tests/worker/test_rlhf.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from nbtrain.examples import write_dataset


def rl_yaml(
    rewards: str, *, objective: str = "rloo", data: str = "data/prompt.jsonl", train: str = ""
) -> str:
    return f"""\
model: ./tiny-llama
objective: {objective}
rewards: {rewards}
data: {{train: {data}}}
train:
  max_steps: 2
  per_device_train_batch_size: 4
  num_generations: 2
{train}"""


@pytest.fixture
def rldir(workdir: Path) -> Path:
    write_dataset(workdir / "data" / "prompt.jsonl", "prompt", n=16)
    write_dataset(workdir / "data" / "pairs.jsonl", "preference", n=16)
    return workdir


def problems(source: str, **kw: Any) -> list[str]:
    """The problems load_config finds, with the registry's runs to look reward models up in (as prepare
    gives them)."""
    from nbtrain.control.prepare import RegisteredRuns

    with pytest.raises(ConfigError) as ei:
        load_config(source, runs=RegisteredRuns(), **kw)
    return [p.render() for p in ei.value.problems]


def started(config: str, monkeypatch: pytest.MonkeyPatch, name: str) -> nbtrain.Run:
    """A registered run directory made by start() whose process is never launched (so it has no weights)."""
    from nbtrain.control import start

    monkeypatch.setattr(start, "_launch", lambda prep, run, lock: run)
    return nbtrain.start(nbtrain.prepare(config, name=name, namespace={}))


def test_rewards_under_objective_reward_point_to_the_two_cell_recipe(rldir: Path) -> None:
    text = rl_yaml("[format_reward]", objective="reward", data="data/pairs.jsonl").replace(
        "  num_generations: 2\n", ""
    )
    (msg,) = problems(text)
    assert "rewards: applies to objective: grpo or rloo only" in msg and "line 3" in msg
    assert "a reward model learns from the chosen/rejected pairs themselves" in msg
    assert "rewards: [{model: <this run's id>}]" in msg


def test_rloo_without_rewards_names_functions_builtins_and_reward_models(rldir: Path) -> None:
    out = problems(rl_yaml("[format_reward]").replace("rewards: [format_reward]\n", ""))
    assert any(
        "objective: rloo learns from rewards" in p and "rewards: [{model: <an objective: reward" in p
        for p in out
    )


def test_a_path_written_as_a_name_suggests_the_model_form(rldir: Path) -> None:
    (msg,) = problems(rl_yaml("[./runs/rm]"))
    assert "'./runs/rm' is not a function name" in msg
    assert "reward models as {model: ./runs/rm}" in msg


def test_a_missing_folder_or_unknown_run_is_refused_with_the_fix(rldir: Path) -> None:
    out = problems(rl_yaml("[{model: ./models/rm}, {model: rm-nowhere}]"))
    assert len(out) == 2
    assert "rewards.0.model" in out[0] and f"reward model not found: {rldir / 'models' / 'rm'}" in out[0]
    assert "no run, run directory or model folder is called 'rm-nowhere'" in out[1]
    for p in out:
        assert "give an objective: reward run (its id, name or directory" in p and "a Hub id (org/name)" in p
    assert nbtrain.runs() == []


def test_a_language_model_folder_is_not_a_reward_model(rldir: Path) -> None:
    (msg,) = problems(rl_yaml("[{model: ./tiny-llama}]"))
    assert "holds a language model (LlamaForCausalLM), not a reward model" in msg
    assert "Train one with objective: reward" in msg


def test_a_run_of_another_objective_or_without_weights_is_refused(
    rldir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started(
        "model: ./tiny-llama\ndata: {train: data/add.jsonl}\ntrain: {max_steps: 1}\n", monkeypatch, "sft-run"
    )
    rm = started(
        "model: ./tiny-llama\nobjective: reward\ndata: {train: data/pairs.jsonl}\ntrain: {max_steps: 1}\n",
        monkeypatch,
        "rm-run",
    )
    out = problems(rl_yaml(f"[{{model: sft-run}}, {{model: {rm.dir}}}]"))
    assert "rewards.0.model" in out[0] and "run sft-run was trained with objective: sft" in out[0]
    assert "a reward model is a run of objective: reward on chosen/rejected pairs" in out[0]
    assert "rewards.1.model" in out[1] and "run rm-run (queued) has no trained weights yet" in out[1]
    assert "%finetune checkpoint rm-run" in out[1]


def test_reward_weights_count_reward_models_too(rldir: Path) -> None:
    out = problems(rl_yaml("[format_reward, {model: ./tiny-llama}]", train="  reward_weights: [1.0]\n"))
    assert any("1 reward_weights for 2 rewards" in p for p in out)


def test_a_misspelt_reward_model_key_is_named(rldir: Path) -> None:
    (msg,) = problems(rl_yaml("[{modle: rm-a}]"))
    assert "unknown key 'modle'" in msg and "(did you mean 'model'?)" in msg
    assert "a reward model is {model: RUN}" in msg and "RewardModelRef" not in msg


def test_the_same_reward_model_twice_is_refused(rldir: Path) -> None:
    (msg,) = problems(rl_yaml("[{model: rm-a}, {model: rm-a}]"))
    assert "rewards: lists {model: rm-a} twice; use train: reward_weights" in msg


def test_the_rule_looks_runs_up_only_through_the_lookup_it_is_given(
    rldir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.control.config.rewardmodels import resolve
    from nbtrain.control.prepare import RegisteredRuns

    rm = started(
        "model: ./tiny-llama\nobjective: reward\ndata: {train: data/pairs.jsonl}\ntrain: {max_steps: 1}\n",
        monkeypatch,
        "rm-run",
    )
    source, problem = resolve("rm-run", rldir, None)  # the config package alone: no registry
    assert source is None and "no run, run directory or model folder is called 'rm-run'" in str(problem)
    source, problem = resolve("rm-run", rldir, RegisteredRuns())
    assert source is None and "run rm-run (queued) has no trained weights yet" in str(problem)
    assert RegisteredRuns().run_dir("rm-run") == rm.dir
