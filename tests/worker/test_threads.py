"""A one-process CPU run keeps a torch thread per core other processes leave free, and follows the load as
it changes: real busy processes beside it, the machine's real CPU accounting (nbtrain/worker/threads.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from nbtrain.worker.threads import CpuThreads, follower
from tests.conftest import runs_in

pytestmark = pytest.mark.skipif((psutil.cpu_count() or 1) < 2, reason="needs two cores to leave one free")


@contextmanager
def busy_core() -> Iterator[None]:
    """One process that keeps one core busy (at normal priority) until the block ends."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        p.kill()
        p.wait()


def look(t: CpuThreads, seconds: float = 1.5) -> int:
    t.target()  # a window that starts now
    time.sleep(seconds)
    n = t.target()
    assert n is not None
    return n


def test_a_busy_core_leaves_one_thread_and_the_count_comes_back_when_it_is_free() -> None:
    cores = psutil.cpu_count() or 1
    t = CpuThreads(cores)
    with busy_core():
        assert look(t) <= cores - 1
        assert t.others > 0.7
    # free again; a busy test machine may take a while to be (another test's processes winding down)
    deadline = time.monotonic() + 30
    while look(t) < cores:
        assert time.monotonic() < deadline, (
            f"{t.others:.2f} cores still busy 30 s after the busy process ended"
        )


def test_the_share_a_sweep_gave_is_the_most_and_one_thread_the_least() -> None:
    assert look(CpuThreads(1)) == 1
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(psutil.cpu_count() or 1)
    ]
    try:
        time.sleep(0.5)
        assert look(CpuThreads(64)) == 1
    finally:
        for p in hogs:
            p.kill()
            p.wait()


def test_only_one_process_runs_on_a_cpu_follow_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu = {"device": "cpu", "world_size": 1}
    assert follower({"plan": cpu}) is not None
    assert follower({"plan": {**cpu, "world_size": 2}}) is None  # torchrun gives each rank its threads
    assert follower({"plan": {"device": "cuda", "world_size": 1}}) is None
    f = follower({"plan": cpu, "threads": 1})  # a sweep's trial: its share is the most
    assert f is not None and f.most == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's number stands
    assert follower({"plan": cpu}) is None


def test_a_job_or_server_settles_once_on_the_free_cores_and_its_threads_inherit_them() -> None:
    code = (
        "import threading, torch\n"
        "from nbtrain.worker.threads import settle\n"
        "n = settle()\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(torch.get_num_threads())); t.start(); t.join()\n"
        "print(n, torch.get_num_threads(), seen[0])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with busy_core():
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
    assert out.returncode == 0, out.stderr
    n, main, thread = out.stdout.split()[-3:]
    cores = psutil.cpu_count() or 1
    assert int(n) <= cores - 1 and main == thread == n, out.stdout
    assert "CPU thread" in out.stdout and "other processes kept" in out.stdout
    mine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "2"})  # fmt: skip
    assert mine.stdout.split()[-3] == "None"  # the user's number stands


@pytest.mark.slow
def test_a_run_beside_a_busy_process_trains_on_the_free_core_and_says_so(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbtrain
    from nbtrain.examples import write_dataset

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    write_dataset(tmp_path / "d.jsonl")
    with runs_in(tmp_path), busy_core():
        run = nbtrain.finetune(
            f"model: {tiny_model}\nmethod: lora\ndata: {{train: d.jsonl}}\n"
            "train: {max_steps: 30, per_device_train_batch_size: 4, logging_steps: 10}\n",
            name="beside-a-busy-core",
        )
        st = run.wait(timeout=300)
    assert st.state == "completed", st.describe()
    records = [json.loads(line) for line in (run.dir / "system.jsonl").read_text().splitlines()[1:]]
    chosen = [r for r in records if "threads" in r]
    assert chosen and chosen[0]["step"] == 0, "the count is chosen before the first step"
    assert chosen[0]["threads"] <= (os.cpu_count() or 1) - 1 and chosen[0]["others_busy"] > 0.7
    log = (run.dir / "logs" / "rank0.log").read_text()
    assert "CPU thread" in log and "from step 0: other processes kept" in log
