"""control/config/chat_template.py: a run whose rows define or call tools starts only with a chat template
that renders both (checked in the kernel with jinja2, before anything is created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.chat_template import ChatTemplate, find_chat_template
from nbtrain.control.config.load import load_config
from nbtrain.examples.tools import TOOLS_TEMPLATE, tool_model, tool_rows


def tools_yaml(model: str, extra: str = "") -> str:
    return f"model: {model}\nmethod: lora\ndata: {{train: data/tools.jsonl}}\ntrain:\n  max_steps: 2\n{extra}"


@pytest.fixture
def tools_dir(workdir: Path) -> Path:
    rows = tool_rows(8)
    (workdir / "data" / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


def test_tool_rows_with_a_template_that_ignores_tools_are_refused_with_both_ways_out(tools_dir: Path) -> None:
    runs_before = list((tools_dir / "runs").glob("*")) if (tools_dir / "runs").exists() else []
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(tools_yaml("./tiny-llama"), name="no-tools")
    text = str(e.value)
    assert "tools.jsonl define or call tools" in text and "chat_template.jinja" in text
    assert "the tools' definitions or the assistant's tool calls" in text
    assert "chat_template_path" in text and "TOOLS_TEMPLATE" in text
    after = list((tools_dir / "runs").glob("*")) if (tools_dir / "runs").exists() else []
    assert after == runs_before  # nothing created


def test_a_template_file_that_renders_tools_lets_the_run_validate(tools_dir: Path) -> None:
    (tools_dir / "tools.jinja").write_text(TOOLS_TEMPLATE)
    load_config(tools_yaml("./tiny-llama", "  chat_template_path: tools.jinja\n"))  # no problem
    tool_model(tools_dir / "tiny-llama", tools_dir / "tiny-tools")
    load_config(tools_yaml("./tiny-tools"))


def test_rows_without_tools_are_not_checked(workdir: Path) -> None:
    load_config(tools_yaml("./tiny-llama").replace("tools.jsonl", "add.jsonl"))


def test_what_a_template_leaves_out_is_named(tiny_model: Path) -> None:
    plain = find_chat_template(tiny_model)
    assert plain is not None and plain.tools_missing() is not None
    assert ChatTemplate(TOOLS_TEMPLATE, "x").tools_missing() is None
    defs_only = "{% for t in tools or [] %}{{ t['function']['name'] }}{% endfor %}" \
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # fmt: skip
    assert ChatTemplate(defs_only, "x").tools_missing() == "the assistant's tool calls"
    raising = "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}" \
        "{% endif %}{% endfor %}"  # fmt: skip
    assert "TemplateError: no tools" in str(ChatTemplate(raising, "x").tools_missing())


def tools_config(extra: str, train: str = "") -> str:
    head = "model: ./tiny-llama\nmethod: lora\ndata: {train: data/tools.jsonl}\n"
    return f"{head}{extra}train:\n  max_steps: 2\n{train}"


def test_the_built_in_chatml_tools_template_lets_tool_rows_train(tools_dir: Path) -> None:
    from nbtrain.contract.chat_templates import BUILTIN

    res = load_config(tools_config("chat_template: chatml-tools\n"))
    assert res.config.train["chat_template_path"] == str(BUILTIN["chatml-tools"].resolve())
    (tools_dir / "mine.jinja").write_text(TOOLS_TEMPLATE)
    assert (
        load_config(tools_config("chat_template: mine.jinja\n"))
        .config.train["chat_template_path"]
        .endswith("mine.jinja")
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("chat_template: chatml-tool\n", "neither a built-in template (chatml-tools) nor a Jinja template"),
        ("chat_template: 3\n", "names a built-in template (chatml-tools) or a Jinja file"),
        ("chat_template: chatml-tools\n", "keep one"),
    ],
)
def test_a_chat_template_that_cannot_be_used_is_refused_naming_the_built_ins(
    tools_dir: Path, extra: str, says: str
) -> None:
    text = tools_config(extra, "  chat_template_path: x.jinja\n" if says == "keep one" else "")
    with pytest.raises(ConfigError, match="chat_template") as e:
        load_config(text)
    assert says in str(e.value)


def test_chatml_tools_trains_the_call_and_the_end_of_turn_and_the_server_reads_the_call_back() -> None:
    from nbtrain.contract.chat_templates import BUILTIN
    from nbtrain.contract.tools import call_style, conversation, parse_tool_calls
    from nbtrain.examples.tools import TOOLS

    source = BUILTIN["chatml-tools"].read_text()
    template = ChatTemplate(source, "chatml-tools")
    assert template.tools_missing() is None and call_style(source) == "hermes"
    row = tool_rows(1)[0]
    msgs = conversation(row["messages"], "messages", TOOLS)
    segments = template.segments([{"role": "system", "content": "Be brief."}, *msgs], TOOLS)
    whole = "".join(text for text, _ in segments)
    assert whole.startswith("<|im_start|>system\nBe brief.\n\nYou may call") and whole.count("Be brief.") == 1
    assert '"name": "get_weather"' in whole and "<tool_response>" in whole
    trained = [text for text, on in segments if on]
    assert len(trained) == 2 and all(t.endswith("<|im_end|>") for t in trained)  # the call, then the answer
    parsed = parse_tool_calls(trained[0].removesuffix("<|im_end|>"), "hermes", TOOLS)
    want = msgs[1]["tool_calls"][0]["function"]
    assert parsed.error is None and parsed.calls == [{"name": want["name"], "arguments": want["arguments"]}]


def test_the_token_preview_renders_with_the_runs_chat_template(tools_dir: Path) -> None:
    """TRL's SFTTrainer sets train: chat_template_path's template itself; the preview job, which calls its
    dataset preparation without building a trainer, sets it the same way."""
    from nbtrain.worker.jobs.preview import preview

    (tools_dir / "notes.txt").write_text(TOOLS_TEMPLATE)
    with pytest.raises(ConfigError, match="nor a Jinja template file"):
        load_config(tools_config("chat_template: notes.txt\n"))  # TRL would take it for a model id
    resolved = json.loads(
        json.dumps(nbtrain.prepare(tools_config("chat_template: chatml-tools\n")).to_dict())
    )
    text = "".join(t for t, _ in preview(resolved, n=1, stats_rows=1)["examples"][0]["segments"])
    assert (
        "<|im_start|>system" in text and '<tool_call>{"name": "get_weather", "arguments": {"city": ' in text
    )
