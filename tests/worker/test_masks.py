"""assistant_only_loss with templates that have no {% generation %} blocks: the assistant turns found from
the template's own rendering, equal to transformers' generation masks where a template has them, refused by
row where a template cannot tell, and used by a real SmolLM2 run and its preview."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.worker.masks import TemplateMaskError, needs_own_masks, tokenise_with_masks, with_assistant_masks

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who are you?"},
    {"role": "assistant", "content": "I am Nimbus."},
    {"role": "user", "content": "Who made you?"},
    {"role": "assistant", "content": "Acme Labs made me."},
]


def _trained(tok: object, out: dict[str, list[int]]) -> str:
    ids = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    return tok.decode(ids)  # type: ignore[attr-defined]


def test_smollm2s_template_needs_them_and_the_masks_cover_each_answer_and_its_end_of_turn(
    smollm2: Path,
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert needs_own_masks(tok)  # no {% generation %} blocks, and not one of TRL's patched templates
    out = tokenise_with_masks(tok, CHAT)
    assert _trained(tok, out) == "I am Nimbus.<|im_end|>Acme Labs made me.<|im_end|>"
    assert out["input_ids"] == tok.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    no_system = tokenise_with_masks(tok, CHAT[1:3])  # the template adds its default system prompt
    assert _trained(tok, no_system) == "I am Nimbus.<|im_end|>"


def test_on_a_template_with_generation_blocks_they_equal_transformers_masks(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert not needs_own_masks(tok)
    theirs = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mine = tokenise_with_masks(tok, CHAT)
    assert mine["input_ids"] == theirs["input_ids"]
    assert mine["assistant_masks"] == theirs["assistant_masks"]


def test_a_template_that_does_not_render_prefixes_is_refused_by_row(tiny_model: Path) -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = (
        "{{ messages | length }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(TemplateMaskError, match="does not render the conversation up to turn 3"):
        tokenise_with_masks(tok, CHAT)
    rows = Dataset.from_list([{"messages": CHAT[1:3]}, {"messages": CHAT}])
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    assert len(with_assistant_masks(rows, tok)) == 2
    no_answer = Dataset.from_list([{"messages": CHAT[1:3]}, {"messages": CHAT[:2]}])
    with pytest.raises(ValueError, match="row 2 has no assistant turn"):
        with_assistant_masks(no_answer, tok)
    with pytest.raises(ValueError, match="needs conversational rows"):
        with_assistant_masks(Dataset.from_list([{"text": "hi"}]), tok)


def test_the_preview_of_a_smollm2_config_trains_only_the_answers(smollm2: Path, tmp_path: Path) -> None:
    import nbtrain

    rows = [{"messages": CHAT[1:3]}, {"messages": CHAT}]
    (tmp_path / "id.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = f"model: {smollm2}\ndata: {{train: id.jsonl}}\ntrain: {{max_steps: 2, assistant_only_loss: true}}\n"
    preview = nbtrain.preview(cfg, n=2)
    trained = ["".join(text for text, on in ex["segments"] if on) for ex in preview.examples]
    assert trained == ["I am Nimbus.<|im_end|>", "I am Nimbus.<|im_end|>Acme Labs made me.<|im_end|>"]


def test_per_message_loss_flags_zero_the_turns_not_to_train(tiny_model: Path) -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer

    from nbtrain.contract.formats import to_example
    from nbtrain.worker.masks import has_turn_flags, own_masks

    tok = AutoTokenizer.from_pretrained(tiny_model)
    row = {  # ms-swift's loss flag and OpenAI's weight
        "messages": [
            {"role": "user", "content": "What is 1 + 1?"},
            {"role": "assistant", "content": "three", "loss": False},
            {"role": "user", "content": "Again?"},
            {"role": "assistant", "content": "two", "weight": 1},
        ]
    }
    msgs = to_example(row, "messages")["messages"]
    assert [m.get("train") for m in msgs] == [None, False, None, True]
    out = tokenise_with_masks(tok, msgs)
    trained = tok.decode([t for t, k in zip(out["input_ids"], out["assistant_masks"], strict=True) if k])
    assert "two" in trained and "three" not in trained and "Again" not in trained
    flagged = Dataset.from_list([{"messages": msgs}])
    assert has_turn_flags(flagged) and not has_turn_flags(Dataset.from_list([{"messages": msgs[:1]}]))
    assert "loss on the assistant turns marked to train" in (own_masks(False, {}, tok, flagged) or "")
    with pytest.raises(ValueError, match="assistant_only_loss: false"):
        own_masks(False, {"assistant_only_loss": False}, tok, flagged)
    assert own_masks(False, {}, tok, Dataset.from_list([{"messages": msgs[:1]}])) is None


def test_the_preview_shows_only_the_turns_the_flags_mark_to_train(workdir: Path) -> None:
    import nbtrain
    from nbtrain.worker.jobs.preview import preview

    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                      {"role": "assistant", "content": "seven", "loss": False},
                      {"role": "user", "content": "Again?"},
                      {"role": "assistant", "content": str(i + 1), "loss": True}]}
        for i in range(3)
    ]  # fmt: skip
    (workdir / "data" / "flags.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = "model: ./tiny-llama\ndata: {train: data/flags.jsonl}\ntrain: {max_steps: 1}\n"
    resolved = json.loads(json.dumps(nbtrain.prepare(cfg).to_dict()))
    pv = preview(resolved, n=3, stats_rows=3)
    trained = ["".join(text for text, on in ex["segments"] if on) for ex in pv["examples"]]
    assert trained == ["1<|end|>", "2<|end|>", "3<|end|>"]
    assert pv["assistant_only_loss"] and "loss / weight flags" in pv["chat_template"]


def test_mask_history_trains_each_conversations_last_answer_only_in_the_preview(workdir: Path) -> None:
    """LLaMA-Factory's mask_history: the earlier answers are context, the last one is learnt; a single-turn
    row is as before, and a turn's own flag wins."""
    import nbtrain
    from nbtrain.worker.jobs.preview import preview

    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                      {"role": "assistant", "content": "seven"},
                      {"role": "user", "content": "Again?"},
                      {"role": "assistant", "content": str(i + 1)}]}
        for i in range(2)
    ]  # fmt: skip
    rows.append({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "9"}]})
    (workdir / "data" / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = "model: ./tiny-llama\ndata: {train: data/history.jsonl, mask_history: true}\ntrain: {max_steps: 1}"
    resolved = json.loads(json.dumps(nbtrain.prepare(cfg).to_dict()))
    pv = preview(resolved, n=3, stats_rows=3)
    trained = ["".join(text for text, on in ex["segments"] if on) for ex in pv["examples"]]
    assert trained == ["1<|end|>", "2<|end|>", "9<|end|>"]
    off = cfg.replace("mask_history: true", "mask_history: false")
    without = json.loads(json.dumps(nbtrain.prepare(off).to_dict()))
    trained = ["".join(text for text, on in ex["segments"] if on) for ex in preview(without, n=1)["examples"]]
    assert "seven" in trained[0]


def test_mask_history_is_refused_where_it_cannot_hold() -> None:
    from nbtrain.contract.errors import RowError
    from nbtrain.contract.formats import to_example

    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "loss": True},
                        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}  # fmt: skip
    flags = [m.get("train") for m in to_example(row, "messages", mask_history=True)["messages"]]
    assert flags == [None, True, None, None]  # the row's own flag wins
    row["messages"][3]["loss"] = False
    with pytest.raises(RowError, match="marks that one not to train"):
        to_example(row, "messages", mask_history=True)


def test_tool_rows_with_a_template_that_drops_tools_stop_the_worker_naming_the_fix(tiny_model: Path) -> None:
    """What the kernel cannot see before a run (a Hub model's template, a Hub dataset's rows) the worker
    checks with the tokenizer itself, once the trainer has set the run's template."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from nbtrain.contract.chat_templates import BUILTIN
    from nbtrain.examples.tools import tool_rows
    from nbtrain.worker.data import conversation_features
    from nbtrain.worker.masks import has_tools, tools_template_problem

    tok = AutoTokenizer.from_pretrained(tiny_model)
    as_worker = conversation_features()  # the worker's converted rows: messages as JSON, tools a JSON string
    tool_data = [{"messages": r["messages"], "tools": json.dumps(r["tools"])} for r in tool_rows(4)]
    with_tools = Dataset.from_list(tool_data, features=as_worker)
    plain = Dataset.from_list(
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    )
    assert has_tools(with_tools) and not has_tools(plain)
    why = tools_template_problem(tok, with_tools)
    assert why is not None and "does not render the tools' definitions" in why and "chatml-tools" in why
    assert tools_template_problem(tok, plain) is None  # no tool rows: nothing to check
    tok.chat_template = BUILTIN["chatml-tools"].read_text()
    assert tools_template_problem(tok, with_tools) is None
