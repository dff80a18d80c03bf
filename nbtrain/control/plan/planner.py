"""Hardware + validated config -> Plan: where and how a run trains, and why.

The plan is recorded, with its reasons, in ``resolved.json`` and shown by ``--dry-run``: device,
processes per node and nodes, the distributed strategy and launcher, precision, and the DeepSpeed
config (its "auto" values resolved) when a ZeRO strategy is chosen.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from nbtrain.contract.objectives import PACKED_MODEL_TYPES
from nbtrain.control import memory
from nbtrain.control.config import trainargs
from nbtrain.control.config.facts import bitsandbytes_problem
from nbtrain.control.config.schema import Resolved, RunConfig
from nbtrain.control.memory import Estimate
from nbtrain.control.plan import length
from nbtrain.control.plan.accelerators import ACCELERATORS, QLORA_WHY, UNVERIFIED, accelerator_precision
from nbtrain.control.plan.estimates import checkpointing_rule, request_for
from nbtrain.control.plan.facts import model_config
from nbtrain.control.plan.fit import MARGIN, Fit, fits
from nbtrain.hardware import Hardware

# An SFT adapter's learning rate when the config gives none: where Unsloth's notebooks and the QLoRA paper's
# small models start (LLaMA-Factory's LoRA examples 1e-4); TRL's 2e-5 is a full fine-tuning default.
LORA_LEARNING_RATE = 2e-4


@dataclass
class Plan:
    device: str  # "cpu" | "cuda" | "mps" (Apple silicon) | "npu" (Ascend)
    num_processes: int  # per node
    launcher: str  # direct (python -m nbtrain.worker) | torchrun | deepspeed | accelerate | notebook
    precision: str  # "fp32" | "fp16" | "bf16"
    strategy: str = "none"  # none | ddp | zero1 | zero2 | zero3 | fsdp
    offload: str = "none"
    nodes: int = 1
    gpus: list[int] = field(default_factory=list)
    deepspeed: dict[str, Any] | None = None  # the DeepSpeed JSON, "auto" values resolved
    method: str = "lora"  # full | lora | qlora, as chosen (method: auto) or given
    micro_batch: int | None = None  # per_device_train_batch_size when the planner chose it
    grad_accum: int | None = None  # gradient_accumulation_steps when the planner chose it
    # gradient_checkpointing when the planner chose it (train: left it out or said auto): on only when
    # the activations without it would not fit
    gradient_checkpointing: bool | None = None
    liger: bool | None = None  # use_liger_kernel when the planner chose it (train: left it out)
    # the attention kernel the model loads with when the planner chose it (flash_attention_2); None:
    # transformers' default (SDPA)
    attn_implementation: str | None = None
    # SFT batches laid end to end where cheaper (worker/data.PaddingFreeWhereCheaper) when the planner chose
    # it (train: left padding_free and packing out)
    padding_free: bool | None = None
    # learning_rate when the planner chose it (an SFT adapter, train: left it out): LORA_LEARNING_RATE
    learning_rate: float | None = None
    # the optimizer steps the run takes (plan/length.py), where known before the start
    steps: int | None = None
    # optim when the planner chose it (a CUDA run, train: left it out): torch's fused AdamW
    optim: str | None = None
    # Estimate.to_dict() of this plan, with the fit rule's capacity_bytes and usable_bytes, and the device
    estimate: dict[str, Any] | None = None
    fits: bool = True  # by nbtrain.control.plan.fit, the one rule the estimate's table uses too
    fit_advice: str = ""  # when it does not fit: the fit rule's reason, then the smallest change that would
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.num_processes * self.nodes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "world_size": self.world_size}


def _strategy(res: Resolved, hw: Hardware, reasons: list[str]) -> tuple[str, int]:
    d = res.config.distributed
    strategy: str = d.strategy
    if strategy == "auto" and res.user_deepspeed is not None:
        stage = res.user_deepspeed.get("zero_optimization", {}).get("stage", 0)
        strategy = f"zero{stage}" if stage else "ddp"
        reasons.append(f"strategy {strategy}: from the DeepSpeed config given")
    n = d.num_processes
    if d.ray is not None:
        n = 1  # a Ray worker is one process; the workers are the run's nodes (plan/target.ray_target)
    elif n == "auto":
        if strategy in ("auto", "none"):
            n = max(1, _devices(hw)) if strategy == "auto" else 1
        else:
            # On CPU several processes over gloo make a real (if slow) distributed run: 2 is enough to
            # exercise every collective without oversubscribing a small machine.
            n = _devices(hw) or 2
    assert isinstance(n, int)
    if strategy == "auto":
        if d.offload != "none":
            strategy = "zero3" if d.offload in ("optimizer+params", "nvme") else "zero2"
            reasons.append(f"strategy {strategy}: offload: {d.offload} needs DeepSpeed ZeRO")
        elif n * d.nodes > 1:
            strategy = "ddp"
            reasons.append(f"strategy ddp: {n * d.nodes} processes, and the model is replicated on each")
        else:
            strategy = "none"
    if strategy != "none" and hw.gpus and n > len(hw.gpus):
        reasons.append(f"{n} processes per node on {len(hw.gpus)} GPU(s): more processes than GPUs")
    return strategy, n


def _devices(hw: Hardware) -> int:
    """The devices one process each can train on: NVIDIA GPUs, else Ascend NPUs or the one MPS GPU."""
    return len(hw.gpus) or (hw.accelerator.count if hw.accelerator is not None else 0)


def _launcher(strategy: str, requested: str, world: int) -> str:
    if requested != "auto":
        return requested
    if world == 1 and strategy == "none":
        return "direct"  # a launcher parent costs ~4 s and ~250 MB for nothing
    # DeepSpeed's ZeRO and FSDP too: their settings travel in the training args (deepspeed.json), whatever
    # starts the ranks, and torchrun's agent on one node forks them warm (deepspeed's own launcher is two
    # more cold processes before the ranks: 11.6 s to a 6-step ZeRO-2 run's end vs 3.5 s forked warm)
    return "torchrun"


def make_plan(res: Resolved, hw: Hardware) -> Plan:
    cfg = res.config
    reasons: list[str] = []
    warnings: list[str] = []
    strategy, n = _strategy(res, hw, reasons)
    d = cfg.distributed
    world = n * d.nodes
    if hw.gpus:
        gpus = [g.index for g in hw.gpus[: max(1, n)]]
        gpu = hw.gpus[0]
        device = "cuda"
        reasons.append(
            f"{n} process(es) per node on GPU {', '.join(map(str, gpus))} ({gpu.name}, "
            f"{gpu.memory_total / 2**30:.0f} GiB, compute {gpu.compute_capability[0]}."
            f"{gpu.compute_capability[1]})"
        )
        if len(hw.gpus) > n:
            reasons.append(f"{len(hw.gpus)} GPUs found; this run uses {n}")
        if world > 1:
            reasons.append(f"NCCL backend: {world} processes, one per GPU")
    elif hw.accelerator is not None:
        device, gpus = hw.accelerator.kind, []
        reasons.append(f"{n} process(es) per node on {hw.accelerator.name}: {UNVERIFIED[device]}")
    else:
        device, gpus = "cpu", []
        why = f" ({hw.nvml_error})" if hw.nvml_error else ""
        backend = ", gloo backend" if world > 1 else ""
        reasons.append(f"{n} process(es) per node on CPU{backend}: no GPU found{why}")
    if d.nodes > 1:
        reasons.append(f"{d.nodes} nodes x {n} processes = world size {world}")

    precision = cfg.precision
    if precision == "auto":  # train.bf16 / train.fp16 from an HF-style config count as a request
        precision = "bf16" if cfg.train.get("bf16") else "fp16" if cfg.train.get("fp16") else "auto"
    if precision == "auto":
        if device == "cpu":
            precision = "fp32"
            reasons.append("precision fp32: the CPU trains in full precision")
        elif hw.accelerator is not None and device == hw.accelerator.kind:
            precision = accelerator_precision(hw.accelerator, reasons)
        elif hw.gpus[0].bf16:
            precision = "bf16"
            reasons.append("precision bf16: the GPU supports it (compute capability >= 8.0)")
        else:
            precision = "fp16"
            reasons.append("precision fp16: the GPU has no native bf16 (compute capability < 8.0)")
    elif device == "cuda" and precision == "bf16" and not hw.gpus[0].bf16:
        warnings.append(
            f"bf16 requested on {hw.gpus[0].name}, which has no native bf16; it will be "
            f"slow or fail. Use precision: fp16 or auto"
        )
    elif device == "cpu" and precision == "fp16":
        warnings.append("fp16 mixed precision is not supported on CPU; use fp32 or bf16")
    elif device == "mps" and precision == "bf16":  # before macOS 14 accelerator_problems refuses it
        warnings.append("bf16 on MPS is emulated in fp32 on M1/M2 chips (slower than fp16 there)")
    offload = d.offload
    plan = Plan(device, n, "direct", precision, strategy, offload, d.nodes, gpus, reasons=reasons,
                warnings=warnings)  # fmt: skip
    plan.method = cfg.method
    _plan_memory(res, hw, plan)
    plan.learning_rate = planned_learning_rate(cfg.objective, plan.method, cfg.train)
    if plan.learning_rate is not None:
        reasons.append(
            f"learning rate {LORA_LEARNING_RATE:g}: where {plan.method} fine-tuning usually starts (TRL's "
            f"default 2e-05 suits full fine-tuning and moves an adapter little); train: learning_rate sets "
            f"your own"
        )
    plan.launcher = "ray" if d.ray is not None else _launcher(plan.strategy, d.launcher, world)
    if plan.strategy == "fsdp":
        reasons.append(
            "strategy fsdp: FSDP2 (fully_shard) per decoder layer, weights read on rank 0 and sharded, "
            "sharded checkpoints" + (" (on CPU nbtrain turns it on: accelerate would run DDP)"
                                     if device == "cpu" else "")
        )  # fmt: skip
    if d.ray is not None:
        backend = "NCCL" if device == "cuda" else "gloo"
        reasons.append(
            f"launcher ray: a Ray job whose {world} worker(s) Ray Train starts (TorchTrainer, {backend})"
        )
    elif plan.launcher == "torchrun" and plan.nodes == 1:
        reasons.append("launcher torchrun's agent, its ranks forked from one process that imported the "
                       "training stack (the warm process, when it can serve the run)")  # fmt: skip
    elif plan.strategy != "none":
        reasons.append(f"launcher {plan.launcher} (starts cold: the warm process forks one-node runs)")
    elif cfg.method == "qlora":
        # peft defines its 4/8-bit LoRA layers only if bitsandbytes imported with it, and importing
        # bitsandbytes initialises CUDA (its device query), after which a process cannot fork
        reasons.append("starts cold: QLoRA needs bitsandbytes, which the warm process cannot hold")
    args = train_args(res, plan)
    plan.steps = length.planned_steps(res, args, plan.world_size)
    lr = trainargs.value(args, "learning_rate", cfg.objective)
    if under := length.undertrain_warning(cfg.objective, plan.method, lr, plan.steps):
        warnings.append(under)
    return plan


def planned_learning_rate(objective: str, method: str, train: Mapping[str, Any]) -> float | None:
    """The learning rate the plan sets: LORA_LEARNING_RATE for an SFT adapter (method auto chooses one)
    whose train: gives none; None where TRL's default (or the user's) stands."""
    adapter = method in ("lora", "qlora", "auto")
    return LORA_LEARNING_RATE if objective == "sft" and adapter and "learning_rate" not in train else None


# ------------------------------------------------------------------------------- memory planning


def estimate_for(config: RunConfig, plan: Plan, model_config: Mapping[str, Any], **over: Any) -> Estimate:
    """The estimate of ``config`` as ``plan`` runs it (what resolved.json records and ``--dry-run``
    shows); ``over`` replaces some of it (method, strategy, offload, micro_batch, ...) to try a change."""
    req = request_for(
        config, plan.precision, model_config, micro_batch=over.pop("micro_batch", plan.micro_batch)
    )
    over.setdefault("liger", bool(plan.liger) or req.liger)
    if "gradient_checkpointing" not in over:  # the plan's choice; on while it is still to be made
        over["gradient_checkpointing"] = (
            plan.gradient_checkpointing if plan.gradient_checkpointing is not None
            else req.gradient_checkpointing is not False
        )  # fmt: skip
    kwargs = {**req.estimate_kwargs(), **{k: v for k, v in over.items() if k in req.estimate_kwargs()}}
    return memory.estimate(
        model_config, method=over.get("method", plan.method), strategy=over.get("strategy", plan.strategy),
        offload=over.get("offload", plan.offload), world_size=plan.world_size, nodes=plan.nodes,
        device=plan.device, **kwargs,
    )  # fmt: skip


def sharding_ladder() -> tuple[list[tuple[str, str]], str]:
    """What ``strategy: auto`` tries for a full fine-tune on several GPUs, cheapest first, and why.

    ZeRO (DeepSpeed) first: the same sharding as FSDP's, plus optimizer and parameter offload when even
    ZeRO-3 does not fit. Without DeepSpeed installed, FSDP2 (PyTorch's own) shards instead."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return [("ddp", "none"), ("fsdp", "none")], "; FSDP2: DeepSpeed is not installed"
    return [("ddp", "none"), ("zero2", "none"), ("zero3", "none"), ("zero3", "optimizer"),
            ("zero3", "optimizer+params")], ""  # fmt: skip


def _choose_adapter_method(res: Resolved, hw: Hardware, plan: Plan, mc: Mapping[str, Any]) -> None:
    """method: auto on NVIDIA GPUs, the first that fits as configured (its micro-batch; checkpointing where
    nbtrain may turn it on): LoRA on one GPU's 16-bit weights; on several GPUs LoRA with the weights sharded
    by ZeRO-3; QLoRA's 4-bit copy on each GPU; on several GPUs LoRA sharded with offload; else QLoRA (which
    the fit rule then refuses with the smallest change). LoRA on the 16-bit base is the better of the two
    wherever it fits: no dequantising (QLoRA ran at 0.76x LoRA's tokens/s on an H200, bench/results/gpu.md)
    and no 4-bit rounding of the base. The peers do the same (docs/plans.md): torchtune runs Llama 3.1 8B's
    LoRA on one 24 GB card (16.2 GiB measured, tests/fixtures/published_peaks.json) and 70B's sharded over 8
    GPUs; Unsloth and LLaMA-Factory reach for QLoRA on cards where LoRA does not fit."""
    reasons = plan.reasons
    cap = min(g.memory_total for g in hw.gpus)
    weights16 = 2 * memory.count_parameters(mc).total
    lora = fits(estimate_for(res.config, plan, mc, method="lora"), hw)
    if lora.ok:
        plan.method = "lora"
        reasons.append(
            f"method lora: LoRA on the 16-bit weights ({_gib(weights16)}) fits one GPU as configured "
            f"({lora.why})"
        )
        return
    sharded = _sharded_lora(res, hw, plan, mc, offload=False)
    if sharded is None:
        qlora = fits(estimate_for(res.config, plan, mc, method="qlora"), hw)
        if not qlora.ok:
            sharded = _sharded_lora(res, hw, plan, mc, offload=True)
    if sharded is not None:
        plan.method = "lora"
        reasons.append(sharded)
        return
    why = bitsandbytes_problem(tuple(sys.path))
    if why is None:
        plan.method = "qlora"
        reasons.append(
            f"method qlora: LoRA on the 16-bit weights ({_gib(weights16)}) would not fit one GPU "
            f"({_gib(cap)}: {lora.why}); 4-bit weights leave room to train"
        )
    else:
        plan.method = "lora"
        plan.warnings.append(f"QLoRA would suit this card, but {why}")


def _sharded_lora(
    res: Resolved, hw: Hardware, plan: Plan, mc: Mapping[str, Any], *, offload: bool
) -> str | None:
    """On several GPUs with strategy: auto, the reason for LoRA with its 16-bit weights sharded by ZeRO-3
    (``offload``: the first rung of the ladder with offload that fits), or None when none fits. QLoRA
    cannot be sharded here (4-bit weights: ``estimate``'s combination rule)."""
    if plan.world_size < 2 or res.config.distributed.strategy != "auto" or plan.device != "cuda":
        return None
    ladder, _ = sharding_ladder()
    for strategy, off in ladder[1:]:
        if strategy == "ddp" or (off != "none") is not offload:
            continue
        if fits(estimate_for(res.config, plan, mc, method="lora", strategy=strategy, offload=off), hw).ok:
            how = f"{strategy}{' + offload ' + off if off != 'none' else ''}"
            return (
                f"method lora: the 16-bit weights do not fit one GPU, and {how} shards them over "
                f"{plan.world_size} GPUs"
                + (" (QLoRA's 4-bit copy on each would not fit either)" if offload else "")
            )
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _plan_memory(res: Resolved, hw: Hardware, plan: Plan) -> None:
    """Choose what the config left to "auto" from the memory estimate, and record whether it fits.

    method: auto -> QLoRA when the 16-bit weights alone take over half of one GPU (one small card),
    else LoRA; strategy: auto on several GPUs for a full fine-tune -> the first of DDP, ZeRO-2, ZeRO-3,
    ZeRO-3 + optimizer offload, + parameter offload that fits; per_device_train_batch_size: auto -> the
    largest power of two that fits, with gradient accumulation keeping ``batch_size`` (the effective
    batch) when it is given.
    """
    cfg, reasons = res.config, plan.reasons
    mc = model_config(res)
    if cfg.method == "auto":
        if mc is None:
            plan.method = "lora"
            reasons.append("method lora: no config.json on this machine to estimate from")
        elif plan.device == "cpu":
            plan.method = "lora"
            reasons.append("method lora: on CPU, bitsandbytes' 4-bit kernels are slow and memory is RAM")
        elif plan.device in ACCELERATORS:
            plan.method = "lora"
            reasons.append(f"method lora: QLoRA is not offered on {plan.device} ({QLORA_WHY[plan.device]})")
        else:
            _choose_adapter_method(res, hw, plan, mc)
    _plan_kernels(cfg, hw, plan, mc)  # before the memory choices: Liger's kernels keep less
    if mc is None:
        if cfg.train.get("per_device_train_batch_size") == "auto":
            plan.micro_batch = 1
            reasons.append("per_device_train_batch_size 1: no config.json to estimate from")
        return
    d = cfg.distributed
    try:
        if (
            d.strategy == "auto" and d.offload == "none" and plan.device == "cuda" and plan.world_size > 1
            and plan.method != "qlora"
        ):  # fmt: skip
            ladder, why_ladder = sharding_ladder()
            for strategy, offload in ladder:
                tried = fits(estimate_for(cfg, plan, mc, strategy=strategy, offload=offload), hw)
                if tried.ok:
                    if (strategy, offload) != (plan.strategy, plan.offload):
                        extra = f" + offload {offload}" if offload != "none" else ""
                        fit_why = f"the first that fits ({tried.why}){why_ladder}"
                        reasons.append(f"strategy {strategy}{extra}: {fit_why}")
                    plan.strategy, plan.offload = strategy, offload
                    break
        if cfg.train.get("per_device_train_batch_size") == "auto":
            plan.micro_batch = 1
            if cfg.batch_size:
                # Never more per device than the effective batch asks for: the divisors of each rank's
                # share, so gradient accumulation makes up exactly the batch that was asked.
                share = -(-cfg.batch_size // plan.world_size)
                sizes = [m for m in range(min(share, 64), 0, -1) if share % m == 0]
                kind = f"the largest divisor of {share} (batch_size per process)"
            else:
                sizes, kind = [64, 32, 16, 8, 4, 2, 1], "the largest power of two"
            for micro in sizes:
                if fits(estimate_for(cfg, plan, mc, micro_batch=micro), hw).ok:
                    plan.micro_batch = micro
                    break
            reasons.append(f"per_device_train_batch_size {plan.micro_batch}: {kind} that "
                           f"fits with {MARGIN:.0%} to spare")  # fmt: skip
            if cfg.batch_size:
                plan.grad_accum = max(1, -(-cfg.batch_size // (plan.micro_batch * plan.world_size)))
                reasons.append(
                    f"gradient_accumulation_steps {plan.grad_accum}: keeps the effective batch at "
                    f"{plan.micro_batch * plan.world_size * plan.grad_accum} (asked {cfg.batch_size})"
                )
        _plan_checkpointing(cfg, plan, mc, hw)
        est = estimate_for(cfg, plan, mc)
    except memory.EstimateError as e:
        plan.warnings.append(f"no memory estimate: {e}")
        return
    fit = fits(est, hw)
    plan.estimate = {**est.to_dict(), "capacity_bytes": fit.capacity, "usable_bytes": fit.usable,
                     "device": plan.device}  # fmt: skip
    plan.fits = fit.ok
    if not plan.fits:
        plan.fit_advice = _smallest_change(res, plan, hw, mc, fit)


# Where nbtrain turns Liger's kernels on by itself (use_liger_kernel: TRL applies its RMSNorm, SwiGLU and
# rotary kernels; SFT keeps TRL's fused LM head): the text decoders Liger patches. Measured on an H200
# (bench/results/gpu.md): a 1B Llama's SFT at 64 x 1024 tokens with gradient checkpointing, LoRA 1.42x
# the tokens/s with 18% less peak memory, QLoRA 1.26x with 10% less.
LIGER_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite")


def _plan_kernels(cfg: RunConfig, hw: Hardware, plan: Plan, mc: Mapping[str, Any] | None) -> None:
    """The GPU fast paths, each from facts and with its reason: the attention kernel, Liger's, the fused
    optimizer and torch.compile (never on a CPU, an Apple or an Ascend device)."""
    _plan_attention(cfg, hw, plan)
    _plan_liger(cfg, hw, plan, mc)
    _plan_padding_free(cfg, plan, mc)
    _plan_optimizer(cfg, plan)
    _plan_compile(cfg, plan)


FLASH_ATTENTION_CC = (8, 0)  # flash-attention 2 runs on Ampere and newer
FLASH_ATTENTION_3_CC = (9, 0)  # flash-attention 3 is written for Hopper (sm90) alone


def _plan_attention(cfg: RunConfig, hw: Hardware, plan: Plan) -> None:
    """flash_attention_3 where flash-attn-3 is installed and every GPU this run uses is a Hopper;
    flash_attention_2 where flash-attn is installed and every GPU is Ampere or newer; both only in 16 bits.
    Otherwise transformers' default, PyTorch's SDPA (its own flash kernel where the card has one). A run
    that names one (train: model_init_kwargs: attn_implementation) keeps it."""
    asked = (cfg.train.get("model_init_kwargs") or {}).get("attn_implementation")
    have = [k for k in ("flash_attn_interface", "flash_attn") if k in hw.kernels]
    if plan.device != "cuda" or asked is not None or not have:
        return
    gpus = [g for g in hw.gpus if g.index in plan.gpus] or hw.gpus
    keep = " (train: model_init_kwargs: {attn_implementation: sdpa} to use PyTorch's instead)"
    if plan.precision not in ("bf16", "fp16"):
        plan.reasons.append(f"attention sdpa: flash-attention runs in bf16 or fp16, not {plan.precision}")
        return
    hopper = [g.compute_capability[0] == FLASH_ATTENTION_3_CC[0] for g in gpus]
    if "flash_attn_interface" in have and all(hopper):
        plan.attn_implementation = "flash_attention_3"
        plan.reasons.append(
            "attention flash_attention_3: flash-attn-3 is installed and the GPU is a Hopper (compute "
            "capability 9.0)" + keep
        )
        return
    old = [g for g in gpus if g.compute_capability < FLASH_ATTENTION_CC]
    if "flash_attn" not in have or old:
        fa2 = "flash_attn" in have
        g = old[0] if fa2 else gpus[hopper.index(False)]
        cc = ".".join(map(str, g.compute_capability))
        what = "flash-attention 2 needs compute capability 8.0 or newer" if fa2 else (
            "flash-attn-3 runs on Hopper (compute capability 9.0) alone"
        )  # fmt: skip
        plan.reasons.append(f"attention sdpa: {' and '.join(have)} installed, but {what} ({g.name}: {cc})")
        return
    plan.attn_implementation = "flash_attention_2"
    plan.reasons.append(
        "attention flash_attention_2: flash-attn is installed and the GPU has compute capability >= 8.0"
        + keep
    )


FUSED_ADAMW = "adamw_torch_fused"


def _plan_optimizer(cfg: RunConfig, plan: Plan) -> None:
    """optim left out, on a CUDA GPU: torch's fused AdamW (one kernel updates every tensor; transformers'
    own default, written into the run so the plan and the estimate say it). Kept for QLoRA too, where the
    QLoRA paper and Unsloth use 8-bit paged AdamW: an adapter's fp32 states are a few hundred MiB at most
    (the estimate counts them), and the fused kernel is the faster one."""
    if plan.device != "cuda" or "optim" in cfg.train:
        return
    plan.optim = FUSED_ADAMW
    plan.reasons.append(
        f"optim {FUSED_ADAMW}: torch's fused AdamW, one kernel per step for every tensor (train: optim "
        f"sets another, e.g. paged_adamw_8bit to save the optimizer's memory)"
    )


def _plan_compile(cfg: RunConfig, plan: Plan) -> None:
    """torch_compile left out, on a CUDA GPU: off, and said. Compiling costs minutes before the first
    step and recompiles whenever a batch's length changes (SFT's batches are padded to their longest row);
    its gain on top of Liger's and flash-attention's kernels has not been measured here (bench/gpu.py's
    "nbtrain compile" row measures it), so nbtrain does not turn it on by itself."""
    if plan.device != "cuda" or "torch_compile" in cfg.train:
        return
    plan.reasons.append(
        "torch_compile off: compiling costs minutes before the first step and again whenever a batch's "
        "length changes (train: torch_compile: true for long runs of fixed-length batches, e.g. packing)"
    )


def _plan_liger(cfg: RunConfig, hw: Hardware, plan: Plan, mc: Mapping[str, Any] | None) -> None:
    """use_liger_kernel left out: on where every fact says it runs and pays (LIGER_MODEL_TYPES), with the
    reason; never on a CPU, an Apple or Ascend device, or without liger-kernel installed."""
    if "use_liger_kernel" in cfg.train or plan.device != "cuda" or cfg.objective != "sft":
        return
    model_type = str((mc or {}).get("model_type", ""))
    if model_type not in LIGER_MODEL_TYPES or cfg.vision is not None:
        return
    if "liger_kernel" not in hw.kernels:
        plan.reasons.append("Liger kernels off: liger-kernel is not installed (pip install liger-kernel)")
        return
    plan.liger = True
    plan.reasons.append(
        f"Liger kernels on (use_liger_kernel): installed, a CUDA GPU and a {model_type} decoder "
        f"(fused RMSNorm, SwiGLU and rotary; set use_liger_kernel: false to turn them off)"
    )


def _plan_padding_free(cfg: RunConfig, plan: Plan, mc: Mapping[str, Any] | None) -> None:
    """padding_free and packing left out, SFT on a text decoder whose attention keeps rows laid end to end
    apart (PACKED_MODEL_TYPES): each batch's rows are laid end to end where that costs less than padding
    them (contract/objectives.padding_free_bins). Measured (SmolLM2-135M LoRA, 8 rows of 20-90 tokens, 2
    CPU cores): 1.34x the steps/s in one sequence, the same loss (bench_real: 1.45x bare TRL's)."""
    train = cfg.train
    if cfg.objective != "sft" or cfg.vision is not None or "padding_free" in train or train.get("packing"):
        return
    model_type = str((mc or {}).get("model_type", ""))
    if model_type not in PACKED_MODEL_TYPES:
        return
    plan.padding_free = True
    how = "flash-attention scores each row's own tokens" if plan.attn_implementation else (
        "in as many sequences as cost least (attention pairs against padding), or padded where cheaper"
    )  # fmt: skip
    plan.reasons.append(
        f"padding-free batches: each batch's rows laid end to end, no padding multiplied, {how} (a "
        f"{model_type} decoder keeps the rows apart by their positions; train: padding_free: false pads "
        f"every batch)"
    )


def _plan_checkpointing(cfg: RunConfig, plan: Plan, mc: Mapping[str, Any], hw: Hardware) -> None:
    """gradient_checkpointing left out (or auto): nbtrain's rule (``estimates.checkpointing_rule``: off when
    the run fits without it), after the micro-batch (when auto) was chosen with it counted on."""
    if cfg.train.get("gradient_checkpointing", "auto") != "auto":
        return
    est, off = checkpointing_rule(lambda on: estimate_for(cfg, plan, mc, gradient_checkpointing=on), hw)
    plan.gradient_checkpointing = bool(est.inputs["gradient_checkpointing"])
    if off.ok:
        plan.reasons.append(
            "gradient_checkpointing off: the activations fit without it, and recomputing them would cost "
            "about a third more compute a step (set it true to trade that for memory)"
        )
    else:
        plan.reasons.append(f"gradient_checkpointing on: without it the run would not fit ({off.why})")


def _smallest_change(res: Resolved, plan: Plan, hw: Hardware, mc: dict[str, Any], fit: Fit) -> str:
    """The fit rule's reason, then the smallest change to the config that would fit (cheapest first)."""
    micro = plan.micro_batch or int(
        trainargs.value(res.config.train, "per_device_train_batch_size", res.config.objective)
    )
    changes: list[tuple[str, dict[str, Any]]] = []
    if not trainargs.value(res.config.train, "gradient_checkpointing", res.config.objective):
        changes.append(("gradient_checkpointing: true", {"gradient_checkpointing": True}))
    if plan.world_size > 1 and plan.method == "full" and plan.device not in ACCELERATORS:  # no ZeRO there
        for strategy, offload in (("zero2", "none"), ("zero3", "none"), ("zero3", "optimizer"),
                                  ("zero3", "optimizer+params")):  # fmt: skip
            changes.append((f"distributed: {{strategy: {strategy}, offload: {offload}}}",
                            {"strategy": strategy, "offload": offload}))  # fmt: skip
    if plan.method == "full":
        changes.append(("method: lora", {"method": "lora"}))
    if plan.method in ("full", "lora") and plan.device == "cuda" and plan.strategy != "zero3":
        changes.append(("method: qlora", {"method": "qlora"}))
    smaller = (
        f"per_device_train_batch_size: 1 (gradient_accumulation_steps: {micro} keeps the effective batch)"
    )
    tries: list[tuple[str, dict[str, Any]]] = []
    if changes and "gradient_checkpointing" in changes[0][1]:  # a third more compute: cheaper than batch 1
        tries.append(changes.pop(0))
    if micro > 1:
        tries.append((smaller, {"micro_batch": 1}))
    for label, over in changes:
        tries.append((label, over))
        if micro > 1:
            tries.append((f"{label} with {smaller}", {**over, "micro_batch": 1}))
    for label, over in tries:
        try:
            alt = estimate_for(res.config, plan, mc, **over)
        except ValueError:
            continue
        if fits(alt, hw).ok:
            about = f"about {_gib(alt.per_device_bytes)} {fit.where}"
            return f"{fit.why}. Smallest change that fits: {label} ({about})"
    return f"{fit.why}, and no single change fits: use a smaller model or more/larger GPUs"


def fsdp_settings(plan: Plan) -> dict[str, Any]:
    """The FSDP settings of a ``strategy: fsdp`` plan, as transformers' ``fsdp_config`` takes them (the
    training args carry them, so they hold whatever launcher starts the ranks; ``accelerate.yaml`` says
    the same). FSDP2 (``fully_shard``) wraps each decoder layer (the model's ``_no_split_modules``), the
    weights load on rank 0 only and reach the others as shards (CPU-RAM-efficient loading), checkpoints
    are sharded (each rank writes its own part: resumable, never gathered), the final model is gathered
    once into output/. Mixed precision follows the plan's precision (bf16/fp16 where the device has it)."""
    return {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": True,
    }


def train_args(res: Resolved, plan: Plan) -> dict[str, Any]:
    """The TRL config (SFTConfig, DPOConfig, ...) keyword arguments the worker will use, minus the
    run-dir paths.

    The user's ``train:`` keys win; nbtrain only fills what a notebook user would otherwise have to
    know (frequent logging for the live view, token counting for tokens/s, evaluation when there is
    eval data, the device and precision from the plan, gloo on CPU for several processes).
    """
    user = {k: v for k, v in res.config.train.items() if k not in ("bf16", "fp16")}
    args: dict[str, Any] = {
        "logging_steps": 1,
        "report_to": "none",
        "include_num_input_tokens_seen": "non_padding",
        "save_strategy": "steps",
        "save_steps": 500,
        "disable_tqdm": True,
    }
    if res.config.objective in ("orpo", "grpo", "rloo"):
        # Their batches hold no input_ids for the Trainer to count (it would warn every step); GRPO and
        # RLOO count prompt + completion tokens themselves (num_tokens, which the run-dir callback uses).
        args["include_num_input_tokens_seen"] = "no"
    has_eval = res.config.data.eval is not None or res.config.data.eval_split is not None
    if has_eval:
        args["eval_strategy"] = "steps"
        args["eval_steps"] = 0.2  # a fraction of the total steps: five evaluations a run
    if plan.device == "cpu":
        args["use_cpu"] = True
        args["dataloader_pin_memory"] = False
    elif plan.device == "mps":
        args["dataloader_pin_memory"] = False  # the GPU shares the RAM: nothing to pin for (torch warns)
    if plan.world_size > 1:
        if plan.device == "cpu":
            args["ddp_backend"] = "gloo"
        elif plan.device == "cuda":
            args["ddp_backend"] = "nccl"  # torch's choice on CUDA too: written so the plan shows it
        if res.config.method != "full":
            # Frozen base weights would otherwise make DDP search for unused parameters every step.
            args["ddp_find_unused_parameters"] = False
    args["bf16"] = plan.precision == "bf16"
    args["fp16"] = plan.precision == "fp16"
    if plan.strategy == "fsdp":
        args["fsdp"] = "full_shard"
        args["fsdp_config"] = fsdp_settings(plan)
    if plan.learning_rate is not None:
        args["learning_rate"] = plan.learning_rate
    args.update(user)
    if plan.micro_batch is not None:
        args["per_device_train_batch_size"] = plan.micro_batch
    if plan.grad_accum is not None:
        args["gradient_accumulation_steps"] = plan.grad_accum
    if plan.gradient_checkpointing is not None:
        args["gradient_checkpointing"] = plan.gradient_checkpointing
    elif args.get("gradient_checkpointing") == "auto":  # no estimate to decide from: the safe side
        args["gradient_checkpointing"] = True
    if plan.liger:
        args["use_liger_kernel"] = True
    if plan.optim is not None:
        args["optim"] = plan.optim
    return args
