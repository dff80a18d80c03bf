"""A stop never throws a slow run away (issue 57): a run whose steps take longer than the stop's floor is
waited for, from run.stop() and the command line (the sidebar's REST stop: tests/ui/server), says what it
waits for, and ends resumable at the step it stopped after; a checkpoint is also saved by training time
(``checkpoint_minutes``), so a kill loses at most that much; `%finetune wait` on a stopped run says so
and fails the cell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.rundir import checkpoint_step
from nbtrain.control.launch import process
from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.control.runs.run import last_checkpoint
from nbtrain.ui.figures import progress
from tests.conftest import lora_yaml
from tests.control.test_resume import wait_step

# A step that takes SECONDS: the notebook's loss function sleeps, inside the step the worker times.
SLOW = """\
import time

import torch.nn.functional as F


def slow_ce(outputs, labels, num_items_in_batch=None):
    time.sleep(SECONDS)
    logits, target = outputs.logits[:, :-1].float(), labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100)
"""


def slow_namespace(seconds: float) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__", "SECONDS": seconds}
    exec(compile(SLOW, "<notebook cell>", "exec"), ns)
    return ns


def slow_run(name: str, seconds: float, steps: int, extra: str = "") -> nbtrain.Run:
    # logging_steps 5, as lab 6: the loss chart has nothing for the first steps, the stop still knows them
    text = lora_yaml(steps, extra=f"hooks:\n  loss: slow_ce\n{extra}").replace(
        "logging_steps: 1", "logging_steps: 5"
    )
    return nbtrain.finetune(text, name=name, namespace=slow_namespace(seconds))


def wait_status_step(run: nbtrain.Run, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while run.status().step < step or run.status().step_seconds is None:
        assert not run.status().done and time.monotonic() < deadline, run.logs(40)
        time.sleep(0.2)


@pytest.mark.slow
def test_a_stop_waits_for_a_step_longer_than_its_floor_and_the_run_stays_resumable(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBTRAIN_STOP_GRACE", "1")  # a floor shorter than one step (as 60 s is to a 70 s step)
    api = slow_run("api", 3.0, 200)
    cli_run = slow_run("cli", 3.0, 200)
    wait_status_step(api, 2)
    wait_status_step(cli_run, 2)
    assert (api.status().step_seconds or 0) >= 2.9  # the sleep and the step's own work, on a busy machine
    # with no loss logged yet (logging_steps 5), the header already says the time left and the first loss
    tail = MetricsTail(api.paths)
    tail.poll()
    shown = progress(tail, api.status())
    assert api.status().steps_timed >= 2 and shown.eta is not None and shown.eta > 100 * 2.9
    if tail.records == 0:
        assert "training: first loss at step 5" in (shown.waiting() or ""), shown.waiting()

    # run.stop(): while it waits, the status says what for (the sidebar and the run page show this line)
    seen: list[str | None] = []
    import threading

    t = threading.Thread(target=lambda: seen.append(api.stop().state))
    t.start()
    said = None
    while t.is_alive():
        said = said or api.status().phase_text()
        time.sleep(0.1)
    t.join()
    assert seen == ["stopped"]
    assert said is not None and said.startswith("stopping"), said
    st = api.status()
    ckpt = last_checkpoint(api)
    assert ckpt is not None and checkpoint_step(ckpt) == st.step, (st, ckpt)  # nothing lost
    assert st.stop_reason == "user"
    ckpt_api = ckpt

    # the command line: says what it waits for before acting, then how to go on
    env = {**os.environ, "NBTRAIN_STOP_GRACE": "1"}
    out = subprocess.run([sys.executable, "-m", "nbtrain.ui.cli", "stop", cli_run.id], capture_output=True,
                         text=True, timeout=300, env=env, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "stopping after step " in out.stdout and "s a step), then a checkpoint" in out.stdout, out.stdout
    assert "resume it from its checkpoint (checkpoint-" in out.stdout, out.stdout
    st = cli_run.status()
    ckpt = last_checkpoint(cli_run)
    assert st.state == "stopped" and ckpt is not None and checkpoint_step(ckpt) == st.step

    # `%finetune wait` on it says it was stopped and how to go on, and fails the cell (Run All stops there)
    wait_fails_the_cell(api, workdir, monkeypatch)

    # resumable: it goes on from the step it stopped after
    resumed = nbtrain.resume(api.id)
    wait_step(resumed, checkpoint_step(ckpt_api) + 1)
    resumed.stop(timeout=120)


@pytest.mark.slow
def test_a_checkpoint_is_saved_by_training_time_so_a_kill_loses_at_most_that(workdir: Path) -> None:
    # 0.05 minutes = 3 s of 1 s steps, no save_steps: a checkpoint every ~3 steps, by time alone
    run = slow_run("timed", 1.0, 200, extra="checkpoint_minutes: 0.05\n")
    wait_status_step(run, 10)
    killed_at = run.status().step
    info = process.read_launch(run.paths)
    assert info is not None
    os.killpg(int(info["pgid"]), signal.SIGKILL)  # a crash: no time for anything
    st = run.wait(timeout=60, check=False)
    assert st.state == "failed"
    ckpt = last_checkpoint(run)
    assert ckpt is not None, run.logs(40)
    assert killed_at - checkpoint_step(ckpt) <= 3 + 2, (
        killed_at,
        ckpt,
    )  # the interval, a step, a status second
    assert "minutes of training without one (checkpoint_minutes)" in run.logs(400)


def wait_fails_the_cell(run: nbtrain.Run, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(workdir / "ipython"))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=cfg)
    try:
        ip.run_line_magic("load_ext", "nbtrain")
        said = rf"run {run.id} was stopped at step \d+ \(stopped by user\) before it completed; resume it"
        with pytest.raises(UsageError, match=said):  # the magic's NbtrainError: the cell fails, Run All stops
            ip.run_line_magic("finetune", f"wait {run.id}")
    finally:
        InteractiveShell.clear_instance()
