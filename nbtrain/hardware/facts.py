"""What the machine has, read without initialising CUDA: NVML for GPUs, psutil for CPU/RAM/disk.

The kernel must never touch torch.cuda (it would break accelerate's notebook_launcher, which forks),
so every GPU fact here comes from NVML.
"""

from __future__ import annotations

import os
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


@dataclass(frozen=True)
class Hardware:
    gpus: list[GPU] = field(default_factory=list)
    cpu_count: int = 1
    ram_total: int = 0
    ram_available: int = 0
    disk_free: int = 0
    nvml_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for g, gd in zip(self.gpus, d["gpus"], strict=True):
            gd["bf16"] = g.bf16
        return d


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
    return Hardware(
        gpus,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        int(vm.total),
        int(vm.available),
        int(disk),
        err,
    )
