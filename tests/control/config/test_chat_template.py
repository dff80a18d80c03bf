"""control/config/chat_template.py: a run whose rows define or call tools starts only with a chat template
that renders both (checked in the kernel with jinja2, before anything is created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.chat_template import ChatTemplate, find_chat_template
from nbtrain.control.config.schema import load_config
from nbtrain.examples_tools import TOOLS_TEMPLATE, tool_model, tool_rows


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
