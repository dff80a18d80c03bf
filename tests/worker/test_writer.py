"""The writer thread: run-directory writes leave the training thread, in order, drained before a final
status."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from nbtrain.contract.rundir import RunPaths, read_json, write_status
from nbtrain.worker import writer


def test_writes_happen_in_order_off_the_calling_thread_and_drain_waits_for_them() -> None:
    seen: list[tuple[int, str]] = []
    gate = threading.Event()
    writer.submit(gate.wait, 5)  # a write that hangs (a busy disk's fsync) until released
    t0 = time.monotonic()
    for i in range(100):
        writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert time.monotonic() - t0 < 1.0 and seen == []  # queued, not done: the caller never waited
    assert writer.drain(timeout=0.2) is False  # still held by the hung write: bounded, not forever
    gate.set()
    assert writer.drain() is True
    assert [i for i, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"nbtrain-writer"}


def test_a_failed_write_is_reported_and_later_writes_still_happen(capfd) -> None:  # type: ignore[no-untyped-def]
    out: list[int] = []
    writer.submit(lambda: 1 / 0)
    writer.submit(out.append, 1)
    assert writer.drain()
    assert out == [1]
    assert "a run-directory write failed: ZeroDivisionError" in capfd.readouterr().err


def test_a_queued_running_status_never_lands_after_the_final_one(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.root.mkdir(exist_ok=True)
    for step in range(50):
        writer.submit(write_status, paths, "running", step=step)
    writer.drain()
    write_status(paths, "completed", step=50)
    time.sleep(0.05)
    assert read_json(paths.status)["state"] == "completed"


def test_a_steps_row_is_on_disk_before_the_checkpoint_of_that_step_is_written(tmp_path: Path) -> None:
    """A kill after the Trainer's last checkpoint file and before on_save leaves a whole, unmarked
    checkpoint that resume takes (it then logs from the next step): so on_log of a step that saves must
    not leave its row queued behind the writer's round (seen in CI: step 14 of 200 missing)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from nbtrain.contract.rundir import read_jsonl
    from nbtrain.worker.callbacks import RunDirCallback
    from nbtrain.worker.control import StopControl

    paths = RunPaths(tmp_path)
    paths.make()
    cb = RunDirCallback(paths, StopControl(paths))
    cb._open()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    gate = threading.Event()
    for step, save in ((1, False), (2, True)):
        writer.submit(gate.wait, 0.15)  # the writer busy with a slow write, as on a loaded machine
        state = TrainerState(global_step=step, epoch=0.1 * step)
        cb.on_log(args, state, TrainerControl(should_save=save), logs={"loss": 1.0 / step})
        logged = [r["step"] for r in read_jsonl(paths.metrics) if "loss" in r]
        if save:  # the row is on disk when on_log returns, before the Trainer writes the checkpoint
            assert logged == [1, 2], logged
    gate.set()
    writer.drain()
