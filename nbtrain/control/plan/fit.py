"""ONE rule for "does this run fit here": the planner (so ``start``), the comparison table of
``nbtrain.estimate``, its report and its chart all ask ``fits``, so none can say "fits" where another refuses.

What counts as usable, per memory pool (each GPU a process runs on; the node's RAM):

    usable = min(total x (1 - MARGIN), available now)

* ``total x (1 - MARGIN)``: the device's size is the number a user knows ("a 24 GB card") and the one
  every verdict is shown against; MARGIN keeps a tenth of it free for what the estimate does not see
  (allocator spikes, library workspaces, the estimate's own error, held to 5% on measured runs).
* ``available now``: a run starts now, beside whatever already runs. Memory another process holds at this
  moment (a second run on the same GPU, the desktop and browser in RAM) cannot be counted on, and a run
  planned into it would fail minutes later, after loading the model, with an out-of-memory error. So a
  verdict of "fits" means "start would accept it and it should not run out of memory", and a busy device
  is named as the reason. On an idle GPU available ~ total, so the margin decides; RAM is rarely idle.

A GPU run is checked per GPU (every rank holds the same) and, separately, for the host RAM a node needs
(loading the model, offloaded optimizer state); an Ascend NPU run likewise, per NPU. A CPU run's processes
share the node's RAM: their sum is checked, and an Apple MPS run's too (the GPU shares the RAM). A size the
machine did not report (0) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbtrain.control.memory import Estimate, gib
from nbtrain.hardware import Hardware

MARGIN = 0.10  # share of each device's total memory kept free (see the module docstring)


@dataclass(frozen=True)
class Fit:
    """The verdict for one estimate on one machine. ``why`` is the sentence every surface shows."""

    ok: bool
    why: str
    need: int  # bytes the run needs per GPU, or of the node's RAM for a CPU run
    usable: int  # of ``capacity``: what the rule lets a run use (0: size not reported, not checked)
    capacity: int  # total bytes of the smallest device used (what charts and tables show against)
    where: str  # "per GPU" | "in RAM"
    host_need: int = 0  # GPU runs: host RAM per node (loading, offloaded state)
    host_usable: int = 0  # 0: not checked
    host_capacity: int = 0  # the node's RAM, when host RAM is checked


def usable(total: int, available: int) -> int:
    """The rule: a device's total less MARGIN, and never more than is available now (0: not reported)."""
    capped = int(total * (1 - MARGIN))
    return min(capped, available) if available > 0 else capped


def _held(total: int, available: int) -> str:
    """Why less than the margin allows is usable: other processes hold part of the device."""
    if 0 < available < int(total * (1 - MARGIN)):
        return f" (other processes hold {gib(total - available)} of it now)"
    return ""


def fits(estimate: Estimate, hardware: Hardware) -> Fit:
    """Whether ``estimate`` fits on ``hardware`` by the one rule above, and why, in one sentence."""
    i = estimate.inputs
    per_node = max(1, int(i["world_size"]) // max(1, int(i["nodes"])))
    if i["device"] == "cuda" and hardware.gpus:
        # The GPUs the planner gives this node's processes: the first ``per_node`` (plan.gpus).
        cards = hardware.gpus[:per_node]
        capacity = min(g.memory_total for g in cards)
        available = min(g.memory_free for g in cards)
        need, where = estimate.per_device_bytes, "per GPU"
        host_need = estimate.cpu_bytes
        host_usable = usable(hardware.ram_total, hardware.ram_available) if hardware.ram_total else 0
    elif i["device"] == "npu" and hardware.accelerator is not None:
        # An Ascend NPU's memory is not read (no driver tool is asked): 0, so the estimate is not checked.
        capacity = available = hardware.accelerator.memory_total
        need, where = estimate.per_device_bytes, "per NPU"
        host_need = estimate.cpu_bytes
        host_usable = usable(hardware.ram_total, hardware.ram_available) if hardware.ram_total else 0
    else:
        # Every process of a CPU run holds its own parts in the same RAM; so does an Apple MPS GPU's run
        # (unified memory: the GPU's memory is the RAM).
        capacity, available = hardware.ram_total, hardware.ram_available
        need, where = estimate.per_device_bytes * per_node, "in RAM"
        host_need = host_usable = 0
    room = usable(capacity, available) if capacity else 0
    device_ok = not room or need <= room
    host_ok = not host_usable or host_need <= host_usable
    processes = ""
    if where == "in RAM" and per_node > 1:
        processes = f" ({per_node} processes x {gib(estimate.per_device_bytes)})"
    if not capacity:
        why = (
            f"fits as far as known: needs {gib(need)} {where}{processes}; the machine reports no memory size"
        )
    elif device_ok and host_ok:
        why = f"fits: {gib(need)} of {gib(capacity)} {where} ({need / capacity:.0%}){processes}"
        if host_need:
            why += f"; host RAM {gib(host_need)} per node"
    elif not device_ok:
        held = _held(capacity, available)
        why = f"needs {gib(need)} {where}{processes}, {gib(room)} usable of {gib(capacity)}{held}"
    else:
        held = _held(hardware.ram_total, hardware.ram_available)
        why = (
            f"GPU fits ({gib(need)}), but host RAM needs {gib(host_need)} per node "
            f"({gib(host_usable)} usable of {gib(hardware.ram_total)}{held}): "
            + estimate.details.get("cpu", "")
        )
    host_capacity = hardware.ram_total if host_usable else 0
    return Fit(device_ok and host_ok, why, need, room, capacity, where, host_need, host_usable, host_capacity)


__all__ = ["MARGIN", "Fit", "fits", "usable"]
