"""The chat widget, driven as a user would (type, press Enter or click Send, read the transcript, Close,
Reopen, Restart) against a real server of the shared tuned run (tests/conftest.py): one server for the
module, which the last test stops under the widget. What the browser sends over the widget's comm (the
text box's value, the Enter key's submit) goes in through the widget's own message handler; the key
handling in the browser is the browser test's (tests/browser/test_chat_browser.py)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nbtrain.control.jobs.serve import ServerHandle, find_server, serve
from nbtrain.ui.chat import ChatWidget
from nbtrain.ui.run import get_run  # the notebook handle: chat is a verb above the control Run

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process


def wait_for(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def frontend(chat: ChatWidget, **data: Any) -> None:
    """A message from the browser's side of the widget, as its comm delivers it."""
    chat.view._handle_msg({"content": {"data": data}, "buffers": []})


def press_enter(chat: ChatWidget, text: str) -> bool:
    """What the text box sends when the user types ``text`` and presses Enter (or clicks Send); True
    when the kernel answered "sent" (the browser then empties the box)."""
    frontend(chat, method="update", state={"value": text})
    sent: list[dict[str, Any]] = []
    real = chat.view.send

    def send(content: dict[str, Any], buffers: Any = None) -> None:  # what goes back to the browser
        sent.append(content)
        real(content, buffers)

    chat.view.send = send  # type: ignore[method-assign]
    try:
        frontend(chat, method="custom", content={"type": "submit", "text": text})
    finally:
        del chat.view.send
    assert sent in ([], [{"type": "sent", "text": text}]), sent
    return bool(sent)


def answered(chat: ChatWidget) -> bool:
    return bool(chat.turns) and not chat.turns[-1].pending and not chat.view.busy


@pytest.fixture(scope="module")
def server(tuned_run: Path) -> Iterator[ServerHandle]:
    h = serve(tuned_run)
    yield h
    h.stop()


@pytest.fixture
def fresh(tuned_run: Path) -> Iterator[list[ChatWidget]]:
    """Widgets a test opens, closed after it; each starts from an empty conversation."""
    opened: list[ChatWidget] = []
    yield opened
    for chat in opened:
        chat.close()
        chat.clear()


def open_chat(opened: list[ChatWidget], tuned_run: Path, **kw: Any) -> ChatWidget:
    chat = get_run(tuned_run).chat(**kw)
    opened.append(chat)
    chat.wait(300)
    assert chat.error is None and chat.server is not None, chat.error
    return chat


def test_replies_stream_into_the_transcript_beside_the_base_model(
    server: ServerHandle, tuned_run: Path, fresh: list[ChatWidget]
) -> None:
    chat = open_chat(fresh, tuned_run, compare_base=True, max_tokens=48)
    chat.refresh_seconds = 0  # every streamed piece is shown: 48 tokens can take less than the throttle
    assert not chat.started_server and chat.server is not None and chat.server.pid == server.pid
    assert chat.view.can_send and [k[0] for k in chat.view.kinds] == ["tuned", "base"]
    run = get_run(tuned_run)
    expected_tuned = run.generate("Say hello.", max_new_tokens=48)[0]  # greedy, through the same server
    expected_base = run.generate("Say hello.", max_new_tokens=48, base=True)[0]

    shown: list[dict[str, Any]] = []  # every state of the reply being answered the browser received
    chat.view.observe(lambda c: shown.append(c["new"]) if c["new"] else None, names="live")
    assert press_enter(chat, "Say hello.")
    wait_for(lambda: answered(chat))
    assert chat.error is None
    turn = chat.turns[-1]
    assert turn.user == "Say hello." and turn.note is None
    assert turn.replies == {"tuned": expected_tuned, "base": expected_base}
    base_parts = [s["replies"]["base"] for s in shown if s["replies"].get("base")]
    assert len(set(base_parts)) > 1, base_parts  # the reply grew in the transcript as it was generated
    assert all(expected_base.startswith(p) for p in base_parts)
    assert chat.view.live is None and chat.view.turns[-1]["replies"] == turn.replies

    chat.clear_button.click()
    assert chat.turns == [] and chat.view.turns == [] and chat.view.live is None

    # the sliders' settings reach the server: with one new token the reply is the greedy one's start
    chat.max_tokens.value = 1
    chat.view.value = "Say hello."
    assert chat.send() and chat.view.value == ""  # from code: the text box's text
    wait_for(lambda: answered(chat))
    short = chat.turns[-1].replies["tuned"]
    assert short and expected_tuned.startswith(short) and len(short) < len(expected_tuned)


def test_enter_sends_once_and_a_message_typed_while_answering_waits_in_the_box(
    server: ServerHandle, tuned_run: Path, fresh: list[ChatWidget]
) -> None:
    chat = open_chat(fresh, tuned_run, compare_base=True, max_tokens=64)
    assert press_enter(chat, "What is 2 + 3?")
    assert chat.view.busy and not chat.view.can_send
    assert not press_enter(chat, "Name a color.")  # Enter again while the first reply streams: kept
    assert len(chat.turns) == 1
    wait_for(lambda: answered(chat))
    frontend(chat, method="custom", content={"type": "submit", "text": "  \n "})  # nothing to send
    assert len(chat.turns) == 1 and chat.view.value == "Name a color."
    assert press_enter(chat, chat.view.value)
    wait_for(lambda: answered(chat) and len(chat.turns) == 2)
    assert [t.user for t in chat.turns] == ["What is 2 + 3?", "Name a color."]
    first = chat.turns[0]
    history = [
        {"role": "user", "content": first.user}, {"role": "assistant", "content": first.replies["tuned"]},
        {"role": "user", "content": "Name a color."},
    ]  # fmt: skip
    # the model saw the conversation so far (its own earlier reply, not the base model's)
    assert chat.turns[1].replies["tuned"] == get_run(tuned_run).generate([history], max_new_tokens=64)[0]


def test_close_keeps_the_conversation_and_reopening_shows_it(
    server: ServerHandle, tuned_run: Path, fresh: list[ChatWidget]
) -> None:
    chat = open_chat(fresh, tuned_run, max_tokens=16)
    press_enter(chat, "What is 10 + 7?")
    wait_for(lambda: answered(chat))
    before = list(chat.view.turns)
    chat.close_button.click()
    assert chat.view not in chat.widget.children
    assert "conversation (1 message) is kept" in chat.closed_note.value
    assert server.alive()  # a server the widget did not start outlives it

    again = open_chat(fresh, tuned_run)  # run.chat() again in the same kernel
    assert again.view.turns == before and again.turns[0].replies["tuned"]
    chat.reopen_button.click()  # or the closed widget's own Reopen
    chat.wait(60)
    assert chat.view in chat.widget.children and chat.view.turns == before and chat.view.can_send


def test_chat_says_when_its_server_is_gone_and_restart_brings_it_back_with_the_conversation(
    server: ServerHandle, tuned_run: Path, fresh: list[ChatWidget]
) -> None:
    chat = open_chat(fresh, tuned_run, max_tokens=16)
    press_enter(chat, "What is 2 + 3?")
    wait_for(lambda: answered(chat))
    first = chat.turns[0].replies["tuned"]

    server.stop()  # e.g. an export cell, or %finetune serve --stop, elsewhere
    wait_for(lambda: chat.gone, timeout=10)  # the widget notices on its own
    assert "The model server has stopped" in chat.status.value and chat.restart_button.layout.display is None
    assert not chat.view.can_send
    assert not press_enter(chat, "Say hello.") and len(chat.turns) == 1  # nothing sent, the text kept

    chat.restart_button.click()
    chat.wait(300)
    assert chat.error is None and not chat.gone and chat.started_server and chat.server is not None
    assert chat.server.alive() and chat.restart_button.layout.display == "none"
    assert chat.turns[0].replies["tuned"] == first and len(chat.view.turns) == 1

    # stopped between the widget's checks: the send itself finds the connection refused
    chat.watch_seconds = 3600.0
    time.sleep(1.5)  # the watcher's current wait ends; its next one is long
    pid = chat.server.pid
    chat.server.stop()
    assert press_enter(chat, "Say hello.")
    wait_for(lambda: answered(chat) and chat.gone)
    assert chat.turns[-1].note is not None and "server stopped" in chat.turns[-1].note
    assert "connection was refused" in chat.status.value
    chat.restart_button.click()  # starts it again and asks the unanswered message again
    chat.wait(300)
    assert chat.server.pid != pid and chat.turns[-1].note is None
    history = [
        {"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": first},
        {"role": "user", "content": "Say hello."},
    ]  # fmt: skip
    assert chat.turns[-1].replies["tuned"] == get_run(tuned_run).generate([history], max_new_tokens=16)[0]
    new_pid = chat.server.pid
    chat.close_button.click()  # the widget started this one: Close stops it
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == psutil.STATUS_ZOMBIE
    assert find_server(tuned_run) is None and "its server stopped" in chat.closed_note.value


def test_chat_surfaces_a_server_error_in_the_widget(tuned_run: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(tuned_run, bare, ignore=shutil.ignore_patterns("output", "checkpoints", "serve.json"))
    chat = ChatWidget(bare)
    chat.wait(60)
    assert chat.error is not None and "no trained weights yet" in chat.error
    assert "no trained weights yet" in chat.status.value and not chat.view.can_send
    chat.close()
