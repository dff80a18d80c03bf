"""The memory estimator applied to configs and machines: a config's training shape, and the comparison
of every method x strategy on this hardware that ``nbtrain.estimate`` shows.

The estimator (nbtrain.control.memory) knows nothing of configs or hardware; this module translates a
validated config into its arguments, and judges each row with the one fit rule (``fit.fits``) that the
planner, and so ``start``, use too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nbtrain.control.config import trainargs
from nbtrain.control.config.choices import METHODS
from nbtrain.control.config.schema import RunConfig
from nbtrain.control.memory import Estimate, Request, advice, estimate
from nbtrain.control.plan.fit import Fit, fits
from nbtrain.hardware import Hardware


def request_for(
    config: RunConfig,
    precision: str = "bf16",
    model_config: Mapping[str, Any] | None = None,
    *,
    micro_batch: int | None = None,
) -> Request:
    """The training shape a validated config asks for. ``precision`` is the plan's (the config may say
    auto); ``micro_batch`` the plan's when it chose one (per_device_train_batch_size: auto)."""
    train = config.train
    # TRL's default (GRPO's rows have none: SFT's); a vision run's is none (prepare: no cut inside a row's
    # image tokens)
    fields = trainargs.fields_for(config.objective)
    text_default = trainargs.default(config.objective if "max_length" in fields else "sft", "max_length")
    seq = train.get("max_length", text_default if config.vision is None else None)
    if seq is None:  # TRL: no truncation; the model's context length is the worst case
        text = (model_config or {}).get("text_config") or model_config or {}
        seq = int(text.get("max_position_embeddings", 1024))
        v = config.vision
        if v is not None and v.images_per_row and v.image_tokens:  # a vision run: its image tokens too
            seq += v.images_per_row * v.image_tokens
    if micro_batch is None:
        asked = trainargs.value(train, "per_device_train_batch_size", config.objective)
        micro_batch = int(asked) if asked != "auto" else 1
    targets = config.lora.target_modules if config.lora else "auto"
    return Request(
        precision=precision,
        micro_batch=micro_batch,
        seq_len=int(seq),
        gradient_checkpointing=_checkpointing(train.get("gradient_checkpointing", "auto")),
        optim=str(trainargs.value(train, "optim", config.objective)),
        lora_r=config.lora.r if config.lora else 8,
        lora_dora=bool(config.lora and (config.lora.model_extra or {}).get("use_dora")),
        lora_targets=targets if isinstance(targets, str) else tuple(targets),
        quant_bits=config.quantization.bits if config.quantization else 4,
        double_quant=config.quantization.double_quant if config.quantization else True,
        objective=config.objective,
        liger=train.get("use_liger_kernel") is True,
        nodes=config.distributed.nodes,
    )


def _checkpointing(asked: Any) -> bool | None:
    return None if asked == "auto" else bool(asked)  # None: nbtrain's rule (checkpointing_rule)


def checkpointing_rule(estimate_at: Callable[[bool], Estimate], hardware: Hardware) -> tuple[Estimate, Fit]:
    """gradient_checkpointing left to nbtrain (left out, or auto): off when the run fits without it, else
    on. Returns the estimate of the run so chosen (``inputs["gradient_checkpointing"]`` says which) and the
    fit rule's verdict on the run without it. The planner and the comparison table both decide here.

    Checkpointing keeps only each layer's input and recomputes the rest in the backward pass: about a
    third more compute a step for far less activation memory, worth it only when memory is short
    (SmolLM2-135M LoRA, 8 x 52 tokens, 2 CPU cores: ~1.2-1.4x the step time with it)."""
    off = estimate_at(False)
    fit_off = fits(off, hardware)
    return (off if fit_off.ok else estimate_at(True)), fit_off


def _strategies(gpus: int) -> list[tuple[str, str, int]]:
    """(strategy, offload, processes per node) worth comparing on a node with ``gpus`` GPUs."""
    if gpus == 0:
        return [("none", "none", 1)]
    rows = [("none", "none", 1)]
    if gpus > 1:
        rows.append(("ddp", "none", gpus))
    rows += [
        ("zero2", "none", gpus),
        ("zero2", "optimizer", gpus),
        ("zero3", "none", gpus),
        ("zero3", "optimizer", gpus),
        ("zero3", "optimizer+params", gpus),
    ]
    return rows


def compare_table(
    model_config: Mapping[str, Any], hardware: Hardware, request: Request | None = None
) -> list[dict[str, Any]]:
    """Every method (full/lora/qlora) x strategy the machine's GPU count allows, and whether each fits.

    Each row is judged by ``fit.fits``, the rule the planner applies before ``start``: ``reason`` is its
    sentence, ``why`` adds, for a row that does not fit, the largest part and the setting that shrinks it.
    Without a GPU the only rows are single-process CPU runs, measured against RAM (in fp32, as the planner
    trains on CPU, unless ``request`` names a precision). qlora x zero3 is left out (nbtrain rejects it).
    On an Apple MPS GPU or Ascend NPUs: full and LoRA, one process (and DDP over several NPUs).
    """
    req = request or Request()
    gpus = len(hardware.gpus)
    # An Apple MPS GPU or Ascend NPUs (no NVIDIA GPU): single process or DDP, no QLoRA, no ZeRO (the
    # planner refuses them there: plan/accelerators.py); the MPS GPU is measured against the RAM it shares.
    acc = hardware.accelerator if not gpus else None
    device = "cuda" if gpus else acc.kind if acc else "cpu"
    kind = hardware.gpus[0].name if gpus else acc.name if acc else "CPU RAM"
    # precision on CPU and MPS as the planner picks it unless ``request`` names one; Ascend: bf16
    precision = req.precision if gpus or request is not None or device == "npu" else "fp32"
    ladder = _strategies(gpus) if acc is None else [("none", "none", 1)]
    if acc is not None and acc.count > 1:
        ladder.append(("ddp", "none", acc.count))
    rows: list[dict[str, Any]] = []
    for method in METHODS:
        for strategy, offload, per_node in ladder:
            if method == "qlora" and (strategy == "zero3" or acc is not None):
                continue
            nodes = req.nodes if strategy != "none" else 1
            kwargs = {**req.estimate_kwargs(), "precision": precision}

            def estimate_at(checkpointing: bool) -> Estimate:
                return estimate(
                    model_config, method=method, strategy=strategy, offload=offload,  # noqa: B023
                    world_size=per_node * nodes, nodes=nodes, device=device,  # noqa: B023
                    **{**kwargs, "gradient_checkpointing": checkpointing},  # noqa: B023
                )  # fmt: skip

            if req.gradient_checkpointing is None:
                est = checkpointing_rule(estimate_at, hardware)[0]
            else:
                est = estimate_at(req.gradient_checkpointing)
            fit = fits(est, hardware)
            rows.append(
                {
                    "method": method,
                    "strategy": strategy,
                    "offload": offload,
                    "world_size": per_node * nodes,
                    "device": kind,
                    "per_device_bytes": est.per_device_bytes,
                    "capacity_bytes": fit.capacity,
                    "usable_bytes": fit.usable,
                    "cpu_bytes": est.cpu_bytes,
                    "fits": fit.ok,
                    "reason": fit.why,
                    "why": fit.why if fit.ok or fit.need <= fit.usable else f"{fit.why}; {advice(est)}",
                }
            )
    return rows


__all__ = ["checkpointing_rule", "compare_table", "request_for"]
