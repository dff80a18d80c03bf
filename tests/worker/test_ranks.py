"""The ranks of a one-node multi-process run forked from one process (nbtrain/worker/ranks.py): from the warm
process when it runs (nothing imported for the run), and a rank that dies fails the run and takes the other
rank down with it, as torchrun's agent does."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

import nbtrain
from nbtrain.control.launch import process, warm
from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow


def _warm_ready(timeout: float = 120) -> None:
    process.start_warm()
    deadline = time.monotonic() + timeout
    while not any(w["this_kernel"] and w.get("socket") for w in warm.status()):
        assert time.monotonic() < deadline, warm.status()
        time.sleep(0.3)


def test_two_ranks_fork_from_the_warm_process_and_a_killed_rank_fails_the_run_taking_the_other_down(
    workdir: Path,
) -> None:
    _warm_ready()
    body = lora_yaml(100_000).replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000")
    run = nbtrain.finetune(body + "distributed:\n  strategy: ddp\n", name="forked-ddp")
    deadline = time.monotonic() + 120
    while run.status().step < 3:
        assert time.monotonic() < deadline and not run.status().done, run.logs(40)
        time.sleep(0.2)
    log = (run.paths.logs / "launcher.log").read_text()
    assert "2 ranks forked from this process" in log and "cold start" not in log, log
    info = process.read_launch(run.paths)
    assert info is not None
    launcher = psutil.Process(int(info["pid"]))
    ranks = launcher.children()
    assert len(ranks) == 2, ranks  # forks of the launcher (forked by the warm process), not new programs
    rank0 = json.loads(run.paths.status.read_text())["pid"]  # the rank that writes the run's status
    (other,) = [p for p in ranks if p.pid != rank0]
    os.kill(other.pid, signal.SIGKILL)
    t = time.monotonic()
    while not (st := run.status()).done:
        assert time.monotonic() - t < 60, st
        time.sleep(0.3)
    gone = time.monotonic() + 30
    while process.group_alive(info):  # the other rank stopped too, and the launcher is done
        assert time.monotonic() < gone, [p.pid for p in launcher.children()]
        time.sleep(0.3)
    st = run.status()
    assert st.state == "failed", (st, run.logs(20))
    assert st.error is not None and "Connection" in st.error["message"], st.error  # rank 0 lost its peer
