"""What the machine has, read without initialising CUDA: NVML for GPUs, psutil for CPU/RAM/disk.

The kernel must never touch torch.cuda (it would break accelerate's notebook_launcher, which forks),
so every GPU fact here comes from NVML. Other accelerators come from platform facts alone, never from
importing torch or its device plugins: Apple silicon's GPU (PyTorch's MPS backend) from macOS on arm64,
Huawei Ascend NPUs from the ``torch_npu`` distribution and the ``/dev/davinci<N>`` device files.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_total: int  # bytes
    memory_free: int
    compute_capability: tuple[int, int]
    mig: bool = False

    @property
    def bf16(self) -> bool:
        """bf16 matmuls run natively from Ampere (compute capability 8.0) on."""
        return self.compute_capability >= (8, 0)


MPS_MIN_MACOS = (12, 3)  # PyTorch's MPS backend needs macOS 12.3 or newer
# bf16 on MPS: what PyTorch, accelerate, transformers and DeepSpeed all test for
# (``torch.backends.mps.is_macos_or_newer(14, 0)``); transformers notes that Metal emulates it in fp32 on
# chips without native support (M1/M2).
MPS_BF16_MACOS = (14, 0)


@dataclass(frozen=True)
class Accelerator:
    """A device that is not an NVIDIA GPU, found from platform facts: ``kind`` "mps" (Apple silicon's GPU,
    one per machine, sharing the machine's RAM) or "npu" (Huawei Ascend, ``count`` of them)."""

    kind: str  # "mps" | "npu"
    count: int  # devices this process may use
    name: str  # what was found, for people
    memory_total: int = 0  # bytes per device; MPS: the unified memory (the RAM); 0: not known
    macos: tuple[int, int] | None = None  # MPS: the macOS version

    @property
    def bf16(self) -> bool:
        """MPS: from macOS 14 (emulated on M1/M2). NPU: the Ascend 910B has bf16; the chip is not read
        without its driver's tools, so this says what the training NPU nbtrain plans for has."""
        if self.kind == "mps":
            return self.macos is not None and self.macos >= MPS_BF16_MACOS
        return True


@dataclass(frozen=True)
class Hardware:
    gpus: list[GPU] = field(default_factory=list)
    cpu_count: int = 1
    ram_total: int = 0
    ram_available: int = 0
    disk_free: int = 0
    nvml_error: str | None = None
    accelerator: Accelerator | None = None  # an Apple MPS GPU or Ascend NPUs (see the module docstring)
    accelerator_note: str | None = None  # why something that looked like one is not used
    # GPU kernel libraries installed (found, never imported): the plan's fast paths need them (FAST_KERNELS)
    kernels: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for g, gd in zip(self.gpus, d["gpus"], strict=True):
            gd["bf16"] = g.bf16
        if self.accelerator is not None:
            d["accelerator"]["bf16"] = self.accelerator.bf16
        return d


def _version(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def mps_facts(system: str, machine: str, macos: str, ram_total: int) -> tuple[Accelerator | None, str | None]:
    """Apple silicon's GPU from ``platform.system()``, ``platform.machine()``, ``platform.mac_ver()[0]``.

    Every macOS arm64 build of PyTorch has the MPS backend; an x86_64 Python (Rosetta) has none. Its
    memory is the machine's RAM, shared with the CPU (unified memory)."""
    if system != "Darwin":
        return None, None
    if machine != "arm64":
        return None, f"macOS on {machine}: PyTorch's MPS backend needs Apple silicon and an arm64 Python"
    version = _version(macos)
    if version is None or version < MPS_MIN_MACOS:
        return None, f"macOS {macos or '(unknown version)'}: PyTorch's MPS backend needs macOS 12.3 or newer"
    return Accelerator("mps", 1, f"Apple silicon GPU (MPS), macOS {macos}", ram_total, version), None


def npu_facts(
    torch_npu: str | None, devices: list[str], visible: str | None = None
) -> tuple[Accelerator | None, str | None]:
    """Ascend NPUs from the installed ``torch_npu`` version (None: not installed), the ``/dev/davinci<N>``
    device files and ``ASCEND_RT_VISIBLE_DEVICES`` (which NPUs this process may use, as CUDA's)."""
    ids = sorted(int(d.rsplit("davinci", 1)[1]) for d in devices if d.rsplit("davinci", 1)[-1].isdigit())
    if visible is not None and visible.strip():
        wanted = {int(v) for v in (x.strip() for x in visible.split(",")) if v.isdigit()}
        ids = [i for i in ids if i in wanted]
    if torch_npu is None:
        if ids:
            return None, (
                f"{len(ids)} Ascend NPU device(s) found (/dev/davinci*) but torch_npu is not installed: "
                f"install the torch-npu build matching torch and CANN to train on them"
            )
        return None, None
    if not ids:
        return None, f"torch_npu {torch_npu} is installed but no Ascend NPU is visible (/dev/davinci*)"
    return Accelerator("npu", len(ids), f"Ascend NPU x{len(ids)} (torch_npu {torch_npu})"), None


# Optional GPU kernel libraries, by import name: Liger's Triton kernels (TRL's use_liger_kernel),
# flash-attention 2 (attn_implementation: flash_attention_2) and flash-attention 3 for Hopper (the
# flash-attn-3 distribution's module, which transformers loads for flash_attention_3).
FAST_KERNELS = ("liger_kernel", "flash_attn", "flash_attn_interface")


def installed_kernels() -> tuple[str, ...]:
    """Which of FAST_KERNELS this Python can import (``find_spec``: nothing is imported)."""
    import importlib.util

    return tuple(k for k in FAST_KERNELS if importlib.util.find_spec(k) is not None)


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def accelerator_facts(ram_total: int) -> tuple[Accelerator | None, str | None]:
    """This machine's MPS GPU or Ascend NPUs, read from platform facts (no torch import)."""
    npu, npu_note = npu_facts(
        _installed("torch_npu"), glob.glob("/dev/davinci[0-9]*"), os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    )
    if npu is not None:
        return npu, None
    mps, mps_note = mps_facts(platform.system(), platform.machine(), platform.mac_ver()[0], ram_total)
    return mps, mps_note or npu_note


def _nvml_gpus() -> tuple[list[GPU], str | None]:
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], f"no NVIDIA driver ({e})"
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = pynvml.nvmlDeviceGetCount()
        indices = list(range(count))
        if visible is not None and visible.strip() != "":
            wanted = [v.strip() for v in visible.split(",")]
            indices = [int(v) for v in wanted if v.isdigit() and int(v) < count]
        gpus = []
        for i in indices:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            try:
                mig = bool(pynvml.nvmlDeviceGetMigMode(h)[0])
            except pynvml.NVMLError:
                mig = False
            gpus.append(
                GPU(
                    i,
                    name if isinstance(name, str) else name.decode(),
                    int(mem.total),
                    int(mem.free),
                    (int(major), int(minor)),
                    mig,
                )
            )
        return gpus, None
    finally:
        pynvml.nvmlShutdown()


def probe(disk_path: str | Path = ".") -> Hardware:
    gpus, err = _nvml_gpus()
    vm = psutil.virtual_memory()
    try:
        disk = shutil.disk_usage(Path(disk_path)).free
    except OSError:
        disk = 0
    accelerator, note = accelerator_facts(int(vm.total))
    return Hardware(
        gpus,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        int(vm.total),
        int(vm.available),
        int(disk),
        err,
        accelerator,
        note,
        installed_kernels() if gpus else (),
    )
