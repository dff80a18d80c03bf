"""`make demo` (nbtrain.ui.demo) runs lab 6 (the real SmolLM2) from the repository's notebooks/ folder and
prints, beside the loss, the held-out accuracy before -> after that the notebook measured, with a few real
answers."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain
from nbtrain.ui.demo import NOTEBOOK, report
from tests.conftest import ROOT, TUNED_ANSWERS


def test_the_demo_finds_lab_6_the_real_model_in_the_repository() -> None:
    assert NOTEBOOK == ROOT / "notebooks" / "06_real_model.ipynb" and NOTEBOOK.is_file()


@pytest.mark.slow
def test_the_demo_prints_the_accuracy_before_and_after_beside_the_loss(run_copy: Path) -> None:
    run = nbtrain.get_run(run_copy)
    lines, _ = report(run)
    assert lines[0].startswith("loss: first ") and " -> final " in lines[0]
    assert lines[1] == "accuracy: not measured (the notebook ran no nbtrain.accuracy)"

    acc = nbtrain.accuracy(run, list(TUNED_ANSWERS), list(TUNED_ANSWERS.values()), max_new_tokens=12)
    lines, ok = report(run)
    assert lines[1] == acc.summary() and lines[1].startswith("accuracy on 4 held-out prompts: ")
    first = acc.table().iloc[0]
    assert lines[2] == (f"  {first.prompt!r}: expected {first.expected!r}, before {first.before!r}, "
                        f"after {first.after!r}")  # fmt: skip
    assert lines[-1] == f"adapter: {run.output_dir}"
    assert acc.accuracy_before is not None
    assert ok == (acc.accuracy > acc.accuracy_before)  # the run completed and its loss went down
