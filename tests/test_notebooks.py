"""Every notebook in notebooks/ runs top to bottom in a real kernel on CPU with the tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

import nbtrain
from tests.conftest import Lab

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
        "08_sweep.ipynb",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path: Path, labs: Callable[[str], Lab]) -> None:
    lab = labs(path.stem)  # plain figures, not widgets: the saved notebooks stay small
    errors = [o for c in lab.notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # a run record a lab saves (nbtrain.record) shows the run's final state in the saved file
    saved = lab.dir / f"{path.stem}.executed.ipynb"
    nbformat.write(lab.notebook, saved)
    assert all(r["state"] == "completed" for r in nbtrain.records(saved))
    assert {p.name for p in lab.dir.iterdir()} - {saved.name}  # it did work in its own folder
