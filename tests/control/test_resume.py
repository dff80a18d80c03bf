"""Runs that survive: checkpoint now, stop/kill and resume, resume equivalence. Real processes."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import COMPLETE_MARKER, read_jsonl
from nbtrain.control.launch import process
from nbtrain.control.runs.run import last_checkpoint
from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow


def config(steps: int, save_steps: int = 100_000, extra: str = "") -> str:
    return (
        lora_yaml(steps).replace("  logging_steps: 1", f"  logging_steps: 1\n  save_steps: {save_steps}")
        + extra
    )


def wait_step(run: nbtrain.Run, step: int, timeout: float = 180) -> None:
    """Until ``step`` is logged: read from metrics.jsonl (a line per step), not status.json, which is
    written at most once a second (a tiny model runs hundreds of steps in that second)."""
    from nbtrain.control.runs.metrics import MetricsTail

    tail = MetricsTail(run)
    deadline = time.monotonic() + timeout
    while True:
        tail.poll()
        if (tail.last_step or 0) >= step:
            return
        assert not run.status().done, run.logs(40)
        assert time.monotonic() < deadline, run.logs(40)
        time.sleep(0.02)


def adapter(run: nbtrain.Run) -> dict[str, torch.Tensor]:
    return load_file(run.output_dir / "adapter_model.safetensors")


def assert_same_adapter(a: nbtrain.Run, b: nbtrain.Run) -> None:
    x, y = adapter(a), adapter(b)
    assert x.keys() == y.keys()
    worst = max(float((x[k] - y[k]).abs().max()) for k in x)
    assert worst < 1e-5, worst


def steps_logged(run: nbtrain.Run) -> list[int]:
    return [int(r["step"]) for r in read_jsonl(run.paths.metrics) if "loss" in r]


def test_checkpoint_now_saves_without_stopping(workdir: Path) -> None:
    run = nbtrain.finetune(config(100_000), name="ckpt-now")
    wait_step(run, 3)
    run.checkpoint()
    deadline = time.monotonic() + 60
    while last_checkpoint(run) is None:
        assert time.monotonic() < deadline, run.logs(40)
        time.sleep(0.1)
    ckpt = last_checkpoint(run)
    assert (
        ckpt is not None
        and (ckpt / COMPLETE_MARKER).exists()
        and (ckpt / "adapter_model.safetensors").exists()
    )
    assert not run.status().done  # still training
    assert not run.paths.control_file("checkpoint").exists()  # the request was consumed
    assert run.stop().state == "stopped"


@pytest.mark.parametrize(
    ("distributed", "warm"),
    [("", "1"), ("", "0"), ("distributed:\n  strategy: ddp\n", "1")],
    ids=["1-process-warm", "1-process-cold", "ddp-2-ranks"],  # launchers always start cold
)
def test_stop_then_resume_ends_like_an_uninterrupted_run(
    workdir: Path, distributed: str, warm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBTRAIN_WARM", warm)
    n = 400  # a tiny model's step takes ~6 ms here: room for the stop to land well before the end
    straight = nbtrain.finetune(config(n, extra=distributed), name="straight")
    straight.wait(timeout=300)
    interrupted = nbtrain.finetune(config(n, extra=distributed), name="interrupted")
    wait_step(interrupted, 6)
    st = interrupted.stop()
    assert st.state == "stopped" and 6 <= st.step < n
    k = st.step
    resumed = interrupted.resume()
    assert resumed.dir == interrupted.dir
    final = resumed.wait(timeout=300)
    assert final.state == "completed" and final.step == n
    assert "resuming from" in resumed.logs(10_000)
    if warm == "0":
        assert "cold start: NBTRAIN_WARM=0" in resumed.logs(10_000)
    assert steps_logged(resumed) == list(range(1, n + 1))  # continuous: no step twice
    assert_same_adapter(straight, resumed)
    assert resumed.resolved["resume"]["step"] == k
    # its dashboard: elapsed counts both attempts (not reset by the resume), memory stays on the step axis
    from nbtrain.control.runs.metrics import MetricsTail
    from nbtrain.ui.figures import progress, run_plot

    first_t = next(r["t"] for r in read_jsonl(resumed.paths.metrics) if "t" in r)
    relaunched = float(process.read_launch(resumed.paths)["start_time"])  # type: ignore[index]
    tail = MetricsTail(resumed)
    tail.poll()
    elapsed = progress(tail, final).elapsed
    assert elapsed is not None and elapsed >= (st.updated - first_t) + (final.updated - relaunched) - 1.0
    memory = [t for t in run_plot(resumed).data if t.meta[0] == "memory"]
    assert memory and all(min(t.x) >= 0 and list(t.x) == sorted(t.x) for t in memory)


def test_resume_needs_a_stopped_run_with_a_checkpoint(workdir: Path) -> None:
    run = nbtrain.finetune(config(4), name="done")
    run.wait(timeout=300)
    with pytest.raises(NbtrainError, match="completed; nothing to resume"):
        run.resume()


def kill_group(run: nbtrain.Run) -> None:
    info = process.read_launch(run.paths)
    assert info is not None
    os.killpg(int(info["pgid"]), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process.group_alive(info):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def kill_and_resume_trial(rng: random.Random, n: int = 200) -> dict[str, int]:
    """Kill -9 the whole run at a random moment while it saves every step, then resume it."""
    text = config(n, save_steps=1).replace("  save_steps: 1", "  save_steps: 1\n  save_total_limit: 2")
    run = nbtrain.finetune(text, name=f"kill-{rng.randrange(10**6)}")
    wait_step(run, 2)
    time.sleep(rng.uniform(0.0, 0.4))  # a random moment, often inside a checkpoint write
    kill_group(run)
    assert run.status().state == "failed" and run.status().error["type"] == "lost"  # type: ignore[index]
    # A checkpoint cut short has no completion marker: it must never be chosen.
    partial = run.paths.checkpoints / "checkpoint-99999"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"half written")
    chosen = last_checkpoint(run)
    assert chosen is not None and chosen != partial
    resumed = run.resume()
    assert not partial.exists()
    final = resumed.wait(timeout=300)
    assert final.state == "completed" and final.step == n, resumed.logs(40)
    assert steps_logged(resumed) == list(range(1, n + 1))
    assert len(list(resumed.paths.checkpoints.glob("checkpoint-*"))) <= 2  # save_total_limit honoured
    return {"resumed_from": int(chosen.name.split("-")[1])}


def test_kill_at_random_moments_then_resume(workdir: Path) -> None:
    rng = random.Random(int(os.environ.get("NBTRAIN_TRIAL_SEED", "7")))
    trials = [kill_and_resume_trial(rng) for _ in range(int(os.environ.get("NBTRAIN_KILL_TRIALS", "2")))]
    print(f"kill -9 trials: {len(trials)}, all resumed and completed; resumed from steps "
          f"{[t['resumed_from'] for t in trials]}")  # fmt: skip


def graceful_stop_trial(rng: random.Random, n: int = 400) -> int:
    run = nbtrain.finetune(config(n), name=f"graceful-{rng.randrange(10**6)}")
    wait_step(run, rng.randint(2, 40))
    st = run.stop()
    assert st.state == "stopped"
    ckpt = last_checkpoint(run)
    assert ckpt is not None and ckpt.name == f"checkpoint-{st.step}"  # saved at the step it stopped
    resumed = run.resume()
    assert resumed.resolved["resume"]["step"] == st.step
    final = resumed.wait(timeout=300)
    assert final.state == "completed" and final.step == n
    assert steps_logged(resumed) == list(range(1, n + 1))
    return st.step


def test_graceful_stop_at_random_steps_then_resume(workdir: Path) -> None:
    rng = random.Random(int(os.environ.get("NBTRAIN_TRIAL_SEED", "7")))
    stops = [graceful_stop_trial(rng) for _ in range(int(os.environ.get("NBTRAIN_STOP_TRIALS", "2")))]
    print(f"graceful stop trials: {len(stops)}, all resumed and completed; stopped at steps {stops}")


def test_resume_auto_continues_the_newest_stopped_run_of_that_name(workdir: Path) -> None:
    text = config(400) + "resume: auto\n"
    first = nbtrain.finetune(text, name="auto-resume")
    wait_step(first, 4)
    stopped_at = first.stop().step
    again = nbtrain.finetune(text, name="auto-resume")  # the same cell run again
    assert again.dir == first.dir and again.resolved["resume"]["step"] == stopped_at
    assert again.wait(timeout=300).step == 400
    fresh = nbtrain.finetune(text, name="auto-resume")  # the newest is completed: a new run starts
    assert fresh.dir != first.dir
    fresh.stop()
