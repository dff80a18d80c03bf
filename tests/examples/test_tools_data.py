"""examples/tools' model folder, without training: ``tool_model`` run again on its own folder."""

from __future__ import annotations

from pathlib import Path

from nbtrain.examples.tools import TOOLS_TEMPLATE, tool_model


def test_tool_model_run_again_on_its_folder_keeps_it_and_its_template(
    tiny_model: Path, tmp_path: Path
) -> None:
    first = tool_model(tiny_model, tmp_path / "tools")
    again = tool_model(tiny_model, tmp_path / "tools")  # the lab's first cell run twice
    assert again == first and (again / "chat_template.jinja").read_text(encoding="utf-8") == TOOLS_TEMPLATE
    assert (tiny_model / "config.json").read_bytes() == (again / "config.json").read_bytes()
    source = tiny_model / "chat_template.jinja"  # written anew, never through the link to the source
    assert source.read_text(encoding="utf-8") != TOOLS_TEMPLATE
