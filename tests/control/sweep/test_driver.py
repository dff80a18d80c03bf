"""Real sweeps on the tiny model: trials are ordinary runs started warm by the sweep's driver, a pruned
trial stops at an evaluation point and says why, a trial whose run dies is recorded and the sweep goes on,
and neither a dead kernel nor a dead driver loses a trial or runs a finished one again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import latest_complete_checkpoint
from nbtrain.control.prepare import prepare
from nbtrain.control.runs.run import all_runs, get_run
from nbtrain.control.sweep.folder import PRUNED, STOPPED_BY_SWEEP
from nbtrain.control.sweep.sweep import Sweep, SweepStatus, get_sweep, start_sweep
from nbtrain.examples import write_dataset
from tests.conftest import runs_in, sweep_yaml

pytestmark = pytest.mark.slow  # real sweeps: training processes

TIMEOUT = 240


def test_a_pruned_trial_stops_at_an_evaluation_point_and_reads_pruned_with_the_reason(
    pruned_sweep: tuple[Sweep, SweepStatus],
) -> None:
    s, st = pruned_sweep
    assert st.state == "completed", (st.describe(), s.paths.log.read_text()[-3000:])
    first, second = st.trials
    assert (first["state"], second["state"]) == ("completed", "pruned"), st.trials
    # the reason names the step, the metric's value and what it was compared with
    # not at its first evaluation (a quarter of the steps is the median pruner's warm-up) but at the next
    evaluated = sorted(int(k) for k in second["evaluations"])
    step = evaluated[1]
    assert evaluated == [4, 8] and step > 20 // 4
    assert second["reason"] == (
        f"pruned at step {step}: eval_loss {second['evaluations'][str(step)]:.4g} is higher than the median "
        f"{first['evaluations'][str(step)]:.4g} of the 1 finished trial at that step"
    ), second
    # its run stopped there (after the step in progress), saying who stopped it
    run = get_run(second["run_dir"])
    rst = run.status()
    assert (rst.state, rst.stop_reason) == ("stopped", PRUNED)
    assert rst.step == step, rst  # it waited there for the driver's word (hold_after_eval), then stopped
    assert latest_complete_checkpoint(run.paths) is not None  # and kept its progress: it can be cloned
    assert first["value"] == first["evaluations"]["20"]  # a finished trial's value: the metric's last
    assert st.best == 0 and "best: trial 0 eval_loss" in st.describe()


def test_each_trial_is_an_ordinary_run_marked_with_its_sweep_and_the_best_is_a_cell(
    pruned_sweep: tuple[Sweep, SweepStatus],
) -> None:
    s, st = pruned_sweep
    for t in st.trials:
        run = get_run(t["run_dir"])
        assert run.name == f"lr-t{t['number']:03d}"
        # (a pruned sweep's trial waits after each evaluation for the driver's word: go on, or stop)
        sweep = {
            "id": s.id,
            "name": "lr",
            "dir": str(s.paths.root),
            "trial": t["number"],
            "hold_after_eval": 30,
        }
        assert run.resolved["sweep"] == sweep
        assert run.config["train"]["learning_rate"] == t["params"]["train.learning_rate"]
    cell = s.best_config()
    assert cell.startswith(f"# the best trial (0) of sweep {s.id}: learning_rate=0.003\n")
    assert "sweep:" not in cell and cell.endswith("name: lr-best\n")
    with runs_in(Path(s.spec["cwd"])):
        assert {r.id for r in all_runs()} == {t["run_id"] for t in st.trials}
        assert prepare(cell).resolved.config.train["learning_rate"] == 0.003  # the cell runs as it is
        assert get_sweep("lr").id == s.id and get_sweep().id == s.id


def _wait_for(check, timeout: float = TIMEOUT, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def _trial(s: Sweep, n: int) -> dict:  # type: ignore[type-arg]
    return next((t for t in s.trials() if t["number"] == n), {})


def _running_at(s: Sweep, n: int, step: int) -> bool:
    t = _trial(s, n)
    return bool(t.get("run_id")) and get_run(t["run_id"]).status().step >= step


def test_a_dead_kernel_a_killed_trial_and_a_killed_driver_lose_nothing_and_rerun_nothing(
    tmp_path: Path, tiny_model: Path
) -> None:
    (tmp_path / "tiny-llama").symlink_to(tiny_model)
    write_dataset(tmp_path / "data" / "add.jsonl")
    with runs_in(tmp_path):
        (tmp_path / "sweep.yaml").write_text(sweep_yaml("[3.0e-3, 2.0e-3, 1.0e-3]", 120))
        # the kernel that starts the sweep dies at once: the driver is a process of its own and goes on
        kernel = subprocess.Popen(
            [sys.executable, "-c", "import sys, time\nfrom nbtrain.control.sweep.sweep import start_sweep\n"
             "print(start_sweep(open('sweep.yaml').read()).paths.root, flush=True)\ntime.sleep(600)"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "NBTRAIN_RUNS_DIR": str(tmp_path / "runs")},
        )  # fmt: skip
        assert kernel.stdout is not None
        s = Sweep(kernel.stdout.readline().strip())
        kernel.kill()
        kernel.wait()
        # trial 0's run dies (killed with its process group): the trial is failed, the sweep goes on
        _wait_for(lambda: _running_at(s, 0, 2), what="trial 0 training")
        run0 = get_run(_trial(s, 0)["run_id"])
        os.killpg(json.loads(run0.paths.launch.read_text())["pgid"], signal.SIGKILL)
        _wait_for(lambda: _trial(s, 0).get("state") == "failed", what="trial 0 recorded failed")
        assert "its run failed: lost" in _trial(s, 0)["reason"], _trial(s, 0)
        # the driver is killed while trial 1 trains: the trial's run goes on without it
        _wait_for(lambda: _running_at(s, 1, 2), what="trial 1 training")
        assert s.status().state == "running"
        os.killpg(s.paths.read_driver()["pgid"], signal.SIGKILL)
        _wait_for(lambda: not s.driver_alive(), what="the driver gone")
        assert s.status().state == "interrupted"
        run1 = _trial(s, 1)["run_id"]
        s.resume()  # adopts trial 1 where it is, and goes on with trial 2
        # stopped with the sweep while trial 2 trains: its run stops at a checkpoint, and goes on with it
        _wait_for(lambda: _running_at(s, 2, 2), what="trial 2 training")
        stopped = s.stop(timeout=TIMEOUT)
        assert stopped.state == "stopped", stopped.describe()
        run2 = get_run(_trial(s, 2)["run_id"])
        assert (run2.status().state, run2.status().stop_reason) == ("stopped", STOPPED_BY_SWEEP)
        st = s.resume().wait(timeout=TIMEOUT)

        assert st.state == "completed", (st.describe(), s.paths.log.read_text()[-3000:])
        assert [t["state"] for t in st.trials] == ["failed", "completed", "completed"], st.trials
        assert _trial(s, 1)["run_id"] == run1 and _trial(s, 2)["run_id"] == run2.id  # the same runs
        assert len(all_runs()) == 3  # no trial ran twice
        assert run2.resolved["resume"]["attempt"] >= 1  # trial 2 went on from its checkpoint
        assert get_run(run1).status().state == "completed"
        assert st.best in (1, 2)

        # a grid runs its combinations; clone a trial with changed keys for more: a new trial, its run the
        # clone's values with the changes (a value outside the space is set on the config and said)
        with pytest.raises(NbtrainError, match="a grid has 3 combinations: extend by at most 0"):
            s.extend(1)
        st = s.clone(1, {"train.learning_rate": 4.0e-3, "train.max_steps": 8}).wait(timeout=TIMEOUT)
        clone = _trial(s, 3)
        assert (st.state, clone["state"], clone["clone_of"]) == ("completed", "completed", 1), st.trials
        assert clone["set"] == {"train.learning_rate": 4.0e-3, "train.max_steps": 8}
        cfg = get_run(clone["run_dir"]).config
        assert (cfg["train"]["learning_rate"], cfg["train"]["max_steps"]) == (4.0e-3, 8)
        assert st.budget == 4 and len(all_runs()) == 4


@pytest.mark.slow
def test_on_a_cluster_each_trial_is_a_slurm_job_within_the_courses_cap(
    slurm_cluster: Any, workdir: Path
) -> None:
    (workdir / "nbtrain.lab.yaml").write_text(
        "course: Fine-tuning 101\nslurm: {partition: debug, time: '00:05:00'}\nmax_runs_at_once: 1\n"
    )
    s = start_sweep(sweep_yaml("[3.0e-3, 1.0e-3]", 8).replace("  at_once: 1\n", ""))
    assert s.why == (
        "1 at once: each trial is a SLURM job on partition debug, queued by SLURM (the course allows 1 of a "
        "student's runs on the cluster at once)"
    )
    most = 0
    deadline = time.monotonic() + TIMEOUT
    while not (st := s.status()).done:
        most = max(most, sum(t["state"] == "running" for t in st.trials))
        assert time.monotonic() < deadline, st.describe()
        time.sleep(0.5)
    assert st.state == "completed" and [t["state"] for t in st.trials] == ["completed", "completed"], (
        st.describe(),
        s.paths.log.read_text()[-2000:],
    )
    jobs = {json.loads(Path(t["run_dir"], "status.json").read_text())["slurm_job"] for t in st.trials}
    assert len(jobs) == 2 and most == 1  # a job each, one at a time
