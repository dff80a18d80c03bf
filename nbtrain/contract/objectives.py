"""Training objectives: what ``objective:`` may say, and what each one needs (stdlib only).

``objective:`` is *what* is optimised (supervised fine-tuning, a preference loss, online RL with reward
functions); ``method:`` is *which weights* train (full, LoRA, QLoRA). The two are orthogonal: every
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
            "grpo",
            "trl:GRPOConfig",
            "trl:GRPOTrainer",
            ("prompt",),
            "Group Relative Policy Optimization: online RL from reward functions",
        ),
    )
}

# Objectives a user may name that the installed TRL cannot run, with the reason and the alternative.
UNAVAILABLE: dict[str, str] = {
    "ppo": (
        "TRL 1.x removed PPOTrainer (it is neither in trl nor in trl.experimental), so nbtrain cannot "
        "run PPO. Use objective: grpo for online RL from reward functions (no value model needed), or "
        "objective: dpo / kto for offline preference data"
    ),
}

OBJECTIVE_NAMES = (*OBJECTIVES, *UNAVAILABLE)


def objective(name: str) -> Objective:
    """The objective called ``name``; KeyError for unavailable or unknown names."""
    return OBJECTIVES[name]
