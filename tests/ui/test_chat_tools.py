"""The chat with notebook functions as tools (nbtrain.ui.chat_tools, ChatWidget(tools=...)), on a real
trained model behind the run's real server: the model calls the function, the chat asks, runs it in this
process, sends the result back and the model answers from it; a function that raises shows its traceback
and the conversation goes on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.chat import ChatWidget
from nbtrain.ui.chat_tools import Call, Tools, from_names, run_call
from nbtrain.ui.run import get_run
from tests.conftest import WEATHER_TOOL

CALLED: list[str] = []


def get_weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name
    """
    CALLED.append(city)
    return "sunny"


def broken_weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name
    """
    raise ValueError(f"no weather station in {city}")


broken_weather.__name__ = "get_weather"  # the same tool, as the model knows it, that fails


def _chat(run_dir: Path, **kwargs: Any) -> ChatWidget:
    w = ChatWidget(get_run(run_dir), max_tokens=40, **kwargs)
    w.wait(120)
    assert w.error is None and w.server is not None, w.error
    w.clear()  # the kernel keeps a run's conversation for its next chat: start each test afresh
    return w


def _asked(w: ChatWidget, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if w.asking:
            return w.asking[0]
        time.sleep(0.05)
    raise AssertionError(f"the chat asked nothing; turns: {[t.state() for t in w.turns]}")


def test_a_function_becomes_the_schema_the_server_takes() -> None:
    tools = Tools.of([get_weather])
    assert tools.names == ["get_weather"]
    assert tools.schemas == [WEATHER_TOOL]  # the schema the shared tool run was taught with


def test_a_function_without_hints_or_docstring_is_refused_naming_it_and_the_fix() -> None:
    def vague(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(NbtrainError) as e:
        Tools.of([get_weather, vague])
    assert "vague" in str(e.value) and "type hint" in str(e.value) and "Args:" in str(e.value)
    with pytest.raises(NbtrainError, match="no function named nowhere"):
        from_names("get_weather, nowhere", {"get_weather": get_weather})
    assert from_names("get_weather", {"get_weather": get_weather}) == [get_weather]


def test_a_call_runs_with_its_json_arguments_and_bad_calls_become_errors_the_model_reads() -> None:
    tools = Tools.of([get_weather])
    ok = Call("c1", "get_weather", '{"city": "Oslo"}')
    run_call(tools, ok)
    assert (ok.state, ok.result) == ("done", "sunny") and ok.shown() == "get_weather(city='Oslo')"
    cases = [("nope", "{}", "no tool named 'nope'"), ("get_weather", "{city", "not JSON"),
             ("get_weather", "[1]", "JSON object"),
             ("get_weather", '{"town": "x"}', "TypeError")]  # fmt: skip
    for name, args, says in cases:
        bad = Call("c2", name, args)
        run_call(tools, bad)
        assert bad.state == "error" and says in bad.result, bad.result
    boom = Call("c3", "get_weather", '{"city": "Oslo"}')
    run_call(Tools.of([broken_weather]), boom)
    assert boom.state == "error" and "ValueError: no weather station in Oslo" in boom.result
    assert "Traceback" in boom.result and "run_call" not in boom.result  # from the function down


@pytest.mark.slow
def test_the_model_calls_the_notebook_function_after_a_yes_and_answers_from_its_result(
    tool_chat_run: Path,
) -> None:
    w = _chat(tool_chat_run, tools=[get_weather])
    try:
        CALLED.clear()
        assert w.send("Weather in Paris?")
        call_id = _asked(w)
        assert CALLED == []  # nothing runs before the user says yes
        (turn,) = w.turns
        call = next(p for p in turn.steps["tuned"] if isinstance(p, Call))
        assert call.state == "asking" and call.shown() == "get_weather(city='Paris')"
        assert "get_weather(city='Paris')" in json.dumps(w.view.live)  # shown in the transcript
        assert w.decide(call_id, run=True)
        w.wait(120)
        assert CALLED == ["Paris"] and call.state == "done" and call.result == "sunny"
        assert turn.pending == [] and turn.note is None
        assert "It is sunny in Paris." in turn.replies["tuned"], turn.replies
        # what the model saw of the turn: its call, the result, its answer
        roles = [m["role"] for m in turn.messages["tuned"]]
        assert roles == ["assistant", "tool", "assistant"]
        assert turn.messages["tuned"][1]["content"] == "sunny"

        # the user says no: the model is told so and the function never runs (a new conversation: the
        # model was taught single requests)
        w.clear()
        assert w.send("Weather in Paris?")
        w.decide(_asked(w), run=False)
        w.wait(120)
        skipped = next(p for p in w.turns[0].steps["tuned"] if isinstance(p, Call))
        assert skipped.state == "skipped" and CALLED == ["Paris"] and w.turns[0].pending == []
        assert w.turns[0].messages["tuned"][1]["content"] == "the user did not let this call run"
    finally:
        w.close()


@pytest.mark.slow
def test_a_raising_function_shows_its_traceback_and_the_conversation_goes_on(tool_chat_run: Path) -> None:
    w = _chat(tool_chat_run, tools=[broken_weather], confirm_tools=False)
    try:
        assert w.confirm_tools.value is False
        assert w.send("Weather in Paris?")
        w.wait(120)
        (turn,) = w.turns
        call = next(p for p in turn.steps["tuned"] if isinstance(p, Call))
        assert call.state == "error" and "ValueError: no weather station in Paris" in call.result
        assert "Traceback" in json.dumps(w.view.turns)  # in the transcript
        assert turn.pending == [] and turn.note is None and w.error is None
        assert turn.messages["tuned"][1]["content"] == call.result  # the model was told what went wrong
        assert w.send("Thanks!")  # and the chat goes on
        w.wait(120)
        assert len(w.turns) == 2 and w.turns[1].pending == [] and w.turns[1].note is None
    finally:
        w.close()


def test_a_call_cut_off_by_max_tokens_shows_as_a_malformed_call_and_nothing_runs(tool_chat_run: Path) -> None:
    w = _chat(tool_chat_run, tools=[get_weather], confirm_tools=False)
    try:
        CALLED.clear()
        w.max_tokens.value = 6  # the call begins and is cut off: '<call>get_weather {"ci'
        assert w.send("Weather in Paris?")
        w.wait(120)
        (turn,) = w.turns
        (step,) = turn.steps["tuned"]
        assert not isinstance(step, Call) and step["type"] == "malformed", turn.state()
        assert (
            step["text"].startswith("<call>") and "not written as <call>NAME {JSON}</call>" in step["error"]
        )
        assert CALLED == [] and turn.pending == [] and turn.note is None
        assert '"type": "malformed"' in json.dumps(w.view.turns)  # the transcript draws it as a call
    finally:
        w.close()


@pytest.mark.slow
def test_a_tool_calling_chat_loads_nothing_heavy_in_the_kernel(tool_chat_run: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    kernel = f"""
import sys
from nbtrain.ui.chat import ChatWidget

def get_weather(city: str) -> str:
    '''Today's weather in a city.

    Args:
        city: the city's name
    '''
    return "sunny"

w = ChatWidget({str(tool_chat_run)!r}, tools=[get_weather], confirm_tools=False, max_tokens=40)
w.wait(120)
w.clear()
assert w.send("Weather in Paris?")
w.wait(120)
print("ANSWER", w.turns[0].replies["tuned"])
w.close()
heavy = ("torch", "bitsandbytes", "llama_cpp", "transformers.modeling_utils", "peft")
print("LEAKED", sorted(m for m in heavy if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ANSWER It is sunny in Paris." in proc.stdout and "LEAKED []" in proc.stdout, proc.stdout
