"""Apple silicon (MPS) and Huawei Ascend (NPU): the precision a plan takes there, what it refuses, and why.

The hardware probe finds them from platform facts (``nbtrain.hardware.facts``); the worker needs nothing of
its own for them: transformers' ``TrainingArguments`` picks ``mps`` or ``npu:0`` itself when ``use_cpu`` is
off (``is_torch_mps_available`` / ``is_torch_npu_available``), and accelerate runs several NPU ranks as
``MULTI_NPU`` over HCCL. What is refused here is what nbtrain's stack does not offer on these devices,
or cannot vouch for: none of this has run on a Mac's GPU or an Ascend NPU (nbtrain's tests give the
hardware facts as input; the machines it is tested on have CPUs and NVIDIA GPUs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nbtrain.control.config.choices import ZERO_STAGES, Precision
from nbtrain.hardware import Accelerator

if TYPE_CHECKING:
    from nbtrain.control.config.schema import RunConfig


class Planned(Protocol):
    """What the refusals read of a plan (nbtrain.control.plan.planner.Plan, which imports this module)."""

    @property
    def device(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def strategy(self) -> str: ...
    @property
    def offload(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def precision(self) -> str: ...


ACCELERATORS = ("mps", "npu")

UNVERIFIED = {
    "mps": "planned from platform facts (macOS on arm64), untested on a Mac's GPU",
    "npu": "planned from torch_npu and /dev/davinci*, untested on an Ascend NPU",
}

# Why method: qlora is refused (bitsandbytes 0.50's backends: cpu, cuda, default, hpu, mps, triton, xpu).
QLORA_WHY = {
    "mps": "bitsandbytes runs its 4-bit ops on MPS as pure-PyTorch fallbacks before macOS 26 and as kernels "
    "fetched from the Hugging Face Hub from macOS 26 on; nbtrain has verified neither",
    "npu": "bitsandbytes has no Ascend backend (it has CPU, CUDA, HPU, MPS, Triton and XPU ones)",
}

DEEPSPEED_WHY = {
    "mps": "DeepSpeed's MPS accelerator communicates over gloo, on CPU tensors, and a Mac has one GPU, so "
    "ZeRO has nothing to shard across. Use strategy: none (one process)",
    "npu": "DeepSpeed on Ascend needs its NPU accelerator and ops built for CANN, and nbtrain's DeepSpeed "
    "path (its DeepSpeed JSON, CPU Adam for offload) is verified on CUDA and CPU only. Use strategy: ddp "
    "(HCCL through torchrun)",
}
ONE_MPS = (
    "a Mac has one GPU and torch.distributed has no MPS backend (gloo moves CPU tensors). Use strategy: none "
    "and num_processes: 1"
)

MPS_PRECISION = (
    "precision fp32: on MPS nbtrain keeps full precision unless asked. fp16 (torch.autocast with a "
    "GradScaler, PyTorch >= 2.8 on MPS) halves the activations: ask precision: fp16; bf16 needs macOS 14 "
    "and is emulated in fp32 on M1/M2 chips"
)


def accelerator_precision(acc: Accelerator, reasons: list[str]) -> Precision:
    """``precision: auto`` on an MPS GPU or Ascend NPUs, with the reason added to ``reasons``."""
    if acc.kind == "mps":
        reasons.append(MPS_PRECISION)
        return "fp32"
    reasons.append(
        "precision bf16: the Ascend 910B trains in bf16 natively. The chip is not read here; on an "
        "Ascend 910 without bf16 (910A) set precision: fp16 (at start transformers checks "
        "torch.npu.is_bf16_supported() and refuses bf16 there)"
    )
    return "bf16"


def accelerator_problems(
    cfg: RunConfig, plan: Planned, acc: Accelerator | None
) -> list[tuple[tuple[str | int, ...], str]]:
    """What the config asks for that this plan's MPS GPU or Ascend NPUs cannot give: (key path, message
    naming the cause and the fix). Empty for CUDA and CPU plans."""
    device = plan.device
    if device not in ACCELERATORS or acc is None:
        return []
    items: list[tuple[tuple[str | int, ...], str]] = []
    if plan.method == "qlora":
        why = f"method: qlora is not offered on {device}: {QLORA_WHY[device]}. Use method: lora (or full)"
        items.append((("method",), why))
    if plan.strategy in ZERO_STAGES or plan.offload != "none" or cfg.distributed.launcher == "deepspeed":
        key = "offload" if cfg.distributed.offload != "none" else "strategy"
        why = f"DeepSpeed (ZeRO, offload) is not offered on {device}: {DEEPSPEED_WHY[device]}"
        items.append((("distributed", key), why))
    elif device == "mps" and (plan.world_size > 1 or plan.strategy != "none"):
        why = f"strategy {plan.strategy} with {plan.world_size} process(es) is not offered on mps: {ONE_MPS}"
        items.append((("distributed", "strategy"), why))
    elif device == "npu" and plan.strategy == "fsdp":
        why = (
            "strategy fsdp is not offered on npu: nbtrain has not verified FSDP2 (fully_shard) with "
            "torch_npu. Use strategy: ddp (HCCL through torchrun)"
        )
        items.append((("distributed", "strategy"), why))
    if device == "mps" and plan.precision == "bf16" and not acc.bf16:
        version = ".".join(map(str, acc.macos)) if acc.macos else "(unknown)"
        why = (
            f"bf16 on MPS needs macOS 14 or newer (PyTorch: torch.backends.mps.is_macos_or_newer(14, 0)); "
            f"this Mac runs macOS {version}, where transformers refuses bf16 at start. Use precision: fp16 "
            f"or fp32"
        )
        items.append((("precision",), why))
    return items


__all__ = ["ACCELERATORS", "QLORA_WHY", "UNVERIFIED", "accelerator_precision", "accelerator_problems"]
