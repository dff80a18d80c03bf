"""Facts about LoRA adapters the kernel's checks and the worker share (standard library only)."""

from __future__ import annotations

from typing import Any

# lora: keys that are nbtrain's own rather than peft's LoraConfig fields
NBTRAIN_LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "bias", "loraplus_lr_ratio")


def converts_init(init: Any) -> bool:
    """Whether an adapter initialised this way changes the base weights (PiSSA, OLoRA): the run's result is
    then saved converted to a plain LoRA (of twice the rank) that loads on the untouched base model."""
    return isinstance(init, str) and (init == "olora" or init.startswith("pissa"))


def peft_fields(lora: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``lora:`` that are peft's LoraConfig fields, as written (use_dora, init_lora_weights,
    ...)."""
    return {k: v for k, v in lora.items() if k not in NBTRAIN_LORA_KEYS}
