"""`make demo` (nbtrain.ui.demo) runs lab 1 from the repository's notebooks/ folder."""

from __future__ import annotations

from nbtrain.ui.demo import NOTEBOOK
from tests.conftest import ROOT


def test_the_demo_finds_lab_1_in_the_repository() -> None:
    assert NOTEBOOK == ROOT / "notebooks" / "01_qlora_single_card.ipynb" and NOTEBOOK.is_file()
