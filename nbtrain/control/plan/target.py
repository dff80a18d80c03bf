"""Which hardware a run is planned for: the pipeline's facts stage names its source.

- this machine (``hardware.probe()``), as before;
- hardware the user names (``on="8xA100-40GB"``, ``2x8xH100-80GB``: ``hardware/named.py``), from anywhere;
- a SLURM partition's nodes, for a config with ``distributed: slurm:`` (the notebook on a login node plans
  for the compute nodes, never for itself: ``partition_target``).

The planner, the memory estimate and the fit rule then see that hardware exactly as a machine's probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbtrain.control.config.schema import Resolved
from nbtrain.hardware import Hardware
from nbtrain.hardware import probe as probe_hardware
from nbtrain.hardware.named import Target, parse


@dataclass(frozen=True)
class Where:
    """The hardware one node of the run has, and where that fact comes from."""

    hardware: Hardware
    source: str  # for a person: "this machine", "named hardware: 8 x A100-40GB (...)", "SLURM partition ..."
    nodes: int | None = None  # nodes the source fixes (named "2x8x..."); None: the config's
    local: bool = True  # the facts of the machine the notebook sits on (probed, or given for it)


def named_target(on: str) -> Where:
    """``on``, hardware the user names; ValueError saying what was not understood."""
    t: Target = parse(on)
    return Where(t.hardware(), f"named hardware: {t.words()}", nodes=t.nodes if t.nodes > 1 else None,
                 local=False)  # fmt: skip


def where_to_plan(res: Resolved, hardware: Hardware | None, on: str | None) -> Where:
    """The hardware ``res`` is planned for: ``hardware`` as given (tests, the plan table), ``on`` named,
    else this machine."""
    if hardware is not None:
        return Where(hardware, "the hardware given")
    if on is not None:
        return named_target(on)
    return Where(probe_hardware(), "this machine")
