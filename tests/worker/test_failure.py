"""A run that fails says on what: the file and the cause, in the error a user reads (status.json's message,
`%finetune status`, the RunFailed of wait()), not only the library's words."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import RunFailed
from nbtrain.ui.text import status_text
from nbtrain.worker.failure import failure_message
from tests.conftest import lora_yaml


def test_a_damaged_weights_file_fails_the_run_naming_the_file_and_the_cause(
    workdir: Path, tiny_model: Path
) -> None:
    model = workdir / "damaged-llama"
    shutil.copytree(tiny_model, model)  # a copy: the shared tiny model stays whole
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted download
    run = nbtrain.finetune(lora_yaml(3).replace("./tiny-llama", "./damaged-llama"), name="damaged")
    with pytest.raises(RunFailed) as ei:
        run.wait(timeout=300)
    error = run.status().error or {}
    assert error["type"] == "SafetensorError" and error["file"] == str(weights.resolve())
    message = error["message"]
    assert f"the weights file {weights.resolve()} is damaged or incomplete" in message
    assert "download or save the model again" in message
    assert "deserializing header" in message  # safetensors' own words are kept
    assert str(weights.resolve()) in str(ei.value)
    assert f"SafetensorError: the weights file {weights.resolve()}" in status_text(run)


def _read_config(file: str) -> dict:
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def test_the_failure_message_names_the_file_a_library_was_reading(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 64,')
    try:
        _read_config(str(bad))
    except ValueError as e:
        message, named = failure_message(e)
    assert named == str(bad.resolve())
    assert message.startswith(f"{bad.resolve()} is not valid JSON (") and "replace it" in message
    try:
        (tmp_path / "gone").read_text()
    except OSError as e:
        message, named = failure_message(e)
    assert named is None and "No such file" in message  # not a file that exists: named by the OS already
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as e:
        assert failure_message(e) == ("CUDA out of memory", None)  # no file: the words as they were
