"""report_to: names checked against what is installed, trackers writing into the run directory (offline),
and TensorBoard started on a run's logs from the notebook."""

from __future__ import annotations

import importlib.util
import urllib.request
from pathlib import Path

import psutil
import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from nbtrain.control.launch.tracking import (
    installed_integrations,
    report_to_problem,
    stop_tensorboard,
    tensorboard,
    tracking_env,
)
from tests.conftest import lora_yaml

HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None


def test_unknown_integration_is_an_error_naming_a_close_match_and_what_is_installed(workdir: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(lora_yaml(extra="  report_to: [tensorbord]\n"))
    msg = str(err.value)
    assert "train.report_to" in msg and "did you mean 'tensorboard'?" in msg
    assert f"Installed here: {', '.join(installed_integrations()) or 'none'}" in msg


@pytest.mark.skipif(HAS_MLFLOW, reason="mlflow is installed here")
def test_an_integration_that_is_not_installed_says_how_to_install_it() -> None:
    msg = report_to_problem(["mlflow"])
    assert msg is not None and "mlflow is not installed (pip install mlflow)" in msg
    assert report_to_problem("none") is None and report_to_problem("all") is None
    assert "stands alone" in str(report_to_problem(["all", "tensorboard"]))


def test_trackers_keep_their_files_in_the_run_dir_and_the_users_settings_win(tmp_path: Path) -> None:
    env = tracking_env(tmp_path, ["tensorboard", "wandb", "mlflow"], environ={})
    assert env["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "logs" / "tensorboard")
    assert env["WANDB_MODE"] == "offline" and env["WANDB_DIR"] == str(tmp_path)
    assert env["MLFLOW_TRACKING_URI"] == (tmp_path / "mlruns").as_uri()
    user = {"WANDB_API_KEY": "k", "MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    mine = tracking_env(tmp_path, ["wandb", "mlflow"], environ=user)
    assert "WANDB_MODE" not in mine and "MLFLOW_TRACKING_URI" not in mine
    assert tracking_env(tmp_path, "none", environ={}) == {}


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed")
def test_report_to_tensorboard_writes_event_files_in_the_run_dir(qlora_run: Path) -> None:
    events = list((qlora_run / "logs" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert not (qlora_run / "checkpoints" / "runs").exists()  # not the Trainer's default place


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed")
def test_wandb_runs_offline_inside_the_run_dir(qlora_run: Path) -> None:
    runs = list((qlora_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    assert "Running in WANDB offline mode" in (qlora_run / "logs" / "rank0.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed")
def test_tensorboard_starts_once_serves_the_run_and_stops(qlora_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / qlora_run.name  # a copy: TensorBoard's info file and log go into the run dir
    shutil.copytree(qlora_run, run, ignore=shutil.ignore_patterns("checkpoints", "wandb", "output"))
    tb = tensorboard(run)
    try:
        assert not tb.reused and tb.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(tb.url + "data/runs", timeout=30) as resp:
            assert resp.status == 200 and b"." in resp.read()
        again = tensorboard(run)
        assert again.reused and again.pid == tb.pid
        assert "<a href" in tb._repr_html_()
    finally:
        assert stop_tensorboard(run)
    assert not psutil.pid_exists(tb.pid)  # stopped and collected: no zombie left
    assert not stop_tensorboard(run)
