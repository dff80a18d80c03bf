"""The nbtrain command line, run as a user would (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lora_yaml


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbtrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dry_run_prints_the_plan_and_starts_nothing(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml())
    p = cli("run", "c.yaml", "--dry-run", "--name", "clidry")
    assert p.returncode == 0, p.stderr
    assert "nbtrain dry run: clidry" in p.stdout and "train args (SFTConfig)" in p.stdout
    assert cli("ls").stdout.strip() == "no runs yet"


def test_bad_config_exits_2_with_the_problems(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml().replace("method: lora", "method: lorra"))
    p = cli("run", "c.yaml")
    assert p.returncode == 2
    assert "did you mean 'lora'" in p.stderr and "line 2" in p.stderr


@pytest.mark.slow
def test_run_wait_ls_status_logs(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml(5))
    p = cli("run", "c.yaml", "--name", "clirun", "--wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "completed (step 5/5)" in p.stdout and "output:" in p.stdout
    ls = cli("ls").stdout
    assert "clirun" in ls and "completed" in ls
    assert "completed" in cli("status", "clirun").stdout
    assert "nbtrain worker: completed" in cli("logs", "clirun", "-n", "3").stdout
    assert cli("wait", "clirun").returncode == 0
    missing = cli("status", "nope")
    assert missing.returncode == 1 and "no run matches 'nope'" in missing.stderr


def test_export_and_eval_refuse_a_run_without_trained_weights(tuned_run: Path, workdir: Path) -> None:
    import shutil

    run = workdir / "untrained"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("checkpoints", "output"))
    p = cli("export", str(run), "--to", "out")
    assert p.returncode == 1 and "no trained weights" in p.stderr and not (workdir / "out").exists()
    p = cli("eval", str(run), "--compare-base")
    assert p.returncode == 1 and "no trained weights" in p.stderr and not (run / "eval").exists()
