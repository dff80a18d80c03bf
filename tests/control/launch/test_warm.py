"""Warm start: runs forked by the warm process (nbtrain.worker.warm) are the cold runs, faster. Real
processes: the warm process, its children, cold workers side by side."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

import psutil
import pytest

import nbtrain
from nbtrain.contract import warmproto
from nbtrain.contract.rundir import atomic_write_json, read_jsonl
from nbtrain.control.launch import warm
from nbtrain.control.launch.process import read_launch
from nbtrain.ui.verbs import VERBS
from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow


def losses(run: nbtrain.Run) -> list[float]:
    return [float(r["loss"]) for r in read_jsonl(run.paths.metrics) if "loss" in r]


def wait_ready(timeout: float = 180) -> dict:
    """This kernel's warm process once it serves; one starts when none runs (the session's may have made
    room for another environment's: NBTRAIN_WARM_MAX)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [r for r in warm.status() if r["this_kernel"]]
        if rows and Path(rows[0]["socket"]).exists():
            return rows[0]
        warm.start()  # nothing when one runs or is still importing (it holds its lock)
        time.sleep(0.2)
    raise AssertionError(f"no warm process became ready: {list(warmproto.warm_dir().iterdir())}")


def forked(folder: Path, run: nbtrain.Run) -> bool:
    pid = read_launch(run.paths)["pid"]  # type: ignore[index]
    return any(f"forked {pid} for nbtrain.worker" in p.read_text() for p in folder.glob("*.log"))


def test_a_warm_run_equals_the_cold_run_step_for_step(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, warm_processes: Path
) -> None:
    wait_ready()
    cfg = lora_yaml(12, extra="  seed: 11\n")
    warm_run = nbtrain.finetune(cfg, name="warm")
    assert warm_run.wait(timeout=300).state == "completed", warm_run.logs(40)
    monkeypatch.setenv("NBTRAIN_WARM", "0")
    cold = nbtrain.finetune(cfg, name="cold")
    assert cold.wait(timeout=300).state == "completed", cold.logs(40)
    assert forked(warm_processes, warm_run) and not forked(warm_processes, cold)
    assert "cold start" not in warm_run.logs(400) and "cold start: NBTRAIN_WARM=0" in cold.logs(400)
    assert losses(warm_run) == losses(cold) and len(losses(cold)) == 12  # identical, not close
    for run in (warm_run, cold):  # the same packages left out, said the same way
        assert "not loaded (this run does not use them): bitsandbytes, scipy" in run.logs(400)


def test_runs_survive_a_kill_9_of_the_warm_process_and_the_next_start_is_cold_then_warm(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "w"  # a warm process of this test's own: the session's is not killed
    monkeypatch.setenv(warmproto.ENV_DIR, str(folder))
    assert warm.start()
    info = wait_ready()
    # What an attacker or a broken client sends is answered or dropped; the process serves on.
    path = warmproto.socket_path(info["key"])
    for junk in (b"", b"\x00\x00", struct.pack(">I", 1 << 30) + b"{", struct.pack(">I", 5) + b"[1,2]"):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            s.recv(100)
    assert os.stat(path).st_mode & 0o777 == 0o600
    text = VERBS["warm"].call(argparse.Namespace(action="status"))
    assert f"warm process {info['pid']}: " in text and "MiB held" in text and "serves this kernel" in text

    long = nbtrain.finetune(lora_yaml(100_000), name="long")
    deadline = time.monotonic() + 120
    while long.status().step < 2:
        assert time.monotonic() < deadline and not long.status().done, long.logs(40)
        time.sleep(0.1)
    assert forked(folder, long)
    os.kill(info["pid"], signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(info["pid"]).wait(10)
    step = long.status().step
    deadline = time.monotonic() + 60
    while long.status().step < step + 3:  # it trains on without its parent
        assert time.monotonic() < deadline and long.status().state == "running", long.logs(40)
        time.sleep(0.1)
    assert long.stop().state == "stopped"

    cold = nbtrain.finetune(lora_yaml(2), name="after-kill")  # the socket is dead: cold, and a new one starts
    assert cold.wait(timeout=300).state == "completed"
    assert "cold start: no warm process was running yet" in cold.logs(400)
    again = wait_ready()
    assert again["pid"] != info["pid"]
    warm_again = nbtrain.finetune(lora_yaml(2), name="warm-again")
    assert warm_again.wait(timeout=300).state == "completed" and forked(folder, warm_again)
    assert warm.stop() == 1


def test_what_the_warm_process_cannot_serve_is_answered_cold_with_the_reason(tmp_path: Path) -> None:
    from nbtrain.worker import warm as server

    key = warmproto.env_key(os.environ)
    stamp = server.stamp()
    run = tmp_path / "run"
    run.mkdir()
    atomic_write_json(run / "resolved.json", {"config": {"method": "qlora"}, "train_args": {}})
    request = {"argv": [sys.executable, "-m", "nbtrain.worker", str(run)], "cwd": str(tmp_path),
               "env": dict(os.environ)}  # fmt: skip
    hidden = {"bitsandbytes": None, "scipy": None}
    saved = {n: sys.modules.get(n, 0) for n in hidden}
    sys.modules.update(hidden)  # as in the warm process
    try:
        assert server.refusal(request, key, stamp) == (
            "the run uses bitsandbytes, which the warm process leaves out"
        )
        remote = {"config": {"method": "lora", "trust_remote_code": True}, "train_args": {}}
        atomic_write_json(run / "resolved.json", remote)
        assert server.refusal(request, key, stamp) == "the run uses scipy, which the warm process leaves out"
        atomic_write_json(run / "resolved.json", {"config": {"method": "lora"}, "train_args": {}})
        assert server.refusal(request, key, stamp) is None
    finally:
        for n, v in saved.items():
            if v == 0:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = v
    other = {**request, "env": {**os.environ, "HF_HUB_CACHE": "/elsewhere"}}
    assert "environment differs" in str(server.refusal(other, key, stamp))
    gpus = {**request, "env": {**os.environ, "CUDA_VISIBLE_DEVICES": "3"}}  # read after the fork: served
    assert server.refusal(gpus, key, stamp) is None
    assert "changed since" in str(server.refusal(request, key, stamp + "x"))
    assert "not served warm" in str(
        server.refusal({**request, "argv": [sys.executable, "-m", "os"]}, key, stamp)
    )


def test_the_eval_and_preview_jobs_fork_warm_and_give_what_cold_ones_do(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, warm_processes: Path
) -> None:
    def forks() -> tuple[int, int]:
        logs = "".join(p.read_text() for p in warm_processes.glob("*.log"))
        return logs.count("for nbtrain.worker.jobs.evaluate"), logs.count("for nbtrain.worker.jobs.preview")

    wait_ready()
    run = nbtrain.finetune(lora_yaml(4), name="to-eval")
    assert run.wait(timeout=300).state == "completed", run.logs(40)
    before = forks()
    warm_report = nbtrain.evaluate(run, compare_base=True, file="data/add.jsonl", limit=16)
    warm_preview = nbtrain.preview(run, n=2).data
    assert forks() == (before[0] + 1, before[1] + 1)
    monkeypatch.setenv("NBTRAIN_WARM", "0")
    cold_report = nbtrain.evaluate(run, compare_base=True, file="data/add.jsonl", limit=16)
    cold_preview = nbtrain.preview(run, n=2).data
    assert forks() == (before[0] + 1, before[1] + 1)  # the cold ones were not forked
    assert warm_report.models == cold_report.models and set(cold_report.models) == {"base", "tuned"}
    assert warm_preview == cold_preview


def test_a_warm_process_stopped_while_it_still_imports_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test session (or a kernel) that ends within seconds of starting one must not leave it to idle out."""
    monkeypatch.setenv(warmproto.ENV_DIR, str(tmp_path / "warm"))
    assert warm.start()
    folder = warmproto.warm_dir()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(p.read_text() for p in folder.glob("*.lock")):
        time.sleep(0.05)  # the lock names its holder as soon as it is taken, before the imports
    assert not warm.status()  # not ready yet: only its lock says it is there
    pid = int(next(folder.glob("*.lock")).read_text().split()[0])
    assert warm.stop() == 1
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=10)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
