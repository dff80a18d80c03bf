"""Process identity across a step of the wall clock (hardware/clock.py): psutil's create_time moves with
the clock, the start since boot does not, so nbtrain's own processes stay recognised (and a reused pid
still does not pass)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from psutil import _pslinux

from nbtrain.control.launch import process
from nbtrain.hardware.clock import same_start, start_record, started_before


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def _step_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """What a step of the wall clock does to psutil: /proc/stat's btime (now - uptime) moves with it."""
    real = _pslinux.boot_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real + seconds)
    monkeypatch.setattr(psutil, "boot_time", lambda: real + seconds)


def test_a_process_is_recognised_after_the_clock_steps(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = {"pid": child.pid, "pgid": child.pid, **start_record(psutil.Process(child.pid))}
    assert process.leader_alive(rec) and process.group_alive(rec)
    _step_clock(monkeypatch, 2.5)
    fresh = psutil.Process(child.pid)
    assert abs(fresh.create_time() - rec["create_time"] - 2.5) < 0.01  # psutil's figure moved ...
    assert same_start(fresh, rec["create_time"], rec["boot_time"])  # ... its start since boot did not
    assert not same_start(fresh, rec["create_time"])  # a record without its boot time: the old failure
    assert process.leader_alive(rec) and process.group_alive(rec)  # still ours: alive, stoppable


def test_a_reused_pid_still_fails_the_check(child: subprocess.Popen[bytes]) -> None:
    p = psutil.Process(child.pid)
    rec = start_record(p)
    earlier = rec["create_time"] - 1.0  # the record of a process that started a second before this one
    assert not same_start(p, earlier, rec["boot_time"])
    assert started_before(psutil.Process(child.pid), rec["create_time"] + 1.0, rec["boot_time"])
    assert not started_before(psutil.Process(child.pid), rec["create_time"], rec["boot_time"])
