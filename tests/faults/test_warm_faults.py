"""One writer per run directory however the warm process behaves (issue 36): a warm process stopped past
its client's patience forks nothing for it later, and a second worker on a training run directory trains
nothing, even when it was handed the run's lock. Checked by the locks and by the metrics (no step twice)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.rundir import RUN_LOCK_ENV, read_jsonl
from tests.conftest import lora_yaml
from tests.control.launch.test_warm import wait_ready


def steps(run: nbtrain.Run) -> list[int]:
    return [int(r["step"]) for r in read_jsonl(run.paths.metrics) if "loss" in r]


def wait_for_step(run: nbtrain.Run, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while run.status().step < step:
        assert not run.status().done, run.logs(30)
        assert time.monotonic() < deadline, run.logs(30)
        time.sleep(0.2)


def test_a_warm_process_stopped_past_the_clients_patience_forks_nothing_for_it_later(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, warm_processes: Path
) -> None:
    from nbtrain.control.launch import warmclient

    ready = wait_ready()
    monkeypatch.setattr(warmclient, "REPLY_TIMEOUT", 2.0)
    os.kill(ready["pid"], signal.SIGSTOP)  # it takes the connection (the kernel's backlog), answers nothing
    try:
        run = nbtrain.finetune(lora_yaml(40), name="stalled-warm")
    finally:
        os.kill(ready["pid"], signal.SIGCONT)  # now it reads the request its client gave up on
    assert "cold start: the warm process did not answer" in run.paths.rank_log(0).read_text()
    assert run.wait(timeout=300).state == "completed", run.logs(30)
    logs = "".join(p.read_text() for p in warm_processes.glob("*.log"))
    deadline = time.monotonic() + 30
    while "the client gave up" not in logs and time.monotonic() < deadline:
        time.sleep(0.2)
        logs = "".join(p.read_text() for p in warm_processes.glob("*.log"))
    assert f"the client gave up; not forking for nbtrain.worker {run.dir}" in logs
    assert f"for nbtrain.worker {run.dir}" not in logs.replace("not forking for", "")  # nothing forked
    assert steps(run) == list(range(1, 41))  # one writer: each step once


def test_a_second_worker_handed_the_runs_lock_trains_nothing(workdir: Path) -> None:
    run = nbtrain.finetune(lora_yaml(100_000), name="one-writer")  # trains until stopped
    wait_for_step(run, 2)
    fd = os.open(run.paths.lock, os.O_RDONLY)  # anyone who can open the lock file can name it as handed
    try:
        began = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "nbtrain.worker", str(run.dir)], env={**os.environ, RUN_LOCK_ENV: str(fd)},
            pass_fds=(fd,), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(fd)
    assert second.returncode == 3 and "being trained by another process" in second.stderr
    assert time.monotonic() - began < 60
    st = run.stop(timeout=60)
    assert st.state == "stopped"
    done = steps(run)
    assert len(done) == len(set(done)) and done == sorted(done)  # nobody wrote a step twice


def test_a_client_that_trickles_its_request_holds_up_no_other_start(
    workdir: Path, warm_processes: Path
) -> None:
    import socket

    ready = wait_ready()
    trickler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    trickler.connect(ready["socket"])  # the same user: it passes the peer check, then sends a byte at a time
    stop = time.monotonic() + 60

    def trickle() -> None:
        with contextlib.suppress(OSError):
            trickler.send((1000).to_bytes(4, "big"))  # a request of 1000 bytes is coming...
            while time.monotonic() < stop:  # ...a byte every half second
                trickler.send(b"\x00")
                time.sleep(0.5)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    time.sleep(0.5)  # the warm process is reading the trickler's request now
    cut_off = "did not arrive within 2 s; the connection is closed"

    def logs() -> str:
        return "".join(p.read_text() for p in warm_processes.glob("*.log"))

    try:
        run = nbtrain.finetune(lora_yaml(4), name="beside-a-trickler")
        assert "cold start" not in run.paths.rank_log(0).read_text()  # forked warm, not waited out
        assert run.wait(timeout=300).state == "completed", run.logs(30)
        # still trickling (a warm run of 4 steps can end within the trickler's 2 s): it is cut off then
        deadline = time.monotonic() + 30
        while cut_off not in logs() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop = 0.0
        trickler.close()
    assert cut_off in logs()


def test_forty_starts_at_once_beside_a_stalled_client_are_all_forked_warm_without_waiting_for_it(
    tmp_path: Path, warm_processes: Path
) -> None:
    """The warm process reads many clients at once: a client that connected and went quiet costs the
    others nothing (one thread answered in turn, it held every start for its 2 s), and 40 starts at once
    are all forked warm, none turned away as busy or cold."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from nbtrain.control.launch import process, warmclient

    ready = wait_ready()
    env = {**os.environ, **process.job_env()}  # as the spawner asks: the warm process's environment
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.preview"]  # no arguments: it exits at once
    log = open(tmp_path / "jobs.log", "ab")  # noqa: SIM115 - shared by the threads below

    def start() -> tuple[object, float]:
        t = time.monotonic()
        got = warmclient.try_warm(argv, log_fd=log.fileno(), cwd=tmp_path, env=env, pass_fds=())
        return got, time.monotonic() - t

    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stalled.connect(ready["socket"])
        stalled.send((1000).to_bytes(4, "big"))  # a request of 1000 bytes is coming... and nothing more
        time.sleep(0.2)  # it is being read now
        first, took = start()
        assert isinstance(first, warmclient.WarmChild), first
        assert took < 1.5, f"the start waited {took:.1f} s for the stalled client"
        with ThreadPoolExecutor(40) as pool:
            results = list(pool.map(lambda _: start()[0], range(40)))
    finally:
        stalled.close()
        log.close()
    cold = [r for r in results if not isinstance(r, warmclient.WarmChild)]
    assert cold == [] and len({r.pid for r in results}) == 40  # type: ignore[union-attr]


def test_a_passed_descriptor_asked_for_under_any_number_is_forked_warm(
    tmp_path: Path, warm_processes: Path
) -> None:
    """A child places the descriptors it was passed under the numbers its client asked for. One of those
    numbers may be the one its ready pipe has in the warm process: that start was answered "did not start"
    while the child trained on, so the cold start beside it found the run's lock held (seen in CI). Every
    number from 3 to 40 is asked for here, so whatever the pipe's number, one request names it."""
    import socket

    from nbtrain.contract import warmproto
    from nbtrain.control.launch import process

    ready = wait_ready()
    env = {**os.environ, **process.job_env()}
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.preview"]  # no arguments: it exits at once
    answers: dict[int, dict] = {}
    with open(tmp_path / "jobs.log", "ab") as log, open(tmp_path / "passed", "wb") as passed:

        def ask(numbers: list[int]) -> dict:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(ready["socket"])
                request = {"argv": argv, "cwd": str(tmp_path), "env": env, "fds": numbers}
                warmproto.send_request(s, request, [log.fileno()] + [passed.fileno()] * len(numbers))
                s.settimeout(30)
                return warmproto.recv_reply(s)

        for number in range(3, 41):
            answers[number] = ask([number])
        too_high, twice = ask([1000]), ask([5, 5])
    assert {n: a for n, a in answers.items() if "pid" not in a} == {}
    assert "not all from 3 to 999" in too_high["cold"] and "asked for twice" in twice["cold"]
