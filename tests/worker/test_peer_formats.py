"""Every peer's row shape trains through the real worker (CPU, tiny model, 2 steps): rows written for
LLaMA-Factory, ms-swift and OpenAI (our own rows), one file per shape. Files of one objective are the
sources of one run (``data: train:`` as a list: each source's format detected, normalised by the worker and
tokenised whole by the trainer before its first step), so four processes cover them: SFT, SFT with tool
calls (a copy of the tiny model whose chat template renders ``tools`` and ``tool_calls``:
nbtrain.examples.tools), DPO and KTO."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.examples.tools import tool_model
from tests.conftest import runs_in

pytestmark = pytest.mark.slow

CITIES = ["Oslo", "Rome", "Lima", "Pune", "Kyiv", "Nice", "Baku", "Bern"]
SCHEMA = {"name": "weather", "description": "today's weather", "parameters": {"type": "object"}}


def u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def gpt(text: str) -> dict[str, str]:
    return {"from": "gpt", "value": text}


def sums(i: int) -> tuple[str, str]:
    return f"What is {i} + {i + 1}?", str(2 * i + 1)


SFT = {  # file -> (rows, the format nbtrain reads them as)
    "lf_alpaca.jsonl": (
        [
            {"instruction": sums(i)[0], "input": "", "output": sums(i)[1], "system": "Add.",
             "history": [["Ready?", "Yes."]]}
            for i in range(8)
        ],
        "alpaca",
    ),
    "swift_messages.jsonl": (
        [{"system": "Add.", "messages": [u(sums(i)[0]), a(sums(i)[1])]} for i in range(8)], "messages"
    ),
    "swift_pairs.jsonl": (
        [{"conversation": [{"human": sums(i)[0], "assistant": sums(i)[1]}]} for i in range(8)], "sharegpt"
    ),
    "swift_query.jsonl": (
        [{"question": sums(i)[0], "answer": sums(i)[1], "history": [["Hi", "Hello"]]} for i in range(8)],
        "alpaca",
    ),
    "swift_loss.jsonl": (  # per-message loss flags: the first answer is not trained on
        [{"messages": [u("Hi"), a("Whatever.") | {"loss": False}, u(sums(i)[0]),
                       a(sums(i)[1]) | {"loss": True}]} for i in range(8)],
        "messages",
    ),
    "openai_weight.jsonl": (
        [{"messages": [u("Hi"), a("Meh.") | {"weight": 0}, u(sums(i)[0]), a(sums(i)[1]) | {"weight": 1}]}
         for i in range(8)],
        "messages",
    ),
}  # fmt: skip


def openai_tools(city: str) -> dict[str, Any]:
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "weather", "arguments": json.dumps({"city": city})},
    }
    return {
        "tools": [{"type": "function", "function": SCHEMA}],
        "messages": [u(f"Weather in {city}?"), {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c0", "content": "sunny"}, a(f"{city}: sunny.")],
    }  # fmt: skip


def glaive(city: str) -> dict[str, Any]:
    return {
        "conversations": [
            {"from": "human", "value": f"Weather in {city}?"},
            {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": {"city": city}})},
            {"from": "observation", "value": json.dumps({"sky": "rain"})},
            {"from": "gpt", "value": f"{city}: rain."},
        ],
        "tools": json.dumps([SCHEMA]),
    }


def swift_tools(city: str) -> dict[str, Any]:
    call = json.dumps({"name": "weather", "arguments": {"city": city, "days": 2}})
    return {
        "tools": json.dumps([{"type": "function", "function": SCHEMA}]),
        "messages": [u(f"{city} this week?"), {"role": "tool_call", "content": call},
                     {"role": "tool_response", "content": "snow"}, a(f"{city}: snow.")],
    }  # fmt: skip


TOOLS = {
    "openai_tools.jsonl": ([openai_tools(c) for c in CITIES], "messages"),
    "lf_glaive.jsonl": ([glaive(c) for c in CITIES], "sharegpt"),
    "swift_tools.jsonl": ([swift_tools(c) for c in CITIES], "messages"),
}
DPO = {
    "lf_sharegpt_pref.jsonl": (
        [{"conversations": [{"from": "human", "value": sums(i)[0]}], "chosen": gpt(sums(i)[1]),
          "rejected": gpt("no idea")} for i in range(8)],
        "preference",
    ),
    "swift_rejected.jsonl": (
        [{"messages": [u(sums(i)[0]), a(sums(i)[1])], "rejected_response": "42"} for i in range(8)],
        "preference",
    ),
    "openai_pref.jsonl": (
        [{"input": {"messages": [u(sums(i)[0])]}, "preferred_output": [a(sums(i)[1])],
          "non_preferred_output": [a("seven")]} for i in range(8)],
        "preference",
    ),
}  # fmt: skip
KTO = {
    "lf_kto.jsonl": (
        [{"conversations": [{"from": "human", "value": sums(i)[0]},
                            {"from": "gpt", "value": sums(i)[1] if i % 2 else "?"}], "kto_tag": bool(i % 2)}
         for i in range(8)],
        "unpaired",
    ),
    "swift_kto.jsonl": (
        [{"messages": [u(sums(i)[0]), a(sums(i)[1] if i % 2 else "?")], "label": bool(i % 2)}
         for i in range(8)],
        "unpaired",
    ),
}  # fmt: skip
RUNS = {  # run name -> (model, objective, files)
    "sft": ("tiny-llama", "sft", SFT),
    "tools": ("tiny-tools", "sft", TOOLS),
    "dpo": ("tiny-llama", "dpo", DPO),
    "kto": ("tiny-llama", "kto", KTO),
}


def config(model: str, objective: str, files: dict[str, Any]) -> str:
    sources = "".join(f"    - {{path: data/{name}}}\n" for name in files)
    return (
        f"model: ./{model}\nmethod: lora\nobjective: {objective}\ndata:\n  train:\n{sources}"
        "train:\n  max_steps: 2\n  per_device_train_batch_size: 4\n  logging_steps: 1\n"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, nbtrain.Run]]:
    work = tmp_path_factory.mktemp("peers")
    (work / "tiny-llama").symlink_to(tiny_model)
    tool_model(tiny_model, work / "tiny-tools")  # its chat template renders tools and tool calls
    (work / "data").mkdir()
    for _model, _objective, files in RUNS.values():
        for name, (rows, _fmt) in files.items():
            (work / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with runs_in(work):
        started = {name: nbtrain.finetune(config(*spec), name=name) for name, spec in RUNS.items()}
        for run in started.values():
            st = run.wait(timeout=600)
            assert st.state == "completed" and st.step == 2, run.logs(60)
        yield started


@pytest.mark.parametrize(
    ("run", "name"), [(run, name) for run, (_m, _o, files) in RUNS.items() for name in files]
)
def test_each_peer_shape_trains_two_steps(runs: dict[str, nbtrain.Run], run: str, name: str) -> None:
    fmt = RUNS[run][2][name][1]
    log = runs[run].logs(400)
    assert f"data/{name} ({fmt})" in log, log[-2000:]
    assert runs[run].resolved["data"]["sources"][list(RUNS[run][2]).index(name)]["format"] == fmt
    assert runs[run].metrics()["loss"].notna().sum() == 2


def test_tools_reach_the_chat_template(runs: dict[str, nbtrain.Run]) -> None:
    with runs_in(runs["tools"].dir.parent.parent):
        pv = nbtrain.preview("tools", n=3, stats_rows=8)
    text = pv.text()
    assert "You may call: weather()" in text
    assert '<call>weather {"city": "Oslo"}</call>' in text and "weather: sunny" in text


def test_loss_flags_train_only_the_turns_marked(runs: dict[str, nbtrain.Run]) -> None:
    assert "the rows mark which turns to train (loss / weight)" in runs["sft"].logs(400)
