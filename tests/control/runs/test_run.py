"""Run handles: stop, lost-run detection, lookup. Real worker processes on the tiny model."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import RunNotFound
from nbtrain.control.launch import process
from tests.conftest import lora_yaml

LONG = lora_yaml(100_000).replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000")


def wait_for(cond, timeout: float = 120.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def group_gone(run: nbtrain.Run) -> bool:
    info = process.read_launch(run.paths)
    assert info is not None
    return not process.group_members(int(info["pgid"]))


@pytest.mark.slow
def test_stop_while_training_saves_a_checkpoint_and_leaves_no_process(workdir: Path) -> None:
    run = nbtrain.finetune(LONG, name="long")
    wait_for(lambda: run.status().step >= 3, what="training steps")
    st = run.stop(timeout=60)
    assert st.state == "stopped"
    assert group_gone(run)
    ckpts = list(run.paths.checkpoints.glob("checkpoint-*"))
    assert len(ckpts) == 1 and (ckpts[0] / "adapter_model.safetensors").exists()
    assert int(ckpts[0].name.split("-")[1]) == st.step


@pytest.mark.slow
def test_stop_during_startup_ends_the_run_before_training(workdir: Path) -> None:
    run = nbtrain.finetune(LONG, name="early")
    st = run.stop(timeout=60)
    assert st.state == "stopped" and st.step == 0
    assert group_gone(run)


@pytest.mark.slow
def test_run_killed_without_final_state_reads_as_failed_lost(workdir: Path) -> None:
    run = nbtrain.finetune(LONG, name="killed")
    wait_for(lambda: run.status().state == "running", what="running")
    info = process.read_launch(run.paths)
    assert info is not None
    os.killpg(int(info["pgid"]), signal.SIGKILL)
    wait_for(lambda: group_gone(run), what="group gone")
    st = run.status()
    assert st.state == "failed" and st.error is not None and st.error["type"] == "lost"
    # Persisted, so every other reader sees the same.
    assert nbtrain.get_run(run.id).status().state == "failed"


def test_get_run_by_name_prefix_and_dir(workdir: Path) -> None:
    prep = nbtrain.prepare(lora_yaml(1), name="lookup")
    from nbtrain.control.runs.run import create_run_dir

    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict())
    assert nbtrain.get_run("lookup") == run
    assert nbtrain.get_run(run.id[:12]) == run
    assert nbtrain.get_run(str(run.dir)) == run
    assert run.status().state == "queued"
    # its repr names what to type for its state (no variable the reader may not have), and no state
    assert repr(run) == f"<Run 'lookup' {run.id} — %finetune status lookup for its state>"
    assert "<code>%finetune status lookup</code> for its state" in run._repr_html_()
    with pytest.raises(RunNotFound, match="no run matches 'nope'"):
        nbtrain.get_run("nope")
    assert [r.id for r in nbtrain.runs()] == [run.id]
    # A queued run that never launched can still be stopped cleanly.
    assert run.stop().state == "stopped"


def test_wait_returns_once_the_runs_processes_have_exited(workdir: Path) -> None:
    """What a finished run held (a GPU's memory) is free when wait() returns: the next cell's plan must not
    count it as another process's (on an H200 a finishing run's 77 GiB turned checkpointing on)."""
    run = nbtrain.finetune(lora_yaml(3), name="exits")
    assert run.wait(timeout=300).state == "completed"
    info = process.read_launch(run.paths)
    assert info is not None and not process.group_alive(info)
