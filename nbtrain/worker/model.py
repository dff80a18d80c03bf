"""Loading the tokenizer and the model as resolved.json says: shared by every recipe (SFT, DPO, ORPO, KTO,
reward, GRPO, RLOO), so ``method: full | lora | qlora`` means the same thing whatever the objective.

The objective's ``task`` (nbtrain.contract.objectives) picks the head: a causal language model, or for
``objective: reward`` a sequence classifier with one output (``AutoModelForSequenceClassification``,
``num_labels=1``: the reward), whose freshly initialised score head LoRA trains and saves beside the
adapter (peft's SEQ_CLS task puts it in ``modules_to_save``).

The SFT recipe wraps the model in its LoRA adapter itself (``load_model(..., attach_lora=True)``); the
preference and RL recipes hand the base model plus ``lora_config()`` to the TRL trainer instead, which
then uses the adapter-disabled base as the reference model (no second copy of the weights in memory).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from nbtrain.contract.adapters import converts_init, peft_fields
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.worker import introspect


def compute_dtype(plan: dict[str, Any]) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan["precision"], torch.float32)


def task(cfg: dict[str, Any]) -> str:
    """peft's task type of the run's objective: ``CAUSAL_LM``, or ``SEQ_CLS`` for a reward model."""
    return OBJECTIVES[str(cfg.get("objective", "sft"))].task


def is_vision(cfg: dict[str, Any]) -> bool:
    """A vision-language model's run (the kernel fills ``vision:`` in when the model's config has a
    vision_config)."""
    return cfg.get("vision") is not None


def load_tokenizer(cfg: dict[str, Any]) -> Any:
    """The trainer's processing class: the tokenizer, or for a vision-language model its processor (image
    processor + tokenizer + chat template), saved with the result as it was loaded."""
    from transformers import AutoProcessor, AutoTokenizer

    kwargs = {"trust_remote_code": cfg["trust_remote_code"], "revision": cfg.get("revision")}
    if is_vision(cfg):
        proc = AutoProcessor.from_pretrained(cfg["model"], **kwargs)
        tok = proc.tokenizer
    else:
        proc = tok = AutoTokenizer.from_pretrained(cfg["model"], **kwargs)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return proc


# A vision-language model's parts by their module names in transformers: the image encoder, and the
# projector that maps its features into the language model (Qwen2-VL keeps its merger inside the encoder).
ENCODER_NAMES = ("visual", "vision_tower", "vision_model")
PROJECTOR_NAMES = ("multi_modal_projector", "merger", "connector", "mm_projector")
_DEFAULT_TARGETS = ("q_proj", "v_proj")  # peft's default for the Llama/Qwen2-style language models


def vision_parts(model: Any) -> tuple[list[str], list[str]]:
    """(encoder, projector) module names of a vision-language model, outermost first."""
    encoder: list[str] = []
    projector: list[str] = []
    for name, _ in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in PROJECTOR_NAMES and not any(name.startswith(f"{p}.") for p in projector):
            projector.append(name)
        elif last in ENCODER_NAMES and not any(name.startswith(f"{e}.") for e in encoder):
            encoder.append(name)
    return encoder, projector


def language_model_targets(model: Any, target: str | list[str]) -> list[str]:
    """The full names of the language model's linear modules LoRA wraps in a vision-language model (so
    the image encoder's q_proj/v_proj are left alone): ``auto`` q_proj and v_proj, ``all-linear`` every
    linear layer but the output head, or the names listed."""
    import torch

    wanted = set(_DEFAULT_TARGETS) if target == "auto" else None if target == "all-linear" else set(target)
    encoder, projector = vision_parts(model)
    outside = tuple(f"{n}." for n in (*encoder, *projector))
    names = [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear)
        and not f"{name}.".startswith(outside)
        and not name.endswith("lm_head")
        and (wanted is None or name.rsplit(".", 1)[-1] in wanted)
    ]
    if not names:
        raise ValueError(f"lora: target_modules {target!r} names no linear layer of the language model")
    return names


def lora_config(cfg: dict[str, Any], model: Any = None) -> Any:
    """The peft LoraConfig of ``lora:``, or None for method: full. For a vision-language ``model`` the
    targets are the language model's, and ``vision: freeze:`` names what trains fully beside them."""
    if cfg["method"] not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    lo = cfg["lora"]
    target = lo["target_modules"]
    targets: Any = None if target == "auto" else target
    extra = peft_fields(
        lo
    )  # peft's own LoraConfig fields written in lora: (use_dora, init_lora_weights, ...)
    modules_to_save = extra.pop("modules_to_save", None)
    if is_vision(cfg) and model is not None:
        targets = language_model_targets(model, target)
        encoder, projector = vision_parts(model)
        freeze = cfg["vision"]["freeze"]
        trained = projector if freeze == "encoder" else [*encoder, *projector] if freeze == "none" else []
        outer = [n for n in trained if not any(n.startswith(f"{o}.") for o in trained)]  # not nested twice
        modules_to_save = [*(modules_to_save or []), *(n.rsplit(".", 1)[-1] for n in outer)] or None
    return LoraConfig(
        r=lo["r"],
        lora_alpha=lo["alpha"],
        lora_dropout=lo["dropout"],
        bias=lo["bias"],
        target_modules=targets,
        modules_to_save=modules_to_save,
        task_type=task(cfg),
        **extra,
    )


def freeze_vision(model: Any, cfg: dict[str, Any]) -> None:
    """A full fine-tune of a vision-language model: what ``vision: freeze:`` names stops training."""
    encoder, projector = vision_parts(model)
    freeze = cfg["vision"]["freeze"]
    if freeze == "none":
        return
    enc, proj = tuple(f"{n}." for n in encoder), tuple(f"{n}." for n in projector)
    for name, param in model.named_parameters():
        in_projector = bool(proj) and name.startswith(proj)  # (Qwen2-VL's merger lies inside its encoder)
        in_encoder = bool(enc) and name.startswith(enc) and not in_projector
        if in_encoder or (in_projector and freeze == "encoder+projector"):
            param.requires_grad_(False)


def quantization_config(cfg: dict[str, Any], plan: dict[str, Any]) -> Any:
    """The bitsandbytes config of ``quantization:`` (4-bit NF4/FP4 with the compute dtype, or 8-bit). A
    vision-language model's image encoder and projector stay unquantised (as the language model's head)."""
    from transformers import BitsAndBytesConfig

    q = cfg["quantization"]
    skip = None
    if is_vision(cfg):  # transformers matches these against the full module name
        skip = ["lm_head", *(rf".*{n}" for n in (*ENCODER_NAMES, *PROJECTOR_NAMES))]
    if q["bits"] == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q["quant_type"],
            bnb_4bit_use_double_quant=q["double_quant"],
            bnb_4bit_compute_dtype=compute_dtype(plan),
            llm_int8_skip_modules=skip,
        )
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)


def load_model(
    cfg: dict[str, Any], plan: dict[str, Any], args: dict[str, Any], *, attach_lora: bool = True
) -> Any:
    """The model for ``method``: fp32 weights (full), a frozen base in the compute dtype (LoRA), or a
    bitsandbytes-quantised base prepared for k-bit training (QLoRA); with ``attach_lora`` and a LoRA
    method, wrapped in a freshly initialised adapter."""
    import torch

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
    # the attention kernel: the run's own (train: model_init_kwargs), else the plan's (flash_attention_2
    # where the facts allow it), else transformers' default
    attn = (args.get("model_init_kwargs") or {}).get("attn_implementation") or plan.get("attn_implementation")
    if attn:
        kwargs["attn_implementation"] = attn
    auto, head = auto_class(cfg)
    # init_from: a full run starts from an earlier run's model (a LoRA run: its adapter, below)
    weights = cfg.get("init_from") if method == "full" and cfg.get("init_from") else cfg["model"]
    model: Any = auto.from_pretrained(weights, **kwargs, **head)
    if method == "full" and is_vision(cfg):
        freeze_vision(model, cfg)
    if method == "qlora":
        from peft import prepare_model_for_kbit_training

        bits = cfg["quantization"]["bits"]
        if not getattr(model, f"is_loaded_in_{bits}bit", False):
            raise RuntimeError(f"bitsandbytes did not quantise {cfg['model']} to {bits}-bit")
        print(f"nbtrain: base weights loaded in {bits}-bit by bitsandbytes", flush=True)

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(
                introspect.value(args, "gradient_checkpointing", str(cfg.get("objective", "sft")))
            ),
        )
    if attach_lora and method in ("lora", "qlora"):
        from peft import get_peft_model
        from transformers import set_seed

        set_seed(
            int(introspect.value(args, "seed", str(cfg.get("objective", "sft"))))
        )  # adapter init is random: seed it for reproducible runs
        model = get_peft_model(model, lora_config(cfg, model))
        if cfg.get("init_from"):
            load_adapter_weights(model, Path(cfg["init_from"]))
        report_trainable(model, method)
    return model


def load_adapter_weights(model: Any, folder: Path) -> None:
    """``init_from:`` for a LoRA run: the adapter weights of an earlier run (a checkpoint or its output) in
    place of the fresh ones; every adapter weight of this run must come from it, and every one of its own
    must be used (else the two adapters differ in shape or target modules: RuntimeError saying so)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result: Any = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    unused = list(result.unexpected_keys)
    if missing or unused:
        example = (missing or unused)[0]
        raise RuntimeError(
            f"the adapter in {folder} does not fit this run's LoRA (other target modules or layers?): "
            f"{len(missing)} of this run's adapter weights are not in it, {len(unused)} of its weights have "
            f"no place here (e.g. {example})"
        )
    print(f"nbtrain: LoRA adapter weights from {folder} (init_from)", flush=True)


def auto_class(cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The transformers Auto class a run's model loads with, and its head's keyword arguments: a vision-
    language model, a reward model (a sequence classifier with one score) or a causal language model."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
    )

    if is_vision(cfg):
        return AutoModelForImageTextToText, {}
    if task(cfg) == "SEQ_CLS":
        return AutoModelForSequenceClassification, {"num_labels": 1}
    return AutoModelForCausalLM, {}


INITIAL_ADAPTER = "adapter-initial"  # in the run directory: a PiSSA/OLoRA adapter before training


def save_initial_adapter(model: Any, cfg: dict[str, Any], run_dir: Path) -> None:
    """For an initialisation that changes the base weights (PiSSA, OLoRA): the adapter as initialised, kept
    in the run directory, so the result can be saved converted to a plain LoRA on the untouched base
    (peft's path_initial_model_for_weight_conversion). Written once (a resume initialises the same)."""
    init = (cfg.get("lora") or {}).get("init_lora_weights")
    if not converts_init(init) or (run_dir / INITIAL_ADAPTER).exists():
        return
    config = model.peft_config["default"]
    config.init_lora_weights = True  # as peft asks: the saved initial adapter is a plain one
    tmp = run_dir / f".{INITIAL_ADAPTER}.partial"
    model.save_pretrained(str(tmp))
    config.init_lora_weights = init
    os.replace(tmp, run_dir / INITIAL_ADAPTER)


def loraplus_optimizer(model: Any, cfg: dict[str, Any], args: Any) -> Any:
    """LoRA+ (peft's optimizer helper): the B matrices learn ``loraplus_lr_ratio`` times faster than A; None
    when the run does not ask for it."""
    ratio = (cfg.get("lora") or {}).get("loraplus_lr_ratio")
    if not ratio or cfg["method"] not in ("lora", "qlora"):
        return None
    import torch
    from peft.optimizers import create_loraplus_optimizer

    b_lr = args.learning_rate * ratio
    print(f"nbtrain: LoRA+: the B matrices learn at {ratio:g}x the learning rate ({b_lr:g})", flush=True)
    return create_loraplus_optimizer(
        model, torch.optim.AdamW, lr=args.learning_rate, loraplus_lr_ratio=float(ratio),
        weight_decay=args.weight_decay,
    )  # fmt: skip


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
