"""contract/tools: a model's answer read back for tool calls, in each family's convention."""

from __future__ import annotations

import pytest

from nbtrain.contract.tools import call_style, parse_tool_calls
from nbtrain.examples.tools import TOOLS, TOOLS_TEMPLATE

WEATHER = {"name": "get_weather", "arguments": {"city": "Oslo"}}


@pytest.mark.parametrize(
    ("template", "style"),
    [
        ("{% for t in tools %}<tools>{{ t | tojson }}</tools>{% endfor %}<tool_call>", "hermes"),
        ("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
        ("<|python_tag|>{{ m.tool_calls | tojson }}", "llama3"),
        (TOOLS_TEMPLATE, "nbtrain"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
        (None, None),
    ],
)
def test_the_template_says_how_calls_are_written(template: str | None, style: str | None) -> None:
    assert call_style(template) == style


@pytest.mark.parametrize(
    ("style", "text", "content"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', ""),
        (
            "hermes",
            'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}',
            "Let me look.",
        ),
        ("nbtrain", '<call>get_weather {"city": "Oslo"}</call>', ""),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]', ""),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', ""),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', ""),
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', ""),
    ],
)
def test_each_familys_call_is_read_with_the_text_around_it(style: str, text: str, content: str) -> None:
    parsed = parse_tool_calls(text, style, TOOLS)
    assert parsed.error is None and parsed.calls == [WEATHER]
    assert parsed.content == content


def test_parallel_calls_come_back_in_order() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>'
    )
    parsed = parse_tool_calls(text, "hermes", TOOLS)
    assert [c["name"] for c in parsed.calls] == ["add", "get_weather"]
    assert parsed.calls[1]["arguments"] == {"city": "Oslo"}  # arguments given as a JSON string


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        (
            '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
            "'launch', which is not one of the tools",
        ),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "not a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "without a function name"),
    ],
)
def test_a_malformed_call_is_kept_as_text_with_what_is_wrong(text: str, says: str) -> None:
    parsed = parse_tool_calls(text, "hermes", TOOLS)
    assert parsed.calls == [] and parsed.content == text
    assert parsed.error is not None and says in parsed.error


@pytest.mark.parametrize(
    "text",
    [
        "<call>579",
        '<call>add {"a": 1, "b"',
        'Sure. <call>add {"a": 1, "b": 2}</call> and <call>add',
        '</cindy"}</call>',
    ],
)
def test_a_call_begun_and_not_finished_is_malformed_not_plain_text(text: str) -> None:
    parsed = parse_tool_calls(text, "nbtrain", TOOLS)
    assert parsed.calls == [] and parsed.content == text
    assert parsed.error is not None and "not written as <call>NAME {JSON}</call>" in parsed.error


def test_plain_answers_have_no_calls() -> None:
    for style in ("hermes", "nbtrain", "mistral", "llama3", None):
        parsed = parse_tool_calls("It is sunny in Oslo.", style, TOOLS)
        assert parsed.calls == [] and parsed.error is None and parsed.content == "It is sunny in Oslo."
