"""examples/tools' data and model folder, without training: the rows (some two exchanges long, as a chat
goes on after its first question), how the tools template renders them, and ``tool_model`` run again."""

from __future__ import annotations

import json
from pathlib import Path

from nbtrain.contract.tools import conversation
from nbtrain.control.config.chat_template import ChatTemplate
from nbtrain.examples.tools import MULTI_TURN, TOOLS, TOOLS_TEMPLATE, held_out, tool_model, tool_rows


def test_every_fifth_row_asks_again_after_a_whole_earlier_exchange_and_trains_both_calls() -> None:
    rows = tool_rows(60, seed=0)
    lengths = [len(r["messages"]) for r in rows]
    assert lengths == [8 if i % MULTI_TURN == MULTI_TURN - 1 else 4 for i in range(60)]
    row = rows[MULTI_TURN - 1]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"] * 2
    segments = ChatTemplate(TOOLS_TEMPLATE, "test").segments(
        conversation(row["messages"], "messages", TOOLS), TOOLS
    )
    trained = [text for text, on in segments if on]
    assert len(trained) == 4 and sum("<call>" in t for t in trained) == 2  # both calls, both answers
    text = "".join(t for t, _ in segments)
    assert text.count("<|user|>") == 2 and text.count("<|tool|>") == 2


def test_held_out_requests_avoid_the_arguments_of_earlier_exchanges_too() -> None:
    rows = tool_rows(60, seed=0)
    called = {
        json.dumps(json.loads(m["tool_calls"][0]["function"]["arguments"]), sort_keys=True)
        for r in rows
        for m in r["messages"]
        if m.get("tool_calls")
    }
    assert not {json.dumps(c["arguments"], sort_keys=True) for c in held_out(30, train=rows)} & called


def test_tool_model_run_again_on_its_folder_keeps_it_and_its_template(
    tiny_model: Path, tmp_path: Path
) -> None:
    first = tool_model(tiny_model, tmp_path / "tools")
    again = tool_model(tiny_model, tmp_path / "tools")  # the lab's first cell run twice
    assert again == first and (again / "chat_template.jinja").read_text(encoding="utf-8") == TOOLS_TEMPLATE
    assert (tiny_model / "config.json").read_bytes() == (again / "config.json").read_bytes()
    source = tiny_model / "chat_template.jinja"  # written anew, never through the link to the source
    assert source.read_text(encoding="utf-8") != TOOLS_TEMPLATE
