"""Which hardware a run is planned for: the pipeline's facts stage names its source.

- this machine (``hardware.probe()``), as before;
- hardware the user names (``on="8xA100-40GB"``, ``2x8xH100-80GB``: ``hardware/named.py``), from anywhere;
- a SLURM partition's nodes, for a config with ``distributed: slurm:`` (the notebook on a login node plans
  for the compute nodes, never for itself: ``partition_target``).

The planner, the memory estimate and the fit rule then see that hardware exactly as a machine's probe.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nbtrain.contract.raywork import room, worker_resources
from nbtrain.control.config.problems import problems_error
from nbtrain.control.config.schema import Resolved
from nbtrain.control.launch import partition, rayjobs
from nbtrain.hardware import Hardware
from nbtrain.hardware import probe as probe_hardware
from nbtrain.hardware.facts import installed_kernels
from nbtrain.hardware.named import AMBIGUOUS, Card, Target, card, gres_card, parse

GPU_ENV = "NBTRAIN_SLURM_GPU"  # a site's default for slurm: gpu (the card its GPU nodes have)
Key = tuple[str | int, ...]


class Unplannable(Exception):
    """The run's hardware cannot be known: a config problem at ``key`` (cause and fix in the message)."""

    def __init__(self, key: Key, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Where:
    """The hardware one node of the run has, and where that fact comes from."""

    hardware: Hardware
    source: str  # for a person: "this machine", "named hardware: 8 x A100-40GB (...)", "SLURM partition ..."
    nodes: int | None = None  # nodes the source fixes (named "2x8x..."); None: the config's
    local: bool = True  # the facts of the machine the notebook sits on (probed, or given for it)
    probed: bool = False  # read from this machine now: what it frees (idle warm processes) it can read again


def named_target(on: str) -> Where:
    """``on``, hardware the user names; ValueError saying what was not understood."""
    t: Target = parse(on)
    return Where(t.hardware(), f"named hardware: {t.words()}", nodes=t.nodes if t.nodes > 1 else None,
                 local=False)  # fmt: skip


def where_to_plan(res: Resolved, hardware: Hardware | None, on: str | None) -> Where:
    """The hardware ``res`` is planned for: ``hardware`` as given (tests, the plan table), ``on`` named,
    a SLURM job's partition (``Unplannable`` when it cannot be read: never this machine instead), else
    this machine."""
    if hardware is not None:
        return Where(hardware, "the hardware given")
    if on is not None:
        return named_target(on)
    d = res.config.distributed
    if (d.slurm is not None and d.hostfile is None) or d.ray is not None:
        try:
            return ray_target(res) if d.ray is not None else partition_target(res)
        except Unplannable as e:  # one config problem, at its key, like load_config's
            raise problems_error(res.text, [(e.key, str(e))]) from None
    return Where(probe_hardware(), "this machine", probed=True)


def ray_target(res: Resolved) -> Where:
    """One worker of the Ray run, as the planner sees a machine it probes: the resources each worker
    reserves on the cluster's nodes (Ray's state API), its GPUs' card from the node's accelerator label (or
    ``ray: gpu``), and the workers as the run's nodes (one process each)."""
    r = res.config.distributed.ray
    assert r is not None
    try:
        alive = rayjobs.nodes(r.address)
    except rayjobs.RayUnavailable as e:
        raise Unplannable(
            ("distributed", "ray", "address"),
            f"nbtrain cannot read the Ray cluster to plan the run for its nodes (it never plans a Ray run "
            f"for this machine): {e}",
        ) from None
    if not alive:
        raise Unplannable(
            ("distributed", "ray", "address"), f"the Ray cluster at {r.address} has no node alive"
        )
    gpus = sum(n.resources.get("GPU", 0.0) for n in alive)
    need = worker_resources(r.resources_per_worker, gpu=gpus > 0)
    holds = [n for n in alive if room([n.resources], need)]
    if not holds:
        kinds = "; ".join(sorted({_ray_node_words(n) for n in alive}))
        raise Unplannable(
            ("distributed", "ray", "resources_per_worker"),
            f"no node of the Ray cluster has what one worker asks ({_resources(need)}): its nodes have "
            f"{kinds}; ask for less",
        )
    workers = r.num_workers if isinstance(r.num_workers, int) else int(gpus) if gpus else len(alive)
    free = room([n.resources for n in holds], need)
    node = min(holds, key=lambda n: (n.resources.get("GPU", 0.0), n.resources.get("memory", 0.0)))
    hw = _ray_worker_hardware(r, node, need)
    source = (
        f"Ray cluster at {r.address}: {workers} worker(s) of {{{_resources(need)}}}, on "
        f"{_ray_node_words(node)}"
    )
    if free < workers:
        source += f" (room for {free} now: the job waits for the rest)"
    return Where(hw, source, nodes=workers, local=False)


def _resources(need: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in need.items())


def _ray_node_words(n: rayjobs.NodeFacts) -> str:
    cpu, gpu, mem = n.resources.get("CPU", 0.0), n.resources.get("GPU", 0.0), n.resources.get("memory", 0.0)
    gpus = f", {gpu:g} GPU(s)" + (f" ({n.labels[ACCEL]})" if n.labels.get(ACCEL) else "") if gpu else ""
    return f"{cpu:g} CPU(s){gpus} and {mem / 2**30:.1f} GiB a node"


ACCEL = "ray.io/accelerator-type"  # the label Ray gives a node from its GPUs (A100, H100, ...)


def _ray_worker_hardware(r: Any, node: rayjobs.NodeFacts, need: dict[str, float]) -> Hardware:
    cpus = max(1, int(need.get("CPU", 1.0)))
    mem = int(node.resources.get("memory", 0.0)) or 0
    try:
        disk = shutil.disk_usage(Path.cwd()).free
    except OSError:
        disk = 0
    n = int(need.get("GPU", 0.0))
    if not n:
        return Hardware(cpu_count=cpus, ram_total=mem, ram_available=mem, disk_free=disk)
    named = r.gpu or node.labels.get(ACCEL)
    if not named:
        why = "the Ray cluster's GPU nodes do not say which card they have (no accelerator label)"
        raise Unplannable(("distributed", "ray", "gpu"), f"{why}: name it with ray: gpu (e.g. A100-80GB)")
    try:
        c = card(named)
    except ValueError as e:
        why = f"the Ray nodes' GPUs are {named!r}: {e}"
        raise Unplannable(("distributed", "ray", "gpu"), f"{why}; name the card with ray: gpu") from None
    return replace(Target(f"{n}x{c.key}", 1, n, card=c).hardware(), cpu_count=cpus, ram_total=mem,
                   ram_available=mem, disk_free=disk, kernels=installed_kernels())  # fmt: skip


def partition_target(res: Resolved) -> Where:
    """One node of the SLURM partition the job goes to, as the planner sees a machine it probes: its
    GPUs (GRES; the card from the GRES type, or ``slurm: gpu`` / NBTRAIN_SLURM_GPU where the type leaves
    it open), the job's GPUs a node (``gpus_per_node``, else all the node has), its CPUs and memory. Nodes
    that differ: the smallest that can hold the job, said in the source."""
    d = res.config.distributed
    s = d.slurm
    assert s is not None
    name = s.partition
    if name is None and os.environ.get("SLURM_JOB_ID"):  # inside an allocation: its partition's nodes
        name = os.environ.get("SLURM_JOB_PARTITION") or None
    what = f"partition {name!r}" if name else "the default partition"
    try:
        part = partition.read(name)
    except partition.Unreadable as e:
        raise Unplannable(
            ("distributed", "slurm", "partition"),
            f"nbtrain cannot read SLURM's {what} to plan the job for its nodes (it never plans a SLURM job "
            f"for this machine): {e}",
        ) from None
    want = s.gpus_per_node
    fit = [n for n in part.nodes if want is None or n.gpus >= want]
    if not fit:
        most = max(n.gpus for n in part.nodes)
        have = f"at most {most} GPU(s) a node" if most else "no GPU (no gpu GRES)"
        raise Unplannable(
            ("distributed", "slurm", "gpus_per_node"),
            f"gpus_per_node: {want}, but the nodes of partition {part.name!r} have {have}: ask for "
            + (
                f"at most {most}"
                if most
                else "none (leave gpus_per_node out) or set slurm: partition to a GPU one"
            ),
        )
    procs = d.num_processes
    if want is not None and isinstance(procs, int) and procs != want:
        raise Unplannable(
            ("distributed", "num_processes"),
            f"num_processes: {procs}, but slurm: gpus_per_node: {want} GPUs a node: one process trains on "
            f"each GPU, so they must agree (or leave num_processes: auto)",
        )
    if d.nodes > len(fit):
        raise Unplannable(
            ("distributed", "nodes"),
            f"nodes: {d.nodes}, but partition {part.name!r} has {len(fit)} node(s) that can hold the job; "
            f"ask for at most {len(fit)}",
        )
    shaped = sorted((_node(part.name, n, want, s.gpu) for n in fit), key=lambda x: x[0])
    _, hw, words, node = shaped[0]
    kinds = {(n.gpus, n.gpu_type, n.cpus, n.memory_mb) for n in fit}
    many = f"{d.nodes} nodes" if d.nodes > 1 else "1 node"
    source = f"SLURM partition {part.name}: {many} of {words}"
    if len(kinds) > 1:
        listed = "; ".join(n.words() for n in fit[:4]) + ("; ..." if len(fit) > 4 else "")
        source += f"; its nodes differ ({listed}): planned for the smallest, {node.name}"
    return Where(hw, source, local=False)


def _node(
    pname: str, node: partition.Node, want: int | None, named: str | None
) -> tuple[tuple[int, ...], Hardware, str, partition.Node]:
    """(size for ordering, the node's Hardware as the job gets it, words, the node)."""
    ram = node.memory_mb * 2**20
    try:
        disk = shutil.disk_usage(Path.cwd()).free  # the runs root: storage the nodes share
    except OSError:
        disk = 0
    host = f"{node.cpus} CPU(s) and {node.memory_mb / 1024:.0f} GiB RAM a node"
    if not node.gpus:
        hw = Hardware(cpu_count=max(1, node.cpus), ram_total=ram, ram_available=ram, disk_free=disk)
        return (
            (0, 0, node.memory_mb, node.cpus),
            hw,
            f"{node.cpus} CPU(s) and {node.memory_mb / 1024:.0f} GiB RAM, no GPU (no gpu GRES)",
            node,
        )
    c, why = _card(pname, node, named)
    n = want or node.gpus
    hw = replace(
        Target(f"{n}x{c.key}", 1, n, card=c).hardware(),
        cpu_count=max(1, node.cpus), ram_total=ram, ram_available=ram, disk_free=disk,
        kernels=installed_kernels(),  # the job runs this environment's Python
    )  # fmt: skip
    words = f"{n} x {c.key} (GRES {node.gres}{why}; {c.words()}), {host}"
    return (n, c.gib, node.memory_mb, node.cpus), hw, words, node


def _card(pname: str, node: partition.Node, named: str | None) -> tuple[Card, str]:
    """The card of ``node``'s GPUs and where that came from ("" the GRES type said it)."""
    key: Key = ("distributed", "slurm", "gpu")
    given, whence = named, "slurm: gpu"
    if given is None and os.environ.get(GPU_ENV):
        given, whence = os.environ[GPU_ENV], GPU_ENV
    chosen = None
    if given is not None:
        try:
            chosen = card(given)
        except ValueError as e:
            raise Unplannable(key, f"{whence} {given!r}: {e}") from None
    if node.gpu_type is None:
        if chosen is None:
            raise Unplannable(key, (
                f"the nodes of partition {pname!r} have an untyped GPU GRES ({node.gres}), which does not "
                f"say which card they are, and the plan needs its memory: name it with slurm: gpu (e.g. "
                f"A100-80GB), or set {GPU_ENV} for every run on this cluster"
            ))  # fmt: skip
        return chosen, f"; the card from {whence}"
    try:
        typed = gres_card(node.gpu_type)
    except ValueError as e:
        if chosen is None:
            raise Unplannable(key, (
                f"the nodes of partition {pname!r} have GRES {node.gres}: {e}; name the card with slurm: gpu "
                f"(e.g. A100-80GB), or set {GPU_ENV} for every run on this cluster"
            )) from None  # fmt: skip
        family = gres_family(node.gpu_type)
        if family and not chosen.key.upper().startswith(family):
            raise Unplannable(key, (
                f"{whence} says {chosen.key}, but the nodes of partition {pname!r} have GRES {node.gres}: "
                "make them agree (or leave it out where the GRES type says the card)"
            )) from None  # fmt: skip
        return chosen, f"; the card's memory from {whence}"
    if chosen is not None and chosen != typed:
        raise Unplannable(key, (
            f"{whence} says {chosen.key}, but the nodes of partition {pname!r} have GRES {node.gres} "
            f"({typed.key}): leave it out, the GRES type says the card"
        ))  # fmt: skip
    return typed, ""


def gres_family(kind: str) -> str:
    """The card family a GRES type that does not say the memory names ("a100" -> "A100"); "" unknown."""
    norm = kind.strip().upper().replace("_", "-")
    return norm if norm in AMBIGUOUS else ""
