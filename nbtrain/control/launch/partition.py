"""A SLURM partition's nodes as ``scontrol`` shows them: CPUs, memory and GPUs (GRES), so a notebook on a
login node can plan a job for the compute nodes instead of for itself.

    read("gpu")  # -> Partition(name="gpu", nodes=(Node("g1", cpus=64, memory_mb=512000, gpus=4,
                 #                                      gpu_type="a100", gres="gpu:a100:4(S:0-1)"), ...))
    read(None)   # the cluster's default partition (Default=YES), where sbatch sends a job that names none

Two calls (``scontrol -o show partition NAME``, then ``scontrol -o show node NODES``), argv lists, each
bounded by ``TIMEOUT_S``. What cannot be read -- no scontrol here, a partition SLURM does not know, a
controller that does not answer -- raises ``Unreadable`` with the cause and the fix in its message. Only
facts: which card a GRES type is (and what "a100" leaves open) is the planner's (control/plan/target.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 15.0
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=(\S*)")


class Unreadable(Exception):
    """The partition's nodes could not be read; the message says why and what to do."""


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int  # RealMemory: what SLURM may give jobs on the node, in MiB
    gres: str  # as SLURM shows it: "gpu:a100:4(S:0-1)", "gpu:4", "" (none)
    gpus: int = 0
    gpu_type: str | None = None  # the GRES type ("a100"); None: untyped ("gpu:4") or no GPU

    def words(self) -> str:
        gpus = f"{self.gpus} GPU(s) (GRES {self.gres}), " if self.gpus else ""
        return f"{self.name}: {gpus}{self.cpus} CPUs, {self.memory_mb / 1024:.0f} GiB"


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[Node, ...]


def gpu_gres(gres: str) -> tuple[int, str | None]:
    """GPUs and their type in a node's GRES: "gpu:a100:4(S:0-1)" -> (4, "a100"), "gpu:4" -> (4, None),
    "gpu:a100:2,gpu:a100:2,shard:8" -> (4, "a100"); types that differ -> the first one."""
    count, kind = 0, None
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = [p for p in item.strip().split(":") if p and p != "no_consume"]
        if not parts or parts[0] != "gpu":
            continue
        n = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
        typed = parts[1] if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()) else None
        count += n
        kind = kind or typed
    return count, kind


def _fields(line: str) -> dict[str, str]:
    return {k: v for k, v in _FIELD.findall(line)}


def _number(value: str) -> int:
    m = re.match(r"\d+", value or "")
    return int(m.group()) if m else 0


def _scontrol(*args: str) -> str:
    exe = shutil.which("scontrol")
    if exe is None:
        raise Unreadable(
            "scontrol is not on PATH here, so nbtrain cannot read the partition's nodes to plan for them: "
            "start the notebook where SLURM's commands work (the cluster's login node), or plan for "
            "hardware you name instead (nbtrain.estimate(config, on='2x4xA100-80GB'))"
        )
    argv = [exe, "-o", *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise Unreadable(
            f"scontrol {' '.join(args)} did not answer within {TIMEOUT_S:g} s: check that SLURM answers "
            "here (sinfo), then try again"
        ) from None
    except OSError as e:
        raise Unreadable(f"scontrol could not run: {e}") from None
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip().splitlines()
        raise Unreadable(f"scontrol {' '.join(args)} failed: {said[0] if said else f'exit {r.returncode}'}")
    return r.stdout


def read(name: str | None) -> Partition:
    """The nodes of partition ``name`` (None: the default partition); ``Unreadable`` saying why not."""
    try:
        out = _scontrol("show", "partition", *([name] if name else []))
    except Unreadable as e:
        if name and "not found" in str(e).lower():
            known = [_fields(x).get("PartitionName", "") for x in _scontrol("show", "partition").splitlines()]
            raise Unreadable(
                f"SLURM has no partition {name!r}; set slurm: partition to one it has: "
                f"{', '.join(k for k in known if k) or '(none)'}"
            ) from None
        raise
    parts = [_fields(x) for x in out.splitlines() if x.strip()]
    if name is None:
        parts = [p for p in parts if p.get("Default") == "YES"]
        if not parts:
            raise Unreadable("SLURM has no default partition: name one with slurm: partition")
    if not parts:
        raise Unreadable(f"scontrol showed nothing for partition {name!r}")
    part = parts[0]
    pname, hosts = part.get("PartitionName", name or ""), part.get("Nodes", "")
    if hosts in ("", "(null)"):
        raise Unreadable(f"SLURM's partition {pname!r} has no nodes; set slurm: partition to one that has")
    lines = _scontrol("show", "node", *([] if hosts == "ALL" else [hosts])).splitlines()
    nodes = []
    for line in lines:
        f = _fields(line)
        if not f.get("NodeName"):
            continue
        gres = "" if f.get("Gres", "(null)") == "(null)" else f["Gres"]
        gpus, kind = gpu_gres(gres)
        cpus = _number(f.get("CPUTot", "")) or _number(f.get("CPUEfctv", ""))
        nodes.append(Node(f["NodeName"], cpus, _number(f.get("RealMemory", "")), gres, gpus, kind))
    if not nodes:
        raise Unreadable(f"scontrol showed none of partition {pname!r}'s nodes ({hosts})")
    return Partition(pname, tuple(nodes))
