"""The chat widget, driven as a user would (type, click Send, read the transcript, Close), against a real
server it starts for the shared tuned run (tests/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from nbtrain.runs import get_run
from nbtrain.serve.control import find_server
from nbtrain.ui.chat import ChatWidget

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process


def wait_for(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_chat_compare_base_shows_both_answers_and_close_stops_its_server(tuned_run: Path) -> None:
    run = get_run(tuned_run)
    chat = run.chat(compare_base=True, max_tokens=12)
    assert isinstance(chat, ChatWidget)
    chat.wait(300)
    assert chat.error is None and chat.server is not None and chat.started_server
    assert not chat.send_button.disabled
    pid = chat.server.pid
    expected_tuned = run.generate("Say hello.", max_new_tokens=12)  # through the widget's server

    chat.text.value = "Say hello."
    chat.send_button.click()
    wait_for(lambda: chat.turns[-1][2] is not None or chat.error is not None)
    assert chat.error is None
    user, tuned, base = chat.turns[-1]
    assert user == "Say hello." and [tuned] == expected_tuned and base is not None and base != tuned
    assert "<b>tuned</b>" in chat.transcript.value and "<b>base</b>" in chat.transcript.value
    assert chat.text.value == ""

    chat.clear_button.click()
    assert chat.turns == [] and "tuned" not in chat.transcript.value

    # the sliders' settings reach the server: with one new token the reply is the greedy one's start
    chat.max_tokens.value = 1
    chat.send("Say hello.")
    wait_for(lambda: chat.turns[-1][2] is not None or chat.error is not None)
    short = chat.turns[-1][1]
    assert chat.error is None and len(chat.turns) == 1 and short is not None
    assert expected_tuned[0].startswith(short) and len(short) < len(expected_tuned[0])

    chat.close_button.click()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert find_server(run) is None and chat.send_button.disabled


def test_chat_surfaces_a_server_error_in_the_widget(tuned_run: Path, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tuned_run, bare, ignore=shutil.ignore_patterns("output", "checkpoints", "serve.json"))
    chat = ChatWidget(bare)
    chat.wait(60)
    assert chat.error is not None and "no trained weights yet" in chat.error
    assert "no trained weights yet" in chat.status.value and chat.send_button.disabled
    chat.close()
