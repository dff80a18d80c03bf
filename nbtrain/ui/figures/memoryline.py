"""The memory estimate as the dashboard draws it: the line comparable with what a run measures (RSS on a
CPU, torch's allocator on a GPU), its label and what its hover says it adds up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbtrain.control.memory import CUDA_CONTEXT_BYTES, NCCL_BYTES

GIB = float(2**30)
MIB = float(2**20)


# The Python, torch and transformers a training process imports before it loads anything: resident
# memory the estimate leaves out (it counts tensors) but a CPU run's RSS includes. Measured with
# torch 2.13 (CPU) and transformers 5.24: ~0.45 GiB; a machine's exact figure differs a little.
CPU_RUNTIME_BYTES = int(0.45 * GIB)


@dataclass(frozen=True)
class MemoryLine:
    """The memory estimate as drawn: at ``bytes``, named ``label`` in the legend, ``label_text`` on the
    line (what it adds up), and ``hover`` over that label (the estimate's parts, what to compare it with)."""

    bytes: float
    label: str
    hover: str
    label_text: str = ""


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 or n == 0 else f"{n / MIB:.0f} MiB"


def memory_line(estimate: Any) -> MemoryLine | None:
    """The line to draw for the estimate recorded in resolved.json, comparable with what is measured.

    A CPU run measures each process's RSS, which holds the Python / torch runtime beside the tensors: the
    line is the estimate plus ``CPU_RUNTIME_BYTES``. A GPU run measures torch's allocator, which does not
    see the CUDA context (nor NCCL's buffers) the estimate counts: the line leaves them out. A bare
    number is drawn as it is."""
    if isinstance(estimate, (int, float)) and not isinstance(estimate, bool):
        text = f"estimate {_gib(estimate)}"
        return MemoryLine(float(estimate), "estimate", text, text)
    if not isinstance(estimate, dict):
        return None
    total = _estimate_total(estimate)
    if total is None:
        return None
    raw_inputs, raw_parts = estimate.get("inputs"), estimate.get("parts")
    inputs: dict[str, Any] = raw_inputs if isinstance(raw_inputs, dict) else {}
    parts: dict[str, Any] = raw_parts if isinstance(raw_parts, dict) else {}
    device = inputs.get("device") or estimate.get("device")
    shown = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items() if isinstance(v, (int, float)) and v)
    what = f"estimate {_gib(total)}" + (f" ({shown})" if shown else "")
    if device == "cpu":
        line = total + CPU_RUNTIME_BYTES
        return MemoryLine(
            line,
            "estimate + runtime",
            f"{what}<br>+ {_gib(CPU_RUNTIME_BYTES)} Python / torch runtime (in RSS, not in the estimate)"
            f"<br>= {_gib(line)}: compare with RSS",
            f"estimate {_gib(total)} + runtime {_gib(CPU_RUNTIME_BYTES)} = {_gib(line)}",
        )
    if device == "cuda":
        left_out = CUDA_CONTEXT_BYTES + (NCCL_BYTES if int(inputs.get("world_size") or 1) > 1 else 0)
        line = max(0.0, total - left_out)
        return MemoryLine(
            line,
            "estimate (allocator)",
            f"{what}<br>− {_gib(left_out)} CUDA context"
            + (" and NCCL buffers" if left_out > CUDA_CONTEXT_BYTES else "")
            + f" (torch's allocator does not see them)<br>= {_gib(line)}: compare with GPU reserved",
            f"estimate {_gib(total)} − CUDA context {_gib(left_out)} = {_gib(line)}",
        )
    return MemoryLine(total, "estimate", what, f"estimate {_gib(total)}")


def _estimate_total(estimate: dict[str, Any]) -> float | None:
    for k in ("per_device_bytes", "peak_bytes", "total_bytes", "bytes"):
        v = estimate.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None
