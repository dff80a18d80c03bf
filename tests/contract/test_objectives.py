"""objective: (sft | dpo | orpo | kto | reward | grpo | rloo | ppo) in the config: train: keys checked
against the objective's TRL config, data checked for it, GRPO reward functions captured from the
notebook, and every mismatch reported before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract import rewards
from nbtrain.contract.errors import ConfigError
from nbtrain.contract.objectives import OBJECTIVE_NAMES, OBJECTIVES
from nbtrain.control.config import trainargs
from nbtrain.control.config.load import load_config
from nbtrain.examples import write_dataset


def yaml_for(objective: str, data: str, *, train: str = "", extra: str = "", method: str = "lora") -> str:
    return f"""\
model: ./tiny-llama
method: {method}
objective: {objective}
data:
  train: {data}
train:
  max_steps: 2
{train}{extra}"""


def problems(source: str, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(source, **kw)
    return [p.render() for p in ei.value.problems]


@pytest.fixture
def prefdir(workdir: Path) -> Path:
    for fmt in ("preference", "unpaired", "prompt"):
        write_dataset(workdir / "data" / f"{fmt}.jsonl", fmt, n=16)
    return workdir


def correct_sum(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    return [1.0 if a in rewards.completion_text(c) else 0.0 for c, a in zip(completions, answer, strict=True)]


# ---------------------------------------------------------------------------------- TRL snapshots


def test_every_objective_snapshot_matches_installed_trl(tmp_path: Path) -> None:
    """train: keys are validated from shipped snapshots; they must equal what the installed TRL says."""
    subprocess.run(
        [sys.executable, "-m", "nbtrain.worker.introspect", "--assets", str(tmp_path)],
        check=True,
        timeout=300,
    )
    for objective in OBJECTIVES:
        name = f"{objective}_fields.json"
        fresh = json.loads((tmp_path / name).read_text())
        shipped = json.loads(resources.files("nbtrain").joinpath(f"assets/{name}").read_text())
        assert shipped == fresh, (
            f"regenerate: python -m nbtrain.worker.introspect --assets nbtrain/assets ({name})"
        )


def test_train_keys_are_checked_against_the_objectives_config() -> None:
    assert trainargs.check_key("beta", "dpo") is None
    assert trainargs.check_key("num_generations", "grpo") is None
    assert trainargs.check_key("desirable_weight", "kto") is None
    assert trainargs.check_key("learning_rate", "orpo") is None
    msg = trainargs.check_key("num_generations", "dpo") or ""
    assert "for objective: dpo; it belongs to objective: grpo" in msg and "DPOConfig" in msg
    assert "did you mean 'beta'" in (trainargs.check_key("betta", "dpo") or "")
    assert trainargs.check_value("loss_type", "ipo", "dpo") is None  # DPOConfig takes a str or a list
    assert trainargs.check_value("num_generations", "four", "grpo") is not None
    assert trainargs.config_name("kto") == "KTOConfig"


# ---------------------------------------------------------------------------------- config checks


def test_dpo_config_resolves_with_preference_data_and_a_note(prefdir: Path) -> None:
    res = load_config(yaml_for("dpo", "data/preference.jsonl", train="  beta: 0.2\n"))
    assert res.config.objective == "dpo" and res.config.method == "lora"
    assert res.train_data.format == "preference"
    assert any("objective: dpo" in n for n in res.notes)
    prep = nbtrain.prepare(yaml_for("dpo", "data/preference.jsonl"))
    assert "train args (DPOConfig)" in prep.summary() and prep.name == "tiny-llama-lora-dpo"
    assert prep.rewards is None


def test_existing_sft_configs_are_unchanged(workdir: Path) -> None:
    res = load_config(yaml_for("sft", "data/add.jsonl").replace("objective: sft\n", ""))
    assert res.config.objective == "sft" and res.config.rewards is None
    assert res.train_data.format == "messages"


def test_sft_data_for_dpo_is_rejected_before_launch_with_the_row(prefdir: Path) -> None:
    out = problems(yaml_for("dpo", "data/add.jsonl"))
    assert len(out) == 1
    assert "data.train" in out[0] and "row 1 is not data objective: dpo trains on" in out[0]
    assert "It looks like SFT data (messages)" in out[0] and "What is" in out[0]
    assert not (prefdir / "runs").exists()


def test_a_bad_row_deep_in_preference_data_is_shown(prefdir: Path) -> None:
    path = prefdir / "data" / "preference.jsonl"
    lines = path.read_text().splitlines()
    lines[5] = json.dumps({"prompt": [{"role": "user", "content": "q"}], "chosen": 5, "rejected": "x"})
    path.write_text("\n".join(lines) + "\n")
    out = problems(yaml_for("dpo", "data/preference.jsonl"))
    assert "row 6 is not valid preference data" in out[0] and '"chosen": 5' in out[0]


def test_format_that_the_objective_does_not_train_on_is_rejected(prefdir: Path) -> None:
    text = yaml_for("orpo", "data/preference.jsonl").replace(
        "  train: data", "  format: messages\n  train: data"
    )
    out = problems(text)
    assert any("format: messages is SFT data, which objective: orpo does not train on" in p for p in out)


def test_train_key_of_another_objective_names_it(prefdir: Path) -> None:
    out = problems(yaml_for("dpo", "data/preference.jsonl", train="  num_generations: 4\n"))
    assert len(out) == 1 and "train.num_generations" in out[0]
    assert "it belongs to objective: grpo" in out[0] and "line 8" in out[0]


def test_schema_names_every_objective_of_the_table() -> None:
    from typing import get_args

    from nbtrain.control.config.schema import RunConfig

    assert get_args(RunConfig.model_fields["objective"].annotation) == OBJECTIVE_NAMES


def test_ppo_is_not_available_in_trl_1_16_and_the_two_cell_recipe_replaces_it() -> None:
    out = problems({"model": "./nowhere", "objective": "ppo", "data": {"train": "x.jsonl"}})
    msg = next(p for p in out if p.startswith("- objective"))
    assert "objective: ppo is not available in TRL 1.16" in msg
    assert "replaced PPOTrainer with RLOO and GRPO" in msg
    assert "1) objective: reward on chosen/rejected pairs" in msg
    assert "2) objective: rloo (or grpo) on prompts with rewards: [{model: <that run's id or folder>}]" in msg


def test_columns_map_odd_names_before_the_check(prefdir: Path) -> None:
    rows = [{"question": f"q{i}", "good": "yes", "bad": "no"} for i in range(4)]
    (prefdir / "data" / "odd.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cols = "  columns: {prompt: question, chosen: good, rejected: bad}\n"
    text = yaml_for("dpo", "data/odd.jsonl").replace(
        "  train: data/odd.jsonl\n", f"  train: data/odd.jsonl\n{cols}"
    )
    res = load_config(text)
    assert res.config.data.columns == {"prompt": "question", "chosen": "good", "rejected": "bad"}
    assert res.train_data.format == "preference"
    out = problems(text.replace("chosen: good", "chosen: great"))
    assert "no column 'great'" in out[0]
    out = problems(text.replace("{prompt:", "{promt:"))
    assert "data.columns" in out[0] and "did you mean 'prompt'" in out[0]


def prepare_problems(source: str, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        nbtrain.prepare(source, **kw)
    return [p.render() for p in ei.value.problems]


def test_columns_also_map_sft_data(workdir: Path) -> None:
    rows = [{"body": f"{i} + 1 = {i + 1}"} for i in range(4)]
    (workdir / "data" / "body.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = yaml_for("sft", "data/body.jsonl").replace(
        "  train: data/body.jsonl\n", "  train: data/body.jsonl\n  columns: {text: body}\n"
    )
    assert load_config(text).train_data.format == "text"


def test_kto_with_one_label_only_or_batch_of_one_is_rejected(prefdir: Path) -> None:
    rows = [{"prompt": "p", "completion": "c", "label": True}] * 4
    (prefdir / "data" / "good.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = problems(yaml_for("kto", "data/good.jsonl"))
    assert "all 4 rows have label true" in out[0]
    out = prepare_problems(yaml_for("kto", "data/unpaired.jsonl", train="  per_device_train_batch_size: 1\n"))
    assert "per_device_train_batch_size of 2 or more" in out[0] and "line 8" in out[0]


def test_grpo_needs_rewards_and_whole_generation_groups(prefdir: Path) -> None:
    out = problems(yaml_for("grpo", "data/prompt.jsonl"))
    assert any("objective: grpo learns from rewards: add rewards: [my_reward]" in p for p in out)
    out = problems(yaml_for("dpo", "data/preference.jsonl", extra="rewards: [format_reward]\n"))
    assert any("rewards: applies to objective: grpo or rloo only (objective is dpo)" in p for p in out)
    weights = "  reward_weights: [1.0]\n  per_device_train_batch_size: 2\n  num_generations: 2\n"
    out = problems(yaml_for("grpo", "data/prompt.jsonl", train=weights, extra="rewards: [a, b]\n"))
    assert any("1 reward_weights for 2 rewards" in p for p in out)
    # The batch is only known once planned (processes, a micro-batch the planner may pick): prepare() checks.
    bad = "  per_device_train_batch_size: 3\n  num_generations: 2\n"
    out = prepare_problems(
        yaml_for("grpo", "data/prompt.jsonl", train=bad, extra="rewards: [length_reward]\n")
    )
    assert len(out) == 1 and "train.num_generations" in out[0]
    assert "generation batch (3 = per_device_train_batch_size 3 x 1 process(es)" in out[0]
    assert "must be a multiple of num_generations (2)" in out[0]


# ---------------------------------------------------------------------------------- reward capture

GRPO_TRAIN = "  per_device_train_batch_size: 2\n  num_generations: 2\n"


def test_notebook_reward_and_builtins_are_captured_and_load_back(prefdir: Path) -> None:
    text = yaml_for(
        "grpo", "data/prompt.jsonl", train=GRPO_TRAIN, extra="rewards: [correct_sum, format_reward]\n"
    )
    prep = nbtrain.prepare(text, namespace={"correct_sum": correct_sum})
    assert prep.rewards is not None and "rewards: correct_sum, format_reward" in prep.summary()
    path = prefdir / "rewards.pkl"
    path.write_bytes(prep.rewards)
    fns = rewards.load(path)
    assert fns[1] is rewards.format_reward
    assert fns[0](completions=["1 + 2 = 3", "nope"], answer=["3", "3"], prompts=["", ""]) == [1.0, 0.0]


def test_start_writes_rewards_next_to_the_run(prefdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """start() puts the captured rewards in the run dir before the worker starts (launch stubbed)."""
    from nbtrain.control import start

    monkeypatch.setattr(start, "_launch", lambda prep, run, lock: run)
    text = yaml_for("grpo", "data/prompt.jsonl", train=GRPO_TRAIN, extra="rewards: [length_reward]\n")
    run = nbtrain.start(nbtrain.prepare(text, namespace={}))
    assert rewards.load(run.dir / "rewards.pkl") == [rewards.length_reward]


def test_missing_reward_function_is_named_with_its_line(prefdir: Path) -> None:
    text = yaml_for("grpo", "data/prompt.jsonl", train=GRPO_TRAIN, extra="rewards:\n  - correct_summ\n")
    with pytest.raises(ConfigError) as ei:
        nbtrain.prepare(text, namespace={"correct_sum": correct_sum})
    (p,) = ei.value.problems
    assert p.path == "rewards.0" and p.line == 11
    assert "no function named 'correct_summ' in the notebook; did you mean 'correct_sum'?" in p.message
    assert nbtrain.runs() == []


def test_unserialisable_reward_function_is_rejected_before_launch(prefdir: Path) -> None:
    lock = threading.Lock()

    def locked_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        with lock:
            return [0.0] * len(completions)

    text = yaml_for("grpo", "data/prompt.jsonl", train=GRPO_TRAIN, extra="rewards: [locked_reward]\n")
    with pytest.raises(ConfigError) as ei:
        nbtrain.prepare(text, namespace={"locked_reward": locked_reward})
    msg = str(ei.value)
    assert "reward function 'locked_reward' cannot be serialised" in msg and "lock" in msg
    assert nbtrain.runs() == []


def test_reward_without_kwargs_or_not_a_function_is_rejected(prefdir: Path) -> None:
    def strict(prompts: list[str], completions: list[str]) -> list[float]:
        return [0.0] * len(completions)

    text = yaml_for("grpo", "data/prompt.jsonl", train=GRPO_TRAIN, extra="rewards: [strict, answer]\n")
    with pytest.raises(ConfigError) as ei:
        nbtrain.prepare(text, namespace={"strict": strict, "answer": 42})
    msgs = [p.message for p in ei.value.problems]
    assert "must accept **kwargs" in msgs[0] and "def strict(completions, **kwargs)" in msgs[0]
    assert "'answer' in the notebook is a int, not a function" in msgs[1]


def test_builtin_rewards_score_format_and_length() -> None:
    done = "<think>add</think> <answer>5</answer>"
    assert rewards.format_reward([done, "<answer>5</answer>", "5"]) == [1.0, 0.5, 0.0]
    conv = [[{"role": "assistant", "content": done}]]
    assert rewards.format_reward(conv) == [1.0]
    assert rewards.length_reward(["x" * 10, "x" * 30, "x" * 50], target_length=[20, 20, 20]) == [
        1.0,
        0.5,
        0.0,
    ]


# --- padding-free batches: the cost rule (contract/objectives.padding_free_bins)

SMOL = {"layer_params": 3_981_312, "attention_width": 576, "heads": 9, "layers": 30}  # SmolLM2-135M


def test_short_rows_are_laid_end_to_end_in_the_cheapest_number_of_sequences() -> None:
    from nbtrain.contract.objectives import padding_free_bins

    # the bench's rows: 8 of 20-90 tokens; one 452-token sequence would score 204k pairs a head, two of
    # ~230 score half that for the same weights' work (measured: 1.34x the steps/s of padding, one sequence)
    bins = padding_free_bins([20, 35, 52, 60, 44, 90, 71, 30], **SMOL, varlen=False)
    assert bins is not None and len(bins) == 2
    assert sorted(i for b in bins for i in b) == list(range(8))  # every row once


def test_long_rows_are_split_where_one_sequence_would_score_too_many_pairs() -> None:
    from nbtrain.contract.objectives import padding_free_bins

    long_rows = [300, 650, 900, 1000, 700, 450, 800, 520]  # one sequence: 5,320 tokens, 28M pairs a head
    bins = padding_free_bins(long_rows, **SMOL, varlen=False)
    assert bins is not None and 1 < len(bins) < 8
    widths = [sum(long_rows[i] for i in b) for b in bins]
    assert len(bins) * max(widths) ** 2 < 8 * 1000**2  # fewer pairs than padded, and fewer positions
    assert padding_free_bins(long_rows, **SMOL, varlen=True) == [list(range(8))]  # flash-attention: one


def test_flattening_is_refused_where_its_attention_would_keep_too_much_memory() -> None:
    from nbtrain.contract.objectives import PADDING_FREE_EXTRA_ATTENTION_BYTES, padding_free_bins

    # a 7B-like layer: the weights dominate, so one sequence of 8 x ~600 tokens costs fewer FLOPs, but SDPA
    # would keep 32 heads x 5,000^2 scores in every layer; more sequences, fewer pairs, are still taken
    big = {"layer_params": 200_000_000, "attention_width": 4096, "heads": 32, "layers": 32}
    rows = [600, 500, 700, 400, 650, 550, 620, 1024]
    extra = (sum(rows) ** 2 - 8 * 1024**2) * 32 * 4 * 32
    assert extra > PADDING_FREE_EXTRA_ATTENTION_BYTES
    bins = padding_free_bins(rows, **big, varlen=False)
    assert bins is not None and len(bins) > 1
    assert padding_free_bins(rows, **big, varlen=True) == [list(range(8))]


def test_one_row_or_equal_rows_have_nothing_to_gain() -> None:
    from nbtrain.contract.objectives import padding_free_bins

    assert padding_free_bins([50], **SMOL, varlen=True) is None
    assert padding_free_bins([50, 50, 50], **SMOL, varlen=True) is None
    assert padding_free_bins([52] * 8, **SMOL, varlen=False) is None
    assert padding_free_bins([], **SMOL, varlen=False) is None
