"""Shared fixtures: an isolated nbtrain home and runs root per test, the tiny model, example data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from nbtrain.testing import write_dataset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own registry and runs root, and runs in its own working directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nbtrain.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture
def workdir(tmp_path: Path, tiny_model: Path) -> Path:
    """A notebook-like working directory with ./tiny-llama and data/add.jsonl."""
    (tmp_path / "tiny-llama").symlink_to(tiny_model)
    write_dataset(tmp_path / "data" / "add.jsonl")
    return tmp_path


def lora_yaml(max_steps: int = 30, *, method: str = "lora", extra: str = "") -> str:
    return f"""\
model: ./tiny-llama
method: {method}
data:
  train: data/add.jsonl
  format: auto
train:
  max_steps: {max_steps}
  learning_rate: 3.0e-3
  per_device_train_batch_size: 4
  logging_steps: 1
{extra}"""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip gpu-marked tests where no NVIDIA GPU is visible (checked with NVML, never CUDA)."""
    from nbtrain.hardware import probe

    if probe().gpus:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found through NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def python() -> str:
    return sys.executable


def env_with(**kv: str) -> dict[str, str]:
    return {**os.environ, **kv}
