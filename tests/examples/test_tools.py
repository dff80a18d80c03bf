"""nbtrain.examples.tools: a short tool-calling run teaches a real model to call the right function with the
right arguments on requests no training row makes (greedy generation, before and after)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

import nbtrain
from nbtrain.control.jobs.serve import ServerHandle
from nbtrain.examples.tools import TOOLS, call_accuracy, held_out, parse_call, tool_rows
from tests.conftest import Lab, runs_in

pytestmark = pytest.mark.slow


def test_parse_call_reads_the_first_well_formed_call_only() -> None:
    assert parse_call('ok <call>add {"a": 1, "b": 2}</call> <call>x {}</call>') == ("add", {"a": 1, "b": 2})
    assert parse_call("<call>add {not json}</call>") is None
    assert parse_call('<call>add ["a"]</call>') is None
    assert parse_call("no call here") is None


@pytest.fixture(scope="module")
def tools_run(labs: Callable[[str], Lab]) -> dict[str, Any]:
    """Lab 7's run: SmolLM2 with the tools template, LoRA-trained on tool_rows(600) (whole tool conversations:
    the request, the call, the function's result and the answer from it, every fifth going on to a second
    request; 20 steps), trained once for the lab's test and these; with held-out requests no training row
    makes and the model's accuracy on them before."""
    lab = labs("07_agent")
    rows = tool_rows(600, seed=0)
    data = (lab.dir / "data" / "tools.jsonl").read_text(encoding="utf-8")
    assert data == "".join(json.dumps(r) + "\n" for r in rows), "lab 7 trains on other rows"
    cases = held_out(30, train=rows)  # cities and numbers no row names
    before, _ = call_accuracy(lab.dir / "smollm2-tools", cases)
    with runs_in(lab.dir):
        run = nbtrain.get_run("lab7")
    assert run.status().state == "completed"
    return {"run": run, "cases": cases, "before": before, "dir": lab.dir}


def test_a_short_lora_run_teaches_smollm2_to_call_tools_on_held_out_requests(
    tools_run: dict[str, Any],
) -> None:
    """The tiny models do not learn to copy an argument into a call in a test's budget (examples.tools'
    docstring); SmolLM2-135M-Instruct, the smallest real model here, does in 20 steps."""
    run, cases, before = tools_run["run"], tools_run["cases"], tools_run["before"]
    after, said = call_accuracy(run.output_dir, cases)
    print(f"tool calls right on {len(cases)} held-out requests: before {before:.2f}, after {after:.2f}")
    assert before == 0.0
    assert after >= 0.8, said
    log = run.paths.rank_log(0).read_text()
    assert "nbtrain: a batch of 8 rows" in log  # the plan's padding-free collator decided, batch by batch


@pytest.fixture(scope="module")
def tools_server(tools_run: dict[str, Any]) -> Iterator[ServerHandle]:
    with runs_in(tools_run["dir"]):
        h = tools_run["run"].serve()
    yield h
    if not h.reused:
        h.stop()


def _streamed(client: openai.OpenAI, **ask: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """(content, calls as {id, name, arguments}, finish_reason) put together from a streamed answer."""
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(**ask, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            while len(calls) <= d.index:
                calls.append({"id": "", "name": "", "arguments": ""})
            c = calls[d.index]
            c["id"] += d.id or ""
            c["name"] += (d.function.name or "") if d.function else ""
            c["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_the_openai_client_gets_the_tuned_models_tool_calls_and_sends_the_result_back(
    tools_server: ServerHandle,
) -> None:
    client = openai.OpenAI(
        base_url=tools_server.url, api_key=tools_server.api_key, max_retries=0, timeout=300
    )
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What's the weather in Agra?"}]
    # the example template ends a turn with "<|end|>", which is no token of SmolLM2's: the answer stops there
    ask = {
        "model": "tuned",
        "messages": msgs,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 40,
        "stop": ["<|end|>"],
    }
    whole = client.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Agra"})

    content, calls, finish = _streamed(client, **ask)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Agra"})]

    msgs += [
        choice.message.model_dump(exclude_none=True),  # the call, as the client got it
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    final = client.chat.completions.create(**ask)
    print("after the tool's result:", final.choices[0].message)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content == "It is sunny in Agra."  # the answer from the tool's result

    plain = client.chat.completions.create(**{**ask, "messages": msgs[:1], "tool_choice": "none"})
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in (
        "stop",
        "length",
    )


def test_tool_accuracy_scores_the_tuned_models_calls_against_its_bases(tools_run: dict[str, Any]) -> None:
    from nbtrain.contract.errors import NbtrainError

    cases = tools_run["cases"][:6]

    def wanted(c: dict[str, Any]) -> dict[str, Any]:
        fn = {"name": c["name"], "arguments": json.dumps(c["arguments"])}
        return {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": fn}]}

    rows: list[dict[str, Any]] = [
        {"tools": TOOLS, "messages": [{"role": "user", "content": c["prompt"]}, wanted(c)]} for c in cases
    ]
    answer = {"role": "assistant", "content": "It is sunny in Agra."}  # after the result: an answer, no call
    rows.append(
        {"tools": TOOLS, "messages": [*rows[0]["messages"], {"role": "tool", "content": "sunny"}, answer]}
    )
    with pytest.raises(NbtrainError, match="row 2 offers no tools"):
        nbtrain.tool_accuracy(tools_run["run"], [rows[0], {"messages": rows[0]["messages"]}])
    report = nbtrain.tool_accuracy(tools_run["run"], rows, max_new_tokens=32, stop=["<|end|>"])
    print(report.summary())
    after, before = report.metrics, report.metrics_before
    assert before is not None and before["name_accuracy"] == 0.0 and before["called_when_should"] == 0.0
    assert (
        after["name_accuracy"] >= 0.8
        and after["arguments_exact"] >= 0.7
        and after["called_when_should"] >= 0.8
    )
    assert after["answered_when_should"] == 1.0  # the row that should answer from the result does
    assert nbtrain.latest_tool_accuracy(tools_run["run"]).metrics == after  # kept in eval/tool_calls.json
    table = report.table()
    assert list(table.columns) == ["asked", "expected", "before", "after"] and len(table) == 7
    assert table["expected"][0] == f"{cases[0]['name']}({json.dumps(cases[0]['arguments'])})"
    assert [t.name for t in report.figure().data] == ["base", "tuned"]
