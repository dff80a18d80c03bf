"""The official ``openai`` Python package as the client of a run's built-in server: what it parses (chat
completions, completions, their server-sent-event streams, errors) is what the server sends. One real
server on the shared tuned run (tests/conftest.py), started with ``run.serve()`` once for the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai  # in the dev extra: `make install` installs it
import pytest

from nbtrain.control.jobs.serve import ServerHandle
from nbtrain.ui.run import get_run

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process


@pytest.fixture(scope="module")
def server(tuned_run: Path) -> Iterator[ServerHandle]:
    h = get_run(tuned_run).serve()
    yield h
    if not h.reused:
        h.stop()


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=server.api_key, max_retries=0, timeout=120)


def test_openai_client_streams_a_chat_completion_chunk_by_chunk(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is 10 + 7?"}]
    whole = client.chat.completions.create(model="tuned", messages=msgs, temperature=0, max_tokens=24)
    answer = whole.choices[0].message.content
    assert answer and whole.choices[0].message.role == "assistant"

    chunks = list(
        client.chat.completions.create(
            model="tuned", messages=msgs, temperature=0, max_tokens=24, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert {c.model for c in chunks} == {"tuned"}
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 3, pieces  # the reply came in pieces, as it was generated
    assert "".join(pieces) == answer
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_client_streams_a_completion_and_the_base_model(client: openai.OpenAI) -> None:
    ask = {"model": "tuned:base", "prompt": "What", "temperature": 0, "max_tokens": 16}
    whole = client.completions.create(**ask)
    chunks = list(client.completions.create(**ask, stream=True))
    assert {c.object for c in chunks} == {"text_completion"}
    text = "".join(c.choices[0].text for c in chunks)
    assert len([c for c in chunks if c.choices[0].text]) >= 3
    assert text == whole.choices[0].text and chunks[-1].choices[0].finish_reason == "length"


def test_openai_client_raises_its_own_errors_for_the_servers_refusals(
    client: openai.OpenAI, server: ServerHandle
) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    wrong = openai.OpenAI(base_url=server.url, api_key="nbt-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        wrong.chat.completions.create(model="tuned", messages=msgs, stream=True)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tuned", messages=msgs, max_tokens=10**6, stream=True)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError, match="use one of tuned, tuned:base"):
        client.chat.completions.create(model="gpt-4", messages=msgs)
    assert [m.id for m in client.models.list()] == ["tuned", "tuned:base"]


def test_tools_for_a_model_whose_template_writes_no_calls_are_a_400_not_silent_text(
    client: openai.OpenAI,
) -> None:
    from nbtrain.examples.tools import TOOLS

    msgs = [{"role": "user", "content": "What's the weather in Oslo?"}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="writes no tool calls nbtrain can read back"):
            client.chat.completions.create(model="tuned", messages=msgs, tools=TOOLS, stream=stream)  # type: ignore[arg-type]
    answer = client.chat.completions.create(
        model="tuned", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=4
    )  # type: ignore[arg-type]
    assert answer.choices[0].message.tool_calls is None  # tool_choice none: the tools are left out
