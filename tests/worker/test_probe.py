"""Only probe runs measure what their ranks hold: a user's run trains without the optimizer-step meter."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.rundir import read_json, read_jsonl
from nbtrain.control.start import probe
from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow


def train_end(run_dir: Path) -> dict:
    (end,) = [r for r in read_jsonl(run_dir / "system.jsonl") if r.get("event") == "train_end"]
    return end


def test_a_probe_run_samples_every_optimizer_step_and_a_user_run_installs_no_meter(workdir: Path) -> None:
    user = nbtrain.finetune(lora_yaml(3), name="user")  # trains while the probe below runs
    report = probe(lora_yaml(20), name="fit", steps=3)
    assert user.wait(timeout=300).state == "completed", user.logs(40)
    assert report.run.status().state == "completed", report.run.logs(40)

    assert read_json(report.run.paths.resolved)["probe"] is True
    measured = train_end(report.run.dir)
    assert measured["state_samples"] >= 3 and "state_error" not in measured, measured
    assert measured["model_state_bytes"] > 0

    assert read_json(user.paths.resolved)["probe"] is False
    plain = train_end(user.dir)
    assert plain["state_samples"] == 0, plain  # no hook ran in the optimizer step
    assert plain["model_state_bytes"] > 0  # the end report still says what the rank holds
