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
