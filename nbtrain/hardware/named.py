"""Hardware a user names instead of the machine the notebook sits on: "8xA100-40GB", "2x8xH100-80GB", "1xT4",
"M3-36GB", "cpu-16". The facts NVML would report on such a machine (each card's memory as NVML shows it,
its compute capability), the host RAM of the usual machine with that many cards, and the card's dense
16-bit compute, so the planner plans for it exactly as for a machine it probes: the what-if estimate
(``nbtrain.estimate(config, on=...)``), a SLURM partition's nodes (a GRES type names the card), and the
table of docs/plans.md (bench/plan_table.py) all take their hardware from here.

    parse("2x8xH100-80GB")  # -> Target(nodes=2, per_node=8, card=H100-80GB)
    parse("8xA100-40GB").hardware()  # -> one node's Hardware
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nbtrain.hardware.facts import GPU, Accelerator, Hardware

GiB = 2**30
# GPU kernel libraries the usual training machine has installed (the plan's fast paths need them; a card
# that cannot use one, a T4 and flash-attention, is told apart by its compute capability, as on a real one).
KERNELS = ("liger_kernel", "flash_attn")


@dataclass(frozen=True)
class Card:
    key: str  # how it is named: "A100-40GB"
    name: str  # what NVML calls it
    gib: int  # memory per card as NVML reports it (a "16 GB" T4 shows 15 GiB)
    cc: tuple[int, int]  # compute capability (ROCm cards: the NVIDIA generation whose paths they take)
    tflops: float  # dense 16-bit (fp16 where the card has no bf16) tensor TFLOP/s, per card
    ram_gib: tuple[int, int]  # host RAM of the usual machine with 1 card, and with 8
    aliases: tuple[str, ...] = ()
    note: str = ""

    @property
    def bf16(self) -> bool:
        return self.cc >= (8, 0)

    def words(self) -> str:
        fast = "bf16" if self.bf16 else "no bf16 (fp16)"
        fa = "no flash-attention" if not self.bf16 else f"flash-attention {3 if self.cc >= (9, 0) else 2}"
        note = f"; {self.note}" if self.note else ""
        return f"{self.gib} GiB each, {fast}, {fa}, ~{self.tflops:g} TFLOP/s{note}"


# Each card's facts from its maker's data sheet (dense tensor throughput, no sparsity) and NVML's memory
# reading; host RAM as in bench/plan_table.py's machines (a Colab T4 VM, a g4dn.metal; a 4090 workstation;
# GCP a2-highgpu-1g / -8g; an a3 H100 VM) or the cloud's usual instance for the others.
CARDS = (
    Card("T4", "Tesla T4", 15, (7, 5), 65, (12, 384), ("T4-16GB",)),
    Card("L4", "NVIDIA L4", 22, (8, 9), 121, (32, 384), ("L4-24GB",)),
    Card("A10G", "NVIDIA A10G", 22, (8, 6), 70, (32, 768), ("A10G-24GB",)),
    Card("3090", "NVIDIA GeForce RTX 3090", 24, (8, 6), 71, (64, 512), ("RTX3090", "RTX-3090", "3090-24GB")),
    Card("4090", "NVIDIA GeForce RTX 4090", 24, (8, 9), 165, (64, 512), ("RTX4090", "RTX-4090", "4090-24GB")),
    Card("A100-40GB", "NVIDIA A100-SXM4-40GB", 40, (8, 0), 312, (85, 680), ("A100-40",)),
    Card("A100-80GB", "NVIDIA A100-SXM4-80GB", 80, (8, 0), 312, (170, 1360), ("A100-80",)),
    Card("H100-80GB", "NVIDIA H100 80GB HBM3", 80, (9, 0), 989, (234, 1872), ("H100", "H100-80")),
    Card("H200", "NVIDIA H200", 140, (9, 0), 989, (234, 1872), ("H200-141GB", "H200-140GB")),
    Card("MI300X", "AMD Instinct MI300X", 192, (8, 0), 1307, (256, 2048), ("MI300X-192GB",),
         "ROCm: planned as a bf16 card with flash-attention 2; unverified on the device"),
)  # fmt: skip
# A type that does not say the card's memory: which it could be (SLURM's GRES "a100" is 40 or 80 GB).
AMBIGUOUS = {"A100": ("A100-40GB", "A100-80GB")}
APPLE = re.compile(r"^M([1-4])(?:-(PRO|MAX|ULTRA))?(?:-(\d+)GB)?$")
CPU = re.compile(r"^CPU(?:-(\d+))?$")


def _norm(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip()).upper().replace("--", "-")


_BY_NAME = {_norm(a): c for c in CARDS for a in (c.key, *c.aliases)}


def card(name: str) -> Card:
    """The card named ``name`` ("A100-80GB", "h100", "RTX4090"); ValueError naming the known ones."""
    found = _BY_NAME.get(_norm(name))
    if found is not None:
        return found
    options = AMBIGUOUS.get(_norm(name))
    if options:
        raise ValueError(f"{name!r} comes with more than one memory size: say which, {' or '.join(options)}")
    raise ValueError(f"unknown card {name!r}; known: {', '.join(c.key for c in CARDS)}, an Apple M1-M4 "
                     "(e.g. M3-MAX-64GB) or cpu-N")  # fmt: skip


def gres_card(kind: str) -> Card:
    """The card a SLURM GRES type names: "h100", "a100_80g", "nvidia_a100-sxm4-80gb" (as GRES AutoDetect
    names it), "tesla_t4"; ValueError as ``card`` gives it ("a100" is 40 or 80 GB: say which)."""
    name = _norm(kind)
    for _ in range(2):
        name = re.sub(r"^(NVIDIA|TESLA|GEFORCE|AMD|INSTINCT)-", "", name)
    name = re.sub(r"-(SXM\d*|PCIE|NVL|HBM\d*E?)(?=-|$)", "", name)
    return card(re.sub(r"(\d+)G$", r"\1GB", name))


@dataclass(frozen=True)
class Target:
    """Named hardware: ``nodes`` machines of ``per_node`` cards each (or an Apple Mac, or a CPU machine)."""

    spec: str
    nodes: int = 1
    per_node: int = 1
    card: Card | None = None
    apple: Accelerator | None = None
    cpus: int = 0
    ram_gib: int = 0

    def hardware(self) -> Hardware:
        """One node of it, as the planner sees a machine it probes."""
        if self.card is not None:
            c, n = self.card, self.per_node
            gpus = [GPU(i, c.name, c.gib * GiB, c.gib * GiB - GiB // 2, c.cc) for i in range(n)]
            ram = self.ram_gib * GiB
            return Hardware(gpus=gpus, cpu_count=8 * n, ram_total=ram, ram_available=ram - 4 * GiB,
                            disk_free=2**40, kernels=KERNELS)  # fmt: skip
        ram = self.ram_gib * GiB
        cpus = self.cpus or 8
        return Hardware(cpu_count=cpus, ram_total=ram, ram_available=int(ram * 0.8), disk_free=2**40,
                        accelerator=self.apple)  # fmt: skip

    def words(self) -> str:
        """What the plan was made for, for a person: "2 nodes x 8 H100-80GB (80 GiB each, bf16, ...)"."""
        nodes = f"{self.nodes} nodes x " if self.nodes > 1 else ""
        if self.card is not None:
            return (
                f"{nodes}{self.per_node} x {self.card.key} ({self.card.words()}), {self.ram_gib} GiB host RAM"
                + (" a node" if self.nodes > 1 else "")
            )
        if self.apple is not None:
            return f"{self.apple.name} ({self.ram_gib} GiB unified memory)"
        return f"{nodes}a CPU machine of {self.cpus} cores, {self.ram_gib} GiB RAM"

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "nodes": self.nodes, "per_node": self.per_node,
                "card": self.card.key if self.card else None, "ram_gib": self.ram_gib}  # fmt: skip


def host_ram_gib(c: Card, n: int) -> int:
    """Host RAM of the usual machine with ``n`` of card ``c``: its one-card size, else its eight-card size
    shared out per card."""
    one, eight = c.ram_gib
    return one if n == 1 else max(one, eight * n // 8)


_SPEC = re.compile(r"^(?:(\d+)\s*[X*×]\s*)?(?:(\d+)\s*[X*×]\s*)?(.+)$")


def parse(spec: str) -> Target:
    """``[NODES x][CARDS x]CARD`` ("8xA100-40GB", "2x8xH100-80GB", "T4"), an Apple Mac ("M3-MAX-64GB"), or
    "cpu-N"; ValueError saying what was not understood and what is."""
    m = _SPEC.match(spec.strip().upper())
    if not m or not spec.strip():
        raise ValueError(f"{spec!r} is not hardware nbtrain knows: write e.g. 8xA100-40GB or 2x8xH100-80GB")
    first, second, name = m.group(1), m.group(2), _norm(m.group(3)).strip("-")
    nodes, per_node = (int(first), int(second)) if second else (1, int(first) if first else 1)
    if not (1 <= nodes <= 4096 and 1 <= per_node <= 64):
        raise ValueError(f"{spec!r}: between 1 and 4096 nodes of 1 to 64 cards each")
    if cpu := CPU.match(name):
        cpus = int(cpu.group(1) or 8)
        if not 1 <= cpus <= 1024:
            raise ValueError(f"{spec!r}: a CPU machine has 1 to 1024 cores")
        return Target(spec, nodes, 1, cpus=cpus, ram_gib=max(8, 4 * cpus))
    if apple := APPLE.match(name):
        if nodes > 1 or per_node > 1:
            raise ValueError(f"{spec!r}: a Mac is one machine with one GPU")
        chip = f"Apple M{apple.group(1)}" + (f" {apple.group(2).title()}" if apple.group(2) else "")
        ram = int(apple.group(3) or 16)
        acc = Accelerator("mps", 1, f"{chip} GPU (MPS)", ram * GiB, (14, 0))
        return Target(spec, 1, 1, apple=acc, cpus=10, ram_gib=ram)
    c = card(name)
    return Target(spec, nodes, per_node, card=c, ram_gib=host_ram_gib(c, per_node))
