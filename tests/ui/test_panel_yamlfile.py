"""A panel's form saved to a YAML file the user names and loaded back (ui/panel/yamlfile.py): the file is
what a %%finetune cell runs, an existing file is replaced only when asked twice, no secret is written, and a
bad file leaves the form as it was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nbtrain.control.config.load import load_config
from nbtrain.ui.panel import ConfigPanel, yamlfile


def fill(panel: ConfigPanel) -> None:
    panel.fields["model"].value = "./tiny-llama"
    panel.fields["data.train"].value = "data/add.jsonl"
    panel.fields["train.max_steps"].value = "12"
    panel.fields["train.learning_rate"].value = "2e-4"
    assert panel.settle(60)


def test_save_writes_the_forms_yaml_that_load_and_a_finetune_cell_read_back_the_same(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    panel = make_panel()
    fill(panel)
    (workdir / "configs").mkdir()
    panel.save_row.name.value = "configs/add.yaml"
    panel.save_row.button.click()
    written = workdir / "configs" / "add.yaml"
    assert written.read_text() == panel.to_yaml()
    assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~_umask()  # a file to share, not a private one
    row = panel.save_row
    assert row.message.startswith("saved to configs/add.yaml") and not row.error and not panel.general_errors
    # the same config a %%finetune cell holding the file's name would run
    assert load_config(str(written)).config == load_config(panel.to_yaml()).config

    other = make_panel()
    other.load_ref.value = "configs/add.yaml"
    other.load_button.click()
    assert other.settle(60)
    assert other.to_yaml() == panel.to_yaml() and other.fields["train.learning_rate"].value == "0.0002"
    assert "loaded the form from configs/add.yaml" in other.status_message


def test_an_existing_file_is_replaced_only_on_a_second_click_and_a_new_name_asks_again(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    mine = workdir / "mine.yaml"
    mine.write_text("# my notes\nmodel: ./kept\n")
    mine.chmod(0o640)
    panel = make_panel()
    fill(panel)
    row = panel.save_row
    row.name.value = "mine.yaml"
    row.button.click()
    assert mine.read_text() == "# my notes\nmodel: ./kept\n"  # nothing lost on the first click
    assert row.button.description == "Replace" and "press Replace" in row.message and not row.error
    row.name.value = "mine.yml"  # another name: the next click is a plain Save again
    assert row.button.description == "Save"
    row.name.value = "mine.yaml"
    row.button.click()
    assert mine.read_text() == "# my notes\nmodel: ./kept\n" and row.button.description == "Replace"
    row.button.click()
    assert mine.read_text() == panel.to_yaml() and row.button.description == "Save"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640  # the file keeps its permissions
    assert [p.name for p in workdir.iterdir() if p.name.startswith(".mine")] == []  # no temporary left


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "type a file name next to Save"),
        ("notes.txt", "end it with .yaml"),
        ("nowhere/run.yaml", "the folder nowhere does not exist"),
        ("adir.yaml", "adir.yaml is a folder"),
    ],
)
def test_a_name_that_cannot_be_saved_to_says_why_and_writes_nothing(
    workdir: Path, make_panel: type[ConfigPanel], name: str, says: str
) -> None:
    (workdir / "adir.yaml").mkdir()
    panel = make_panel()
    fill(panel)
    before = sorted(p.name for p in workdir.iterdir())
    panel.save_row.name.value = name
    panel.save_row.button.click()
    assert says in panel.save_row.message and panel.save_row.error
    assert sorted(p.name for p in workdir.iterdir()) == before


def test_a_form_holding_a_secret_is_not_saved(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    token = "hf_" + "b" * 34
    text = f"model: ./tiny-llama\ndata: {{train: data/add.jsonl}}\ntrain: {{hub_token: {token}}}\n"
    panel = make_panel(text)
    assert panel.settle(60)
    panel.save_row.name.value = "leak.yaml"
    panel.save_row.button.click()
    assert not (workdir / "leak.yaml").exists()
    shown = panel.save_row.message
    assert panel.save_row.error and "not saved" in shown and "HF_TOKEN" in shown and token not in shown
    assert token not in panel.save_row.note.value
    assert yamlfile.secret_in(f"model: {token}\n") and yamlfile.secret_in("a: [unclosed " + token)
    assert yamlfile.secret_in("model: ./tiny-llama\n") is None


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("model: [unclosed\n", "YAML syntax error"),
        ("- a list\n- not a mapping\n", "must be a mapping"),
        (None, "config file not found"),
        ("# padding\n" * 120_000, "nbtrain reads at most 1 MiB"),
        (b"model: \xff\xfe binary\n", "not UTF-8 text"),
    ],
)
def test_a_bad_file_is_not_loaded_and_the_form_is_left_as_it_was(
    workdir: Path, make_panel: type[ConfigPanel], content: str | bytes | None, says: str
) -> None:
    if isinstance(content, bytes):
        (workdir / "bad.yaml").write_bytes(content)
    elif content is not None:
        (workdir / "bad.yaml").write_text(content)
    panel = make_panel()
    fill(panel)
    before = panel.to_yaml()
    panel.load_ref.value = "bad.yaml"
    panel.load_button.click()
    shown = " ".join(panel.general_errors)
    assert "bad.yaml was not loaded" in shown and says in shown
    assert panel.to_yaml() == before


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
