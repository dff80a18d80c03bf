"""method: and its lora: / quantization: sections."""

from __future__ import annotations

from typing import Any

from nbtrain.contract.adapters import converts_init
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import trainargs
from nbtrain.control.config.problems import Problems, elsewhere_message, home_of
from nbtrain.control.config.schema.run import RunConfig


def method_sections(cfg: RunConfig, probs: Problems) -> None:
    has_eval = cfg.data.eval is not None or cfg.data.eval_split is not None
    # (a value that is not a strategy, eval_strategy: step, has its own problem and only that one; an
    # objective TRL lacks, ppo, has its own too, and every objective shares TrainingArguments' default here)
    objective = cfg.objective if cfg.objective in OBJECTIVES else "sft"
    if trainargs.value(cfg.train, "eval_strategy", objective) in ("steps", "epoch") and not has_eval:
        probs.add(
            ("train", "eval_strategy"),
            "evaluation needs eval data: add data: eval_split: 0.1 or data: eval: PATH",
        )
    if cfg.method == "full" and cfg.lora is not None:
        probs.add(
            ("lora",),
            "method: full trains every weight and takes no lora: section; remove it, or use method: lora",
        )
    if cfg.method not in ("qlora", "auto") and cfg.quantization is not None:
        probs.add(("quantization",), f"quantization: applies to method: qlora only (method is {cfg.method})")
    if cfg.lora is not None:
        lora_fields(cfg, dict(cfg.lora.model_extra or {}), probs)


def lora_fields(cfg: RunConfig, extra: dict[str, Any], probs: Problems) -> None:
    """lora:'s peft fields and LoRA+: known to peft, of the right type, and usable in this run."""
    for key, value in extra.items():
        msg = trainargs.check_lora_key(key)
        home = home_of(key, ("lora",), cfg.objective) if msg and msg.startswith("unknown") else None
        if home is not None:  # learning_rate in lora: belongs under train:
            msg = elsewhere_message(key, ("lora",), home)
        msg = msg or trainargs.check_lora_value(key, value)
        if msg:
            probs.add(("lora", key), msg)
    init = extra.get("init_lora_weights")
    if converts_init(init):
        single = cfg.distributed.strategy in ("auto", "none") and cfg.distributed.num_processes in ("auto", 1)
        why = (
            "reads the full-precision base weights (use method: lora)" if cfg.method == "qlora"
            else f"is supported for objective: sft (this run is {cfg.objective})" if cfg.objective != "sft"
            else "is supported on one process (its result is converted to a plain LoRA as it is saved)"
            if not single or cfg.distributed.nodes > 1 else None
        )  # fmt: skip
        if why:
            probs.add(("lora", "init_lora_weights"), f"init_lora_weights: {init} {why}")
    if "loraplus_lr_ratio" in extra and cfg.objective != "sft":
        probs.add(("lora", "loraplus_lr_ratio"), (
            f"loraplus_lr_ratio is supported for objective: sft (the {cfg.objective} trainer attaches the "
            f"adapter itself, after the optimizer would have to know its matrices)"
        ))  # fmt: skip
