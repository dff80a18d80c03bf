"""What the memory guard (``control.MemoryGuard``) says when it stops a run for lack of memory: whose memory
it is -- this run's, the largest other processes', and what nbtrain's own idle warm processes hold, with the
command that frees them -- and the settings that make this run smaller, as fit its method (a LoRA run is
never told to use LoRA).

``holders()`` reads the processes (psutil: each one's RSS, its process group); ``message()`` words it and
reads nothing, so a test gives it the facts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TOP = 3  # the other processes named, largest first


@dataclass
class Holder:
    pid: int
    name: str
    rss: int


@dataclass
class Holders:
    """The memory of the machine by whom: ``run`` (this run's process group: its ranks and launcher),
    ``others`` (every other process, largest first) and ``warm`` (nbtrain's warm processes of this user,
    idle between the runs they fork)."""

    run: int = 0
    others: list[Holder] = field(default_factory=list)
    warm: list[Holder] = field(default_factory=list)


def holders() -> Holders:
    """The processes of this machine by RSS; one that cannot be read (gone, another user's) is left out."""
    import psutil

    from nbtrain.contract.warmproto import registered

    warm = {int(e["pid"]) for e in registered()}
    group = os.getpgid(0)
    out = Holders()
    for proc in psutil.process_iter(["pid", "name", "memory_info", "cmdline"]):
        pid, mem = proc.info["pid"], proc.info["memory_info"]
        if mem is None:
            continue
        name = _named(str(proc.info["name"]), proc.info["cmdline"] or [])
        try:
            mine = os.getpgid(pid) == group
        except OSError:
            continue
        if mine:
            out.run += int(mem.rss)
        elif pid in warm:
            out.warm.append(Holder(pid, name, int(mem.rss)))
        else:
            out.others.append(Holder(pid, name, int(mem.rss)))
    out.others.sort(key=lambda h: h.rss, reverse=True)
    return out


def _named(name: str, argv: list[str]) -> str:
    """A process as a person knows it: Python by what it runs (``python -m ipykernel_launcher``: a
    notebook's kernel; ``python train.py``), anything else by its name."""
    if not name.startswith("python") or len(argv) < 2:
        return name
    if "-m" in argv[1:-1]:
        return f"python -m {argv[argv.index('-m', 1) + 1]}"
    script = next((a for a in argv[1:] if not a.startswith("-")), None)
    return f"python {os.path.basename(script)}" if script else name


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def smaller(plan: Mapping[str, Any]) -> str:
    """The settings that shrink a run of ``plan`` (resolved.json's), as fit its method and device."""
    method, device = plan.get("method"), plan.get("device")
    if method == "full":
        return "use method: lora (a small adapter is trained, not every weight with its optimizer states)" + (
            " or qlora" if device == "cuda" else ""
        )
    tips = ["lower train: per_device_train_batch_size or max_length"]
    if not plan.get("gradient_checkpointing"):
        tips.append("set train: gradient_checkpointing: true")
    if method == "lora" and device == "cuda":
        tips.append("use method: qlora (the frozen weights in 4 bits)")
    return ", ".join(tips[:-1]) + f" or {tips[-1]}" if len(tips) > 1 else tips[0]


def message(
    step: int, left: int, limit: int, who: Holders, plan: Mapping[str, Any], run_name: str | None = None
) -> str:
    """The failure's message: how little was left, whose memory it is, and what to do."""
    others = sum(h.rss for h in who.others)
    warm = sum(h.rss for h in who.warm)
    named = ", ".join(f"{h.name} (pid {h.pid}) {_gib(h.rss)}" for h in who.others[:TOP])
    parts = [
        f"out of memory: at step {step} only {_gib(left)} of {_gib(limit)} were left, so nbtrain stopped the "
        f"run before the kernel's OOM killer took it or something else.",
        f"Whose memory (RSS): this run {_gib(who.run)}; other processes {_gib(others)}"
        + (f" (the largest: {named})" if named else ""),
    ]
    if who.warm:
        n = len(who.warm)
        parts[-1] += (
            f"; nbtrain's idle warm processes {_gib(warm)} ({n} process{'es' * (n != 1)}: "
            f"%finetune warm stop frees them, and each exits by itself after NBTRAIN_WARM_IDLE seconds idle)"
        )
    parts[-1] += "."
    resume = f"%finetune resume {run_name}" if run_name else "%finetune resume RUN"
    if others + warm > who.run:
        parts.append(
            f"Most of it is not this run's: free it (close what you do not need, stop idle kernels), then "
            f"{resume} continues from the last checkpoint (train: checkpoint_minutes saves one every N "
            f"minutes). Or make the run smaller: {smaller(plan)}."
        )
    else:
        parts.append(f"This run holds most of it: {smaller(plan)}; or check the data for very long rows.")
    return " ".join(parts)
