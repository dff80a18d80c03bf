"""Loading the tokenizer and the model as resolved.json says: shared by every recipe (SFT, DPO, ORPO, KTO,
GRPO), so ``method: full | lora | qlora`` means the same thing whatever the objective.

The SFT recipe wraps the model in its LoRA adapter itself (``load_model(..., attach_lora=True)``); the
preference and RL recipes hand the base model plus ``lora_config()`` to the TRL trainer instead, which
then uses the adapter-disabled base as the reference model (no second copy of the weights in memory).
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def compute_dtype(plan: dict[str, Any]) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan["precision"], torch.float32)


def load_tokenizer(cfg: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        cfg["model"], trust_remote_code=cfg["trust_remote_code"], revision=cfg.get("revision")
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def lora_config(cfg: dict[str, Any]) -> Any:
    """The peft LoraConfig of ``lora:``, or None for method: full."""
    if cfg["method"] not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    lo = cfg["lora"]
    target = lo["target_modules"]
    return LoraConfig(
        r=lo["r"],
        lora_alpha=lo["alpha"],
        lora_dropout=lo["dropout"],
        bias=lo["bias"],
        target_modules=None if target == "auto" else target,
        task_type="CAUSAL_LM",
    )


def quantization_config(cfg: dict[str, Any], plan: dict[str, Any]) -> Any:
    """The bitsandbytes config of ``quantization:`` (4-bit NF4/FP4 with the compute dtype, or 8-bit)."""
    from transformers import BitsAndBytesConfig

    q = cfg["quantization"]
    if q["bits"] == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q["quant_type"],
            bnb_4bit_use_double_quant=q["double_quant"],
            bnb_4bit_compute_dtype=compute_dtype(plan),
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def load_model(
    cfg: dict[str, Any], plan: dict[str, Any], args: dict[str, Any], *, attach_lora: bool = True
) -> Any:
    """The model for ``method``: fp32 weights (full), a frozen base in the compute dtype (LoRA), or a
    bitsandbytes-quantised base prepared for k-bit training (QLoRA); with ``attach_lora`` and a LoRA
    method, wrapped in a freshly initialised adapter."""
    import torch
    from transformers import AutoModelForCausalLM

    method = cfg["method"]
    # revision: a Hub model's branch, tag or commit (absent from older run directories: the default)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg["trust_remote_code"], "revision": cfg.get("revision")}
    on_gpu = plan["device"] == "cuda"
    if method == "qlora":
        kwargs["quantization_config"] = quantization_config(cfg, plan)
        kwargs["dtype"] = compute_dtype(plan)
        kwargs["device_map"] = {"": 0} if on_gpu else {"": "cpu"}
    elif method == "lora":
        # The frozen base can live in the compute dtype; only the adapters train.
        kwargs["dtype"] = compute_dtype(plan) if on_gpu else torch.float32
    else:
        kwargs["dtype"] = torch.float32  # full fine-tune keeps fp32 master weights; AMP does the rest
    model: Any = AutoModelForCausalLM.from_pretrained(cfg["model"], **kwargs)
    if method == "qlora":
        from peft import prepare_model_for_kbit_training

        bits = cfg["quantization"]["bits"]
        if not getattr(model, f"is_loaded_in_{bits}bit", False):
            raise RuntimeError(f"bitsandbytes did not quantise {cfg['model']} to {bits}-bit")
        print(f"nbtrain: base weights loaded in {bits}-bit by bitsandbytes", flush=True)

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=bool(args.get("gradient_checkpointing", True))
        )
    if attach_lora and method in ("lora", "qlora"):
        from peft import get_peft_model
        from transformers import set_seed

        set_seed(int(args.get("seed", 42)))  # adapter init is random: seed it for reproducible runs
        model = get_peft_model(model, lora_config(cfg))
        report_trainable(model, method)
    return model


def report_trainable(model: Any, method: str) -> None:
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        print(f"nbtrain: {method} adapters: {trainable:,} trainable of {total:,} parameters", flush=True)


def trl_class(path: str) -> Any:
    """A TRL class from "module:Class" (nbtrain.contract.objectives); trl.experimental warns on import, which
    would only repeat in every run log what the objective's docs already say."""
    module, name = path.split(":")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return getattr(importlib.import_module(module), name)
