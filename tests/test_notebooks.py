"""Every notebook in notebooks/ runs top to bottom in a real kernel on CPU with the tiny model."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import nbtrain

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").rglob("*.ipynb"))


def test_the_labs_are_all_found() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {
        "00_quickstart.ipynb",
        "01_qlora_single_card.ipynb",
        "02_multi_gpu_deepspeed.ipynb",
        "03_preference_alignment.ipynb",
        "04_your_own_loop.ipynb",
        "05_vision_language.ipynb",
        "06_real_model.ipynb",
        "07_agent.ipynb",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Plain figures, not widgets: the saved notebooks stay small, and nothing differs in what runs.
    monkeypatch.setenv("NBTRAIN_DASHBOARD", "static")
    nb = nbformat.read(path, as_version=4)
    if path.name == "01_qlora_single_card.ipynb":
        # After Run All the chat's server still answers (the export cell used to stop it); the kernel's
        # exit stops the servers it started, so this is asked from inside, as the last cell.
        check = "from nbtrain.control.jobs.serve import find_server\nassert find_server(run) is not None"
        nb.cells.append(nbformat.v4.new_code_cell(check))
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # a run record a lab saves (nbtrain.record) shows the run's final state in the saved file
    saved = tmp_path / f"{path.stem}.executed.ipynb"
    nbformat.write(nb, saved)
    assert all(r["state"] == "completed" for r in nbtrain.records(saved))
    assert os.listdir(tmp_path)  # it did work in its own directory
