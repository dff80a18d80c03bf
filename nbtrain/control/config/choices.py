"""What ``method:``, ``distributed: strategy/offload/launcher`` and ``precision:`` may say, in one place.

The config schema, the lab preset, the memory estimator and the planner all name these; each imports them
from here so a new strategy or method is added once. Stdlib only: the estimator imports this module and
must stay importable without pydantic or the rest of the config package.

``Literal`` types nest (``Literal["auto", Strategy]`` is one flat Literal), so a field that also takes
"auto" keeps pydantic's single "Input should be ..." message listing every value.
"""

from __future__ import annotations

from typing import Literal, get_args

Method = Literal["full", "lora", "qlora"]
Strategy = Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp"]
# nvme: ZeRO-Infinity, parameters and optimizer state swapped to files under distributed.nvme_path
Offload = Literal["none", "optimizer", "optimizer+params", "nvme"]
Launcher = Literal["accelerate", "deepspeed", "torchrun", "notebook"]
Precision = Literal["fp32", "fp16", "bf16"]
# Objectives nbtrain runs (nbtrain.contract.objectives' OBJECTIVES; tests hold the two equal), and those a
# config may name: "ppo" too, so that load_config can explain why it is unavailable.
AvailableObjective = Literal["sft", "dpo", "orpo", "kto", "reward", "grpo", "rloo"]
ObjectiveName = Literal[AvailableObjective, "ppo"]

METHODS: tuple[str, ...] = get_args(Method)
STRATEGIES: tuple[str, ...] = get_args(Strategy)
OFFLOADS: tuple[str, ...] = get_args(Offload)
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
PRECISIONS: tuple[str, ...] = get_args(Precision)

ZERO_STAGES: dict[str, int] = {"zero1": 1, "zero2": 2, "zero3": 3}  # DeepSpeed ZeRO strategies

__all__ = [
    "LAUNCHERS",
    "METHODS",
    "OFFLOADS",
    "PRECISIONS",
    "STRATEGIES",
    "ZERO_STAGES",
    "AvailableObjective",
    "Launcher",
    "Method",
    "ObjectiveName",
    "Offload",
    "Precision",
    "Strategy",
]
