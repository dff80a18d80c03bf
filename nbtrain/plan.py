"""Hardware + validated config -> Plan: where and how a run trains, and why.

The plan is recorded, with its reasons, in ``resolved.json`` and shown by ``--dry-run``: device,
processes per node and nodes, the distributed strategy and launcher, precision, and the DeepSpeed
config (its "auto" values resolved) when a ZeRO strategy is chosen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nbtrain.config import Resolved
from nbtrain.hardware import Hardware


@dataclass
class Plan:
    device: str  # "cpu" | "cuda"
    num_processes: int  # per node
    launcher: str  # direct (python -m nbtrain.worker) | torchrun | deepspeed | accelerate | notebook
    precision: str  # "fp32" | "fp16" | "bf16"
    strategy: str = "none"  # none | ddp | zero1 | zero2 | zero3 | fsdp
    offload: str = "none"
    nodes: int = 1
    gpus: list[int] = field(default_factory=list)
    deepspeed: dict[str, Any] | None = None  # the DeepSpeed JSON, "auto" values resolved
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
    if n == "auto":
        if strategy in ("auto", "none"):
            n = max(1, len(hw.gpus)) if strategy == "auto" else 1
        else:
            # On CPU several processes over gloo make a real (if slow) distributed run: 2 is enough to
            # exercise every collective without oversubscribing a small machine.
            n = len(hw.gpus) if hw.gpus else 2
    assert isinstance(n, int)
    if strategy == "auto":
        if d.offload != "none":
            strategy = "zero3" if d.offload == "optimizer+params" else "zero2"
            reasons.append(f"strategy {strategy}: offload: {d.offload} needs DeepSpeed ZeRO")
        elif n * d.nodes > 1:
            strategy = "ddp"
            reasons.append(f"strategy ddp: {n * d.nodes} processes, and the model is replicated on each")
        else:
            strategy = "none"
    if strategy != "none" and hw.gpus and n > len(hw.gpus):
        reasons.append(f"{n} processes per node on {len(hw.gpus)} GPU(s): more processes than GPUs")
    return strategy, n


def _launcher(strategy: str, requested: str, world: int) -> str:
    if requested != "auto":
        return requested
    if world == 1 and strategy == "none":
        return "direct"  # a launcher parent costs ~4 s and ~250 MB for nothing
    if strategy.startswith("zero"):
        return "deepspeed"
    if strategy == "fsdp":
        return "accelerate"
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
    launcher = _launcher(strategy, d.launcher, world)
    if strategy != "none":
        reasons.append(f"launcher {launcher}")
    offload = d.offload
    return Plan(device, n, launcher, precision, strategy, offload, d.nodes, gpus, None, reasons, warnings)


def train_args(res: Resolved, plan: Plan) -> dict[str, Any]:
    """The SFTConfig keyword arguments the worker will use, minus the run-dir paths.

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
    has_eval = res.config.data.eval is not None or res.config.data.eval_split is not None
    if has_eval:
        args["eval_strategy"] = "steps"
        args["eval_steps"] = 0.2  # a fraction of the total steps: five evaluations a run
    if plan.device == "cpu":
        args["use_cpu"] = True
        args["dataloader_pin_memory"] = False
    if plan.world_size > 1:
        if plan.device == "cpu":
            args["ddp_backend"] = "gloo"
        if res.config.method != "full":
            # Frozen base weights would otherwise make DDP search for unused parameters every step.
            args["ddp_find_unused_parameters"] = False
    args["bf16"] = plan.precision == "bf16"
    args["fp16"] = plan.precision == "fp16"
    args.update(user)
    return args
