"""The one shape of a preset rule and the one collector that runs them.

A rule is a function ``(preset, ctx) -> Iterable[Item]``: one preset of those in force, and what its stage
knows, to the problems it finds as (key path, message) pairs. Each stage lists its rules in the order
their problems are said and has a context of its own:

    stage       context    rules                                        run by
    config      Written    configrules.CONFIG (slurmrules' among them)  load_config, check_resumed
    plan        Planned    planrules.PLAN, then planrules.TRAIN_ARGS    prepare (TRAIN_ARGS: resume too)
    start       Queued     planrules.START                              start, for a SLURM run

Every preset in force (``Preset.chain()``) is checked on its own, so a config passes only when it passes
them all. The contexts are plain values: the preset sits below the planner and the runs (control.plan,
control.runs), which hand it what they found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from nbtrain.control.config.preset.model import Preset
    from nbtrain.control.config.schema import Resolved, RunConfig

Item = tuple[tuple[str | int, ...], str]  # (key path, message), as config.problems_error takes
Items = list[Item]
C = TypeVar("C")
Rule = Callable[["Preset", C], Iterable[Item]]


def collect(presets: Iterable[Preset], rules: Sequence[Rule[C]], ctx: C) -> Items:
    """Every rule of a stage over ``ctx``, for each preset on its own, in the order listed."""
    return [item for p in presets for rule in rules for item in rule(p, ctx)]


def not_allowed(p: Preset, rule: str, what: str, value: Any, allowed: Sequence[Any]) -> str:
    """The message for ``value`` outside the allow-list ``rule`` (also for values the planner chose)."""
    return (
        f"{what} {value!r} is not allowed by {p.where} (rule '{rule}'); "
        f"allowed: {', '.join(map(str, allowed))}"
    )


@dataclass(frozen=True)
class Written:
    """The config stage's context: the config as parsed (after ``Preset.fill``), and the folder its
    relative paths start from."""

    raw: Mapping[Any, Any]
    base: Path

    @property
    def train(self) -> Mapping[Any, Any]:
        train = self.raw.get("train")
        return train if isinstance(train, dict) else {}

    @property
    def dist(self) -> Mapping[Any, Any]:
        dist = self.raw.get("distributed")
        return dist if isinstance(dist, Mapping) else {}

    @property
    def slurm(self) -> Mapping[Any, Any]:
        slurm = self.dist.get("slurm")
        return slurm if isinstance(slurm, Mapping) else {}


@dataclass(frozen=True)
class Planned:
    """The plan stage's context: what the planner made of the config, as plain values."""

    config: RunConfig  # as the user gave it: what it left to auto is still auto
    resolved: Resolved  # its data sources (evaluation rows are counted from them)
    method: str  # as planned
    strategy: str
    device: str  # cpu | cuda | mps | npu, as planned
    world_size: int  # training processes in all
    per_device_bytes: int | None  # the memory estimate's; None when none could be made
    train_args: Mapping[str, Any]  # what the run trains with


@dataclass
class Queued:
    """The start stage's context: this user's runs queued or running on the cluster ("NAME (SLURM job
    ID)"), listed when a rule first asks (``lister`` reads every run's status)."""

    lister: Callable[[], list[str]]

    @cached_property
    def runs(self) -> list[str]:
        return self.lister()
