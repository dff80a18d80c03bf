"""A panel's form kept per notebook cell across kernel restarts (ui/panel/saved.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from nbtrain.ui.panel import ConfigPanel, saved
from nbtrain.ui.panel.widget import KEEPS_CLASS


def test_a_cells_form_is_saved_privately_and_read_back_and_a_secret_is_never_written(workdir: Path) -> None:
    key = ("course/lab1.ipynb", "a1b2-c3")
    assert saved.load(key) is None and saved.save(None, "model: x\n") is False
    assert saved.save(key, "model: ./tiny-llama\n")
    p = saved.path_of(key)
    assert saved.load(key) == "model: ./tiny-llama\n" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700
    token = "hf_" + "a" * 34
    assert not saved.save(key, f"model: ./tiny-llama\ntrain:\n  hub_token: {token}\n")
    assert not p.exists()  # the older form of the cell is gone too, not left behind
    assert not saved.save(key, f"model: {token}\n")
    assert saved.save(key, "model: ./tiny-llama\n") and not saved.save(key, "data: {}\n")  # emptied: removed
    assert saved.load(key) is None
    assert saved.cell_key() is None  # outside a notebook cell: nothing is kept


def test_an_empty_panel_in_the_same_cell_gets_back_the_form_it_held(
    workdir: Path, make_panel: type[ConfigPanel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell's identity is what a kernel restart keeps (the notebook's session path and the cell id
    JupyterLab sends); here it is given, and everything else is the real panel."""
    monkeypatch.setattr(saved, "cell_key", lambda: ("lab.ipynb", "cell-1"))
    first = make_panel()
    first.fields["model"].value = "./tiny-llama"
    first.fields["data.train"].value = "data/add.jsonl"
    first.fields["train.max_steps"].value = "12"
    assert first.settle(60)
    again = make_panel()  # the cell run again after the restart: nbtrain.panel()
    assert again.settle(60)
    assert again.to_yaml() == first.to_yaml() and again.fields["train.max_steps"].value == "12"
    assert "before the kernel restarted" in again.status_message
    # the form says so, for the line the lab extension shows in its place once the kernel is gone
    assert KEEPS_CLASS in first.widget._dom_classes and KEEPS_CLASS in again.widget._dom_classes
    again.fields["model"].value = "hf_" + "a" * 34  # a form holding a token is not written: not kept
    assert again.settle(60) and KEEPS_CLASS not in again.widget._dom_classes
    explicit = make_panel("model: ./other\n")  # a cell that gives its config keeps it
    assert explicit.settle(60) and explicit.fields["model"].value == "./other"
    assert KEEPS_CLASS not in explicit.widget._dom_classes  # run again, it is that config again
    monkeypatch.setattr(saved, "cell_key", lambda: ("lab.ipynb", "cell-2"))
    other = make_panel()  # another cell: its own (empty) form
    assert other.settle(60) and other.fields["model"].value == "" and saved.is_empty(other.to_yaml())
