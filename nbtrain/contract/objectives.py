"""Training objectives: what ``objective:`` may say, and what each one needs (stdlib only).

``objective:`` is *what* is optimised (supervised fine-tuning, a preference loss, a reward model, online
RL from reward functions or a reward model); ``method:`` is *which weights* train (full, LoRA, QLoRA). The
two are orthogonal: every
available objective runs with every method. This table is shared by the kernel (validation, data
checks) and the worker (which TRL config and trainer to build), so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    name: str
    config_class: str  # "module:Class" of the TRL config whose fields train: takes
    trainer_class: str  # "module:Class" of the TRL trainer
    formats: tuple[str, ...]  # data formats it trains on, the first one preferred by format: auto
    summary: str
    rewards: bool = False  # online RL: learns from ``rewards:`` (functions, built-ins, reward models)
    # peft's task type, which is also the model's head: CAUSAL_LM generates text; SEQ_CLS is a sequence
    # classifier with one output, a reward model (AutoModelForSequenceClassification, num_labels=1)
    task: str = "CAUSAL_LM"


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "sft",
            "trl:SFTConfig",
            "trl:SFTTrainer",
            ("messages", "alpaca", "sharegpt", "text"),
            "supervised fine-tuning on demonstrations",
        ),
        Objective(
            "dpo",
            "trl:DPOConfig",
            "trl:DPOTrainer",
            ("preference",),
            "Direct Preference Optimization on chosen/rejected pairs",
        ),
        Objective(
            # ORPO lives in trl.experimental in TRL 1.x: reference-free, so no second model in memory.
            "orpo",
            "trl.experimental.orpo:ORPOConfig",
            "trl.experimental.orpo:ORPOTrainer",
            ("preference",),
            "Odds-Ratio Preference Optimization (SFT + preference in one loss, no reference model)",
        ),
        Objective(
            # KTOTrainer unpairs chosen/rejected data itself, so paired preference rows work too.
            "kto",
            "trl:KTOConfig",
            "trl:KTOTrainer",
            ("unpaired", "preference"),
            "Kahneman-Tversky Optimization on completions labelled good or bad",
        ),
        Objective(
            # A reward model for grpo / rloo (rewards: [{model: <this run>}]); eval pairs measure accuracy.
            "reward",
            "trl:RewardConfig",
            "trl:RewardTrainer",
            ("preference",),
            "a reward model that learns to score the chosen answer above the rejected one",
            task="SEQ_CLS",
        ),
        Objective(
            "grpo",
            "trl:GRPOConfig",
            "trl:GRPOTrainer",
            ("prompt",),
            "Group Relative Policy Optimization: online RL from reward functions or a reward model",
            rewards=True,
        ),
        Objective(
            "rloo",
            "trl:RLOOConfig",
            "trl:RLOOTrainer",
            ("prompt",),
            "REINFORCE Leave-One-Out: online RL from reward functions or a reward model",
            rewards=True,
        ),
    )
}

# Objectives a user may name that the installed TRL cannot run, with the reason and the alternative.
UNAVAILABLE: dict[str, str] = {
    "ppo": (
        "TRL 1.x replaced PPOTrainer with RLOO and GRPO (it is neither in trl nor in trl.experimental). "
        "RLHF with a reward model is two cells: 1) objective: reward on chosen/rejected pairs trains the "
        "reward model (its eval split reports pairwise accuracy); 2) objective: rloo (or grpo) on prompts "
        "with rewards: [{model: <that run's id or folder>}] trains the policy against it, no value model "
        "needed. For offline preference data alone, objective: dpo / kto"
    ),
}

OBJECTIVE_NAMES = (*OBJECTIVES, *UNAVAILABLE)


def rewards_objectives() -> tuple[str, ...]:
    """The objectives that take ``rewards:`` (online RL)."""
    return tuple(name for name, o in OBJECTIVES.items() if o.rewards)


def objective(name: str) -> Objective:
    """The objective called ``name``; KeyError for unavailable or unknown names."""
    return OBJECTIVES[name]
