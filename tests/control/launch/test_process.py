"""The one spawner (nbtrain.control.launch.process), on real processes: new session, output to a log, children
collected, and a stop that signals only a process group that is still the one it started."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import pytest

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.jobs import Job
from nbtrain.contract.rundir import RunPaths
from nbtrain.control.launch import process

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
# A leader that starts a child in its own group (as a launcher starts ranks), tells its pid, and exits.
FORK_AND_EXIT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(float(sys.argv[2]))
"""


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test may leave running when it fails; killed afterwards (by pid, identity checked)."""
    pids: list[int] = []
    started = time.time()
    yield pids
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.create_time() >= started - 1:
                p.kill()
        except psutil.Error:
            continue
    process.reap()


def start(paths: RunPaths, leftovers: list[int], argv: list[str] = SLEEP) -> dict[str, Any]:
    result = process.spawn(paths, [("rank0.log", argv)], process.worker_env([]))
    assert isinstance(result, process.Launched)
    leftovers.append(result.pid)
    info = process.read_launch(paths)
    assert info is not None and info["create_time"] == result.create_time is not None
    return info


def rewrite_launch(paths: RunPaths, **fields: Any) -> dict[str, Any]:
    """launch.json as an older or a stale record would have it (``None`` removes a field)."""
    info = json.loads(paths.launch.read_text())
    for rec in [info, *info["procs"]]:
        for k, v in fields.items():
            if v is None:
                rec.pop(k, None)
            else:
                rec[k] = v(rec[k]) if callable(v) else v
    paths.launch.write_text(json.dumps(info))
    data = process.read_launch(paths)
    assert data is not None
    return data


def test_a_started_process_leads_its_own_session_with_stdin_closed_and_output_appended_to_its_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "logs" / "job.log"
    log.parent.mkdir()
    log.write_text("earlier output\n")
    code = "import os, sys; print(os.getsid(0) == os.getpid() == os.getpgid(0), repr(sys.stdin.read()))"
    first = process.start_process([sys.executable, "-c", code], log=log, cwd=tmp_path)
    assert isinstance(first, process.Launched)
    assert first.wait(60) == 0 and first.log_offset == len("earlier output\n")
    assert log.read_text() == "earlier output\nTrue ''\n"
    assert not psutil.pid_exists(first.pid)  # collected, not a zombie


def test_a_program_that_cannot_start_is_a_typed_failure_and_leaves_nothing_started(
    tmp_path: Path, leftovers: list[int]
) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    marker = f"nbtrain-test-{os.getpid()}-{time.time()}"
    ok = [sys.executable, "-c", "import time; time.sleep(120)", marker]
    result = process.spawn(paths, [("node0.log", ok), ("node1.log", [str(tmp_path / "no-such-program")])], {})
    assert isinstance(result, process.LaunchFailed) and "no-such-program" in result.reason
    assert not paths.launch.exists()

    def first_node() -> list[psutil.Process]:
        out = []
        for p in psutil.Process().children():
            try:
                if marker in p.cmdline():
                    out.append(p)
            except psutil.Error:
                continue
        return out

    leftovers.extend(p.pid for p in first_node())
    wait_until(lambda: all(p.status() == psutil.STATUS_ZOMBIE for p in first_node()))
    process.reap()
    assert first_node() == []


def test_children_that_exit_are_collected_by_the_next_liveness_check(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    result = process.spawn(paths, [("rank0.log", [sys.executable, "-c", "pass"])], {})
    assert isinstance(result, process.Launched)
    pid = result.pid
    del result  # nobody holds it but the registry
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    info = process.read_launch(paths)
    assert info is not None and not process.group_alive(info)
    assert not psutil.pid_exists(pid)
    assert pid not in process._CHILDREN


def test_stop_terminates_the_group_and_collects_its_leader(tmp_path: Path, leftovers: list[int]) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    info = start(paths, leftovers)
    assert process.group_alive(info)
    assert process.terminate_group(info, grace=10) == "terminated"
    assert not psutil.pid_exists(info["pid"])
    assert process.terminate_group(info, grace=10) == "gone"


def test_a_stop_never_signals_a_group_whose_leader_pid_was_reused(
    tmp_path: Path, leftovers: list[int]
) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    start(paths, leftovers)
    # launch.json as if it named an earlier process that had this pid: the live one is someone else's.
    stale = rewrite_launch(paths, create_time=lambda t: t - 3600)
    assert not process.group_alive(stale)
    assert not process.signal_group(stale, signal.SIGKILL)
    assert process.terminate_group(stale, grace=1) == "gone"
    assert running(stale["pid"])
    # The same record with the right start time stops it.
    current = rewrite_launch(paths, create_time=lambda t: t + 3600)
    assert process.terminate_group(current, grace=10) == "terminated"
    assert not running(current["pid"])


def test_a_record_without_create_time_signals_nothing(tmp_path: Path, leftovers: list[int]) -> None:
    """Issue 36: a record whose leader cannot be checked (pid and pgid are public; anyone can write them)
    names no live group, so no stop signals on its word."""
    paths = RunPaths(tmp_path / "run")
    paths.make()
    start(paths, leftovers)
    old = rewrite_launch(paths, create_time=None)
    assert "create_time" not in old and not process.group_alive(old)
    assert process.terminate_group(old, grace=1) == "gone"
    assert running(old["pid"])  # the process it names was not signalled


def test_the_children_of_an_exited_leader_are_stopped_unless_they_predate_the_recorded_leader(
    tmp_path: Path, leftovers: list[int]
) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    child_file = tmp_path / "child.pid"
    info = start(paths, leftovers, [sys.executable, "-c", FORK_AND_EXIT, str(child_file), "0"])
    wait_until(lambda: child_file.exists() and child_file.read_text() != "")
    child = int(child_file.read_text())
    leftovers.append(child)
    wait_until(lambda: not process.leader_alive(info))
    assert not psutil.pid_exists(info["pid"])  # the leader was collected
    assert running(child) and process.group_alive(info)  # its child keeps the run alive
    # A record whose leader started after this process cannot be its group: the number was reused.
    later = rewrite_launch(paths, create_time=psutil.Process(child).create_time() + 60)
    assert not process.group_alive(later)
    assert process.terminate_group(later, grace=1) == "gone" and running(child)
    assert process.terminate_group(info, grace=10) == "terminated"
    wait_until(lambda: not running(child))


def test_run_job_past_its_timeout_stops_the_whole_group(tmp_path: Path) -> None:
    (tmp_path / "forking_job.py").write_text(FORK_AND_EXIT)
    log, result = tmp_path / "logs" / "job.log", tmp_path / "result.json"
    child_file = tmp_path / "child.pid"
    t0 = time.monotonic()
    with pytest.raises(NbtrainError, match=r"the test job did not finish in 5 s and was stopped; see "):
        process.run_job(Job("forking_job", "a test job"), [str(child_file), "120"], log=log, result=result,
                        cwd=tmp_path, what="the test job", timeout=5)  # fmt: skip
    assert time.monotonic() - t0 < 14  # SIGTERM ended it: no wait for the 10 s grace
    child = int(child_file.read_text())
    assert not running(child)
    assert f"-m forking_job {child_file} 120" in log.read_text()  # the header of this run


def test_run_job_returns_the_result_and_names_the_log_when_there_is_none(tmp_path: Path) -> None:
    (tmp_path / "writes.py").write_text("import json, sys; json.dump({'ok': True}, open(sys.argv[1], 'w'))")
    (tmp_path / "fails.py").write_text("raise SystemExit('no result today')")
    log, result = tmp_path / "job.log", tmp_path / "result.json"
    kw: dict[str, Any] = {"log": log, "result": result, "cwd": tmp_path, "what": "the job"}
    assert process.run_job(Job("writes", "a job"), [str(result)], **kw) == (0, {"ok": True})
    with pytest.raises(
        NbtrainError, match=r"(?s)the job failed \(exit code 1\) without a result.*no result today"
    ):
        process.run_job(Job("fails", "a job"), [], **kw)


class Interrupted(Exception):
    pass


def test_an_interrupt_while_waiting_stops_the_group_and_goes_on(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if not child_file.exists() or child_file.read_text() == "":
            signal.setitimer(signal.ITIMER_REAL, 0.2)  # interrupt once the group has two processes
            return
        raise Interrupted

    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            process.run_to_end([sys.executable, "-c", FORK_AND_EXIT, str(child_file), "120"],
                               log=tmp_path / "job.log", timeout=60)  # fmt: skip
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert not running(int(child_file.read_text()))
