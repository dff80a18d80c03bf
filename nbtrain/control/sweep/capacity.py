"""How many trials of a sweep run side by side, from what one trial needs (the plan and its memory
estimate) and what the machine has, and why, in the words views show: "2 at once: 1 core each, 0.6 GiB
each (19.8 GiB available)"."""

from __future__ import annotations

from dataclasses import dataclass

from nbtrain.contract.raywork import room, worker_resources
from nbtrain.control.launch import rayjobs
from nbtrain.control.prepare import Prepared
from nbtrain.control.start import is_ray, is_slurm

GIB = 1 << 30
# What a training process holds besides the estimate's parts: Python, torch, transformers, TRL and the
# data pipeline imported (a warm-forked child shares most of it with the warm process, a cold one does not).
PROCESS_BYTES = 600 << 20
RAM_SHARE = (
    0.8  # of the available memory, what trials may take together (the kernel and the OS keep the rest)
)


@dataclass(frozen=True)
class Capacity:
    at_once: int
    threads: int | None  # torch threads a trial (CPU trials), None: the run's own choice
    why: str
    here: bool = True  # the trials train on this machine (not as SLURM or Ray jobs): they start warm


def capacity(prep: Prepared, budget: int, asked: int | str = "auto") -> Capacity:
    """Trials at once for ``budget`` trials like ``prep``. On a CPU: the cores are shared out (at least one
    each) and the trials together stay within ``RAM_SHARE`` of the available memory; on GPUs one trial
    has the GPUs the plan gives it, so trials run one after another. ``asked``: the config's number, kept
    (the threads shared out for it), or "auto"."""
    hw, plan = prep.hardware, prep.plan
    if is_slurm(prep):  # each trial is a job: SLURM queues what its nodes cannot take yet
        presets = prep.preset.chain() if prep.preset else []
        caps = [p.max_runs_at_once for p in presets if p.max_runs_at_once]
        n = min([asked if isinstance(asked, int) else budget, *caps])
        slurm = prep.resolved.config.distributed.slurm
        where = f" on partition {slurm.partition}" if slurm is not None and slurm.partition else ""
        why = f"{n} at once: each trial is a SLURM job{where}, queued by SLURM"
        if caps and n == min(caps):
            why += f" (the course allows {min(caps)} of a student's runs on the cluster at once)"
        return Capacity(n, None, why, here=False)
    if is_ray(prep):
        return _on_ray(prep, budget, asked)
    if plan.device != "cpu":
        n = asked if isinstance(asked, int) else 1
        gpus = len(plan.gpus) or 1
        why = (
            f"{n} at once as asked" if isinstance(asked, int) else
            f"1 at once: each trial plans for {gpus} {plan.device.upper()} device{'s' if gpus > 1 else ''}"
        )  # fmt: skip
        return Capacity(n, None, why)
    mem = prep.memory()
    need = PROCESS_BYTES + (max(mem[0].per_device_bytes, mem[0].cpu_bytes) if mem is not None else 0)
    cores = max(1, hw.cpu_count)
    by_ram = max(1, int(hw.ram_available * RAM_SHARE // need)) if hw.ram_available else 1
    if isinstance(asked, int):
        n, how = asked, "as asked"
    else:
        n = max(1, min(budget, cores, by_ram))
        limit = "trials" if n == budget else "cores" if n == cores else "memory"
        how = f"(limited by {limit})"
    threads = max(1, cores // n)
    per = f"{need / GIB:.1f} GiB each" + ("" if mem is not None else " (the model's size unknown here)")
    core_text = f"{threads} core{'s' if threads > 1 else ''} each"
    why = f"{n} at once {how}: {core_text}, {per} of {hw.ram_available / GIB:.1f} GiB available"
    if isinstance(asked, int) and n * need > hw.ram_available * RAM_SHARE:
        why += f" (more than the {RAM_SHARE:.0%} of it trials may take: they may run out of memory)"
    return Capacity(n, threads, why)


def _on_ray(prep: Prepared, budget: int, asked: int | str) -> Capacity:
    """Each trial is a Ray job: as many at once as the cluster's nodes have room for their workers now (at
    least one; Ray queues a job whose workers do not fit yet), or the number asked."""
    r = prep.resolved.config.distributed.ray
    assert r is not None
    workers = prep.plan.nodes * prep.plan.num_processes
    if isinstance(asked, int):
        why = f"{asked} at once as asked: each trial is a Ray job at {r.address}"
        return Capacity(asked, None, why, here=False)
    need = worker_resources(r.resources_per_worker, gpu=prep.plan.device == "cuda")
    try:
        free = room([n.resources for n in rayjobs.nodes(r.address)], need)
    except rayjobs.RayUnavailable:
        free = workers  # planned a moment ago: the cluster answered then
    n = max(1, min(budget, free // workers))
    each = ", ".join(f"{k}: {v:g}" for k, v in need.items())
    plural = "s" if workers > 1 else ""
    why = (
        f"{n} at once: each trial is a Ray job of {workers} worker{plural} ({each} each); "
        f"the cluster at {r.address} has room for {free} such worker{'s' if free != 1 else ''}"
    )
    return Capacity(n, None, why, here=False)
