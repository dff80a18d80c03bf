"""The preset's rules as units: one shape per stage, run by one collector, the plan stage's over plain
values (no planner), and the start stage's tightest cap. The rules' behaviour through prepare and start
is test_preset.py's and the faults'."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from nbtrain.control.config.load import load_config
from nbtrain.control.config.preset import Planned, Preset, Queued, plan_problems, start_refusal
from nbtrain.control.config.preset.configrules import CONFIG
from nbtrain.control.config.preset.planrules import PLAN, START, TRAIN_ARGS
from tests.conftest import lora_yaml


def rules(**given: object) -> Preset:
    return Preset.model_validate(given)


def test_every_stage_lists_rules_of_one_shape_each_once() -> None:
    every: list[Callable[..., object]] = [*CONFIG, *PLAN, *TRAIN_ARGS, *START]
    assert len({r.__name__ for r in every}) == len(every)
    assert all(list(inspect.signature(r).parameters) == ["p", "c"] for r in every)


def test_plan_rules_read_what_the_planner_chose_as_plain_values(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    res = load_config(lora_yaml(5, method="auto"))
    preset = rules(methods=["lora"], max_processes=2, max_memory_gb=1.0, source=workdir / "lab.yaml")
    planned = Planned(res.config, res, "full", "none", "cpu", 4, 3 * 2**30, {})
    items = plan_problems(preset, planned)
    assert [path for path, _ in items] == [("distributed", "num_processes"), ("method",), ()]
    assert "4 training processes (chosen by num_processes: auto)" in items[0][1]
    assert "method (chosen by method: auto) 'full' is not allowed" in items[1][1]
    assert "about 3.00 GiB per device (estimate), over the 1 GiB cap" in items[2][1]
    given = Planned(res.config.model_copy(update={"method": "full"}), res, "full", "none", "cpu", 1, None, {})
    [(path, message)] = plan_problems(preset, given)  # method given, one process: no estimate to cap
    assert path == ("model",) and "no memory estimate could be made for" in message


def test_the_tightest_runs_at_once_cap_speaks_and_runs_are_listed_only_under_one() -> None:
    asked: list[int] = []

    def lister() -> list[str]:
        asked.append(1)
        return ["first (SLURM job 7)"]

    loose = rules(max_runs_at_once=3, source=Path("/loose/nbtrain.lab.yaml"))
    tight = rules(max_runs_at_once=1, source=Path("/tight/nbtrain.lab.yaml"))
    loose._also = [tight]
    refusal = start_refusal(loose, Queued(lister))
    assert refusal is not None and refusal.startswith("not started: the lab preset /tight/nbtrain.lab.yaml ")
    assert "allows 1 run(s) on the cluster at once" in refusal and asked == [1]  # listed once
    assert start_refusal(rules(), Queued(lister)) is None and asked == [1]  # no cap: no run read
