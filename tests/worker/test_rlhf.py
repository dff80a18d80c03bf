"""RLHF with a reward model, for real on the tiny model (CPU): objective: reward learns to rank held-out
preference pairs (method lora and full), and objective: rloo trained against that reward run raises the
reward it gives (rewards: [{model: <run>}], mixed with a built-in through reward_weights).

The task: the chosen answer is the sum written out, the rejected one a few common words
(``preference_rows(rejected="words")``), which a tiny reward model learns in a few steps. The runs are
module fixtures: each trains once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.examples import preference_rows, write_dataset
from tests.conftest import runs_in

pytestmark = pytest.mark.slow

HELD_OUT = 32


def reward_yaml(method: str, lr: str) -> str:
    return f"""\
model: ./tiny-llama
method: {method}
objective: reward
data: {{train: data/pairs.jsonl, eval_split: {HELD_OUT}}}
train:
  max_steps: 16
  learning_rate: {lr}
  per_device_train_batch_size: 8
  eval_on_start: true
  center_rewards_coefficient: 0.1
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("rlhf")
    (work / "tiny-llama").symlink_to(tiny_model)
    rows = preference_rows("preference", n=160, rejected="words")
    (work / "data").mkdir()
    (work / "data" / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    write_dataset(work / "data" / "prompts.jsonl", "prompt", n=64, seed=3)
    with runs_in(work):
        yield work


@pytest.fixture(scope="module")
def lora_rm(work: Path) -> nbtrain.Run:
    run = nbtrain.finetune(reward_yaml("lora", "1.0e-2"), name="rm-lora")
    assert run.wait(timeout=600).state == "completed", run.logs(80)
    return run


@pytest.fixture(scope="module")
def full_rm(work: Path) -> nbtrain.Run:
    run = nbtrain.finetune(reward_yaml("full", "1.0e-3"), name="rm-full")
    assert run.wait(timeout=600).state == "completed", run.logs(80)
    return run


@pytest.fixture(scope="module")
def rloo(work: Path, lora_rm: nbtrain.Run) -> nbtrain.Run:
    run = nbtrain.finetune(
        """\
model: ./tiny-llama
method: full
objective: rloo
rewards: [{model: rm-lora}, format_reward]
data: {train: data/prompts.jsonl}
train:
  max_steps: 16
  learning_rate: 5.0e-2
  per_device_train_batch_size: 16
  num_generations: 4
  max_completion_length: 4
  normalize_advantages: true
  beta: 0.0
  reward_weights: [1.0, 0.5]
""",
        name="rloo",
    )
    assert run.wait(timeout=900).state == "completed", run.logs(80)
    return run


def evals(run: nbtrain.Run) -> list[dict[str, float]]:
    m = run.metrics()
    return m[m["eval_loss"].notna()][["step", "eval_loss", "eval_accuracy", "eval_margin"]].to_dict("records")


def test_a_lora_reward_model_ranks_held_out_pairs_above_chance(lora_rm: nbtrain.Run) -> None:
    first, *_, last = evals(lora_rm)
    assert first["step"] == 0 and first["eval_loss"] > 0.6  # untrained: near log 2, what no preference scores
    assert last["step"] == 16 and last["eval_accuracy"] >= 0.9 and last["eval_loss"] < 0.3
    assert last["eval_margin"] > first["eval_margin"] + 1.0
    log = lora_rm.logs(400)
    accuracy = f"{last['eval_accuracy']:.3f}"
    assert f"nbtrain: reward model: pairwise accuracy {accuracy} on {HELD_OUT} held-out pairs" in log
    assert "reward reference model: none" in log
    # The score head is new: with LoRA it trains in full and is saved beside the adapter.
    adapter = json.loads((lora_rm.output_dir / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]
    from safetensors import safe_open

    with safe_open(str(lora_rm.output_dir / "adapter_model.safetensors"), "pt") as f:
        assert any(k.endswith("score.weight") for k in f.keys())  # noqa: SIM118 - safe_open has no __iter__


def test_a_full_reward_model_is_saved_as_a_sequence_classifier(full_rm: nbtrain.Run) -> None:
    last = evals(full_rm)[-1]
    assert last["eval_accuracy"] >= 0.9 and last["eval_loss"] < math.log(2) / 2
    config = json.loads((full_rm.output_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1


def test_the_lora_reward_run_loads_merged_and_scores_chosen_above_rejected(lora_rm: nbtrain.Run) -> None:
    """What RLOO scores with: the run's adapter and score head merged into a plain sequence classifier."""
    import torch
    from transformers import LlamaForSequenceClassification

    from nbtrain.worker.tuned import load_reward_model

    model, tok = load_reward_model(str(lora_rm.dir))
    assert type(model) is LlamaForSequenceClassification and model.config.name_or_path == "rm-lora"
    pairs = preference_rows("preference", n=160, rejected="words")[-HELD_OUT:]

    def scores(side: str) -> torch.Tensor:
        texts = [tok.apply_chat_template(p["prompt"] + p[side], tokenize=False) for p in pairs]
        batch = tok(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        with torch.inference_mode():
            return model(**batch).logits[:, 0]

    assert (scores("chosen") > scores("rejected")).float().mean().item() >= 0.9


def test_rloo_against_the_reward_run_raises_its_reward(rloo: nbtrain.Run, lora_rm: nbtrain.Run) -> None:
    m = rloo.metrics()
    assert {"reward", "reward_std", "rewards/rm-lora/mean", "rewards/format_reward/mean"} <= set(m.columns)
    assert m["step"].tolist()[:16] == list(range(1, 17))
    rm = m["rewards/rm-lora/mean"]
    early, late = rm.head(4).mean(), rm.tail(4).mean()
    assert late > early + 0.5, rm.round(3).tolist()
    # reward = 1.0 x the reward model + 0.5 x format_reward (0 on these completions)
    assert (m["reward"] - (rm + 0.5 * m["rewards/format_reward/mean"])).abs().max() < 1e-4
    log = rloo.logs(300)
    assert f"nbtrain: rloo rewards: rm-lora (reward model {lora_rm.dir}), format_reward" in log
    assert "rloo reference model: none (beta is 0" in log
    resolved = json.loads((rloo.dir / "resolved.json").read_text())
    assert resolved["config"]["rewards"] == [{"model": str(lora_rm.dir)}, "format_reward"]


def test_a_reward_run_refuses_to_generate_and_exports_as_a_sequence_classifier(
    lora_rm: nbtrain.Run, work: Path
) -> None:
    with pytest.raises(NbtrainError) as ei:
        lora_rm.generate("What is 2 + 3?")
    assert "is a reward model (objective: reward): it scores answers and generates none" in str(ei.value)
    assert f"rewards: [{{model: {lora_rm.id}}}]" in str(ei.value)
    from transformers import AutoModelForSequenceClassification

    lora_rm.export(to=work / "rm-merged")
    model = AutoModelForSequenceClassification.from_pretrained(work / "rm-merged")
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1


def test_grpo_scores_with_a_full_reward_run_named_by_its_directory(work: Path, full_rm: nbtrain.Run) -> None:
    run = nbtrain.finetune(
        f"""\
model: {work}/tiny-llama
method: lora
objective: grpo
rewards: [{{model: {full_rm.dir}}}]
data: {{train: {work}/data/prompts.jsonl}}
train: {{max_steps: 2, per_device_train_batch_size: 4, num_generations: 2, max_completion_length: 4}}
""",
        name="grpo-rm",
    )
    assert run.wait(timeout=600).state == "completed", run.logs(80)
    m = run.metrics()
    scores = m["rewards/rm-full/mean"]
    assert len(scores) == 2 and scores.notna().all() and (m["reward"] == scores).all()
    assert (m["reward_std"] > 0).all()  # the reward model tells the sampled answers apart
