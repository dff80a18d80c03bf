"""Hardware + validated config -> Plan: where and how a run trains, and why.

The plan is recorded, with its reasons, in ``resolved.json`` and shown by ``--dry-run``. This issue's
planner covers one process (CPU or one GPU); multi-process strategies and the memory-driven choices
build on the same ``Plan``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nbtrain.config import Resolved
from nbtrain.hardware import Hardware


@dataclass
class Plan:
    device: str  # "cpu" | "cuda"
    num_processes: int
    launcher: str  # "direct": python -m nbtrain.worker, no launcher parent
    precision: str  # "fp32" | "fp16" | "bf16"
    gpus: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(res: Resolved, hw: Hardware) -> Plan:
    cfg = res.config
    reasons: list[str] = []
    warnings: list[str] = []
    if hw.gpus:
        gpu = hw.gpus[0]
        device, gpus = "cuda", [gpu.index]
        reasons.append(
            f"1 process on GPU {gpu.index} ({gpu.name}, "
            f"{gpu.memory_total / 2**30:.0f} GiB, compute {gpu.compute_capability[0]}."
            f"{gpu.compute_capability[1]})"
        )
        if len(hw.gpus) > 1:
            reasons.append(
                f"{len(hw.gpus)} GPUs found; this run uses one (multi-process strategies "
                f"are chosen with distributed:)"
            )
    else:
        device, gpus = "cpu", []
        why = f" ({hw.nvml_error})" if hw.nvml_error else ""
        reasons.append(f"1 process on CPU: no GPU found{why}")

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
    return Plan(device, 1, "direct", precision, gpus, reasons, warnings)


def train_args(res: Resolved, plan: Plan) -> dict[str, Any]:
    """The SFTConfig keyword arguments the worker will use, minus the run-dir paths.

    The user's ``train:`` keys win; nbtrain only fills what a notebook user would otherwise have to
    know (frequent logging for the live view, token counting for tokens/s, evaluation when there is
    eval data, the device and precision from the plan).
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
    args["bf16"] = plan.precision == "bf16"
    args["fp16"] = plan.precision == "fp16"
    args.update(user)
    return args
