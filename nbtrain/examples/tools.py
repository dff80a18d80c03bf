"""Tool calling on the tiny models: a chat template that renders ``tools`` and ``tool_calls``, rows of three
functions (OpenAI's format: ``tools`` schemas, assistant ``tool_calls`` with JSON-string arguments, ``tool``
results), held-out requests (cities and numbers no row names), and how well a model calls them.

    get_weather(city)          "What's the weather in Oslo?"      -> <call>get_weather {"city": "Oslo"}</call>
    add(a, b)                  "Add 12 and 7."                    -> <call>add {"a": 12, "b": 7}</call>
    convert(amount, currency)  "How much is 40 in EUR?"           -> <call>convert {"amount": 40, ...}</call>

``tool_model(src, dest)`` copies a model folder (the tiny model, the shipped tiny-adder) with
``TOOLS_TEMPLATE`` as its chat template; ``call_accuracy`` greedy-generates an answer to each held-out
request and counts the well-formed calls to the right function with the right arguments. Importing this
module imports nothing heavy; ``call_accuracy`` needs torch and transformers (a worker or a test).

Measured (CPU, full fine-tuning of the tiny-adder, batch 16, seed 0): after 150-400 steps it calls the right
function for nearly every held-out request, but with arguments it has memorised, not the ones asked for
(0 of 30 right): this model does not yet learn to copy an argument into the call in that budget. The real
SmolLM2-135M-Instruct (``nbtrain.example_model(name="smollm2-135m-instruct")``) with this template does:
LoRA r 16, batch 8, learning rate 3e-3 (cosine, 3 warm-up steps), assistant_only_loss, 0 of 30 right
before: on the request-and-call part of 600 rows, 12 steps: 28 of 30 after (~90 s on 2 cores); on the
whole rows (the call, then the answer from the function's result), 20 steps: 29 of 30 after, and given the
result it answers from it ("It is sunny in Agra."), ~2 min (tests/test_examples.tools.py, seed 0).
Trained on single exchanges only, a chat's second request after "Add 123 and 456." got ``<call>579``;
with every fifth row going on with a second request (``MULTI_TURN``; 14% more tokens a step), lab 7's run
(20 steps, seed 0) calls right on 10 of 10 held-out requests, and after "Add 123 and 456." the chat's
next three requests (the weather in Lyon, 70 in GBP, 5 plus 8) each get the right call.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

# The tools on one line ("You may call: get_weather(city) add(a, b) ..."): the tiny models hold 256
# positions, which whole JSON schemas would fill. Calls are "<call>NAME {JSON arguments}</call>", results
# "NAME: RESULT"; the assistant's turns are in {% generation %} blocks (assistant_only_loss).
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call:{% for t in tools %}{% set p = t['function'].get('parameters') "
    "or {} %} {{ t['function']['name'] }}({{ (p.get('properties') or {}) | join(', ') }}){% endfor %}"
    "<|end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] or [] %}<call>{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}</call>{% endfor %}<|end|>{% endgeneration %}\n"
    "{% elif m['role'] == 'tool' %}<|tool|>\n{{ m['name'] }}: {{ m['content'] }}<|end|>\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _fn(name: str, description: str, **params: str) -> dict[str, Any]:
    props = {k: {"type": t} for k, t in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(params)},
        },
    }


TOOLS = [
    _fn("get_weather", "today's weather in a city", city="string"),
    _fn("add", "the sum of two numbers", a="integer", b="integer"),
    _fn("convert", "an amount of money in another currency", amount="integer", currency="string"),
]
# Towns made of two or three syllables, a new one in nearly every row: the model learns to copy the town it
# is asked about into the call, since it cannot learn a list of them.
ONSETS = list("bdfgklmnprstvz")
VOWELS = list("aeiou")
HELD_OUT_CITIES = ["Agra", "Bari", "Cali", "Dili", "Essen", "Fes", "Kiel", "Male", "Perm", "Tours"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "INR"]
ASK = {
    "get_weather": ["What's the weather in {city}?", "Is it sunny in {city}?", "Weather for {city}, please."],
    "add": ["Add {a} and {b}.", "What is {a} plus {b}?", "Sum {a} and {b} for me."],
    "convert": ["Convert {amount} to {currency}.", "How much is {amount} in {currency}?"],
}  # fmt: skip
SKY = ["sunny", "rainy", "cloudy", "windy"]


def town(rng: random.Random) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 3))).capitalize()


def _case(rng: random.Random, name: str, cities: list[str] | None) -> tuple[str, dict[str, Any]]:
    if name == "get_weather":
        args: dict[str, Any] = {"city": rng.choice(cities) if cities else town(rng)}
    elif name == "add":
        args = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}
    else:
        args = {"amount": rng.randint(1, 999), "currency": rng.choice(CURRENCIES)}
    return rng.choice(ASK[name]).format(**args), args


def _result(name: str, args: dict[str, Any], rng: random.Random) -> tuple[str, str]:
    """(the function's result, the assistant's answer from it)."""
    if name == "get_weather":
        sky = rng.choice(SKY)
        return sky, f"It is {sky} in {args['city']}."
    if name == "add":
        total = str(args["a"] + args["b"])
        return total, total
    value = f"{args['amount'] * 2} {args['currency']}"
    return value, f"That is {value}."


MULTI_TURN = 5  # every 5th row goes on after an earlier exchange, as a chat does after its first question


def _exchange(rng: random.Random, name: str, call_id: str) -> list[dict[str, Any]]:
    """One request to ``name`` in four messages: the request, the call, its result and the answer."""
    prompt, args = _case(rng, name, None)
    result, answer = _result(name, args, rng)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": answer},
    ]


def tool_rows(n: int = 600, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` chats, the three functions in turn: the request, the call, its result and the answer; every
    ``MULTI_TURN``-th chat after an earlier exchange (a random function's), so that a second request in a
    chat is answered with a call too, not with the first one's result."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name = TOOLS[i % len(TOOLS)]["function"]["name"]
        earlier = []
        if i % MULTI_TURN == MULTI_TURN - 1:
            earlier = _exchange(rng, rng.choice(TOOLS)["function"]["name"], f"call{i}a")
        rows.append({"tools": TOOLS, "messages": [*earlier, *_exchange(rng, name, f"call{i}")]})
    return rows


def held_out(n: int = 30, seed: int = 1, train: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``n`` requests no training row makes: cities of ``HELD_OUT_CITIES``, and number arguments that
    ``train`` (default: ``tool_rows()``) never calls with. Each ``{"prompt", "name", "arguments"}``."""
    seen = {
        json.dumps(json.loads(m["tool_calls"][0]["function"]["arguments"]), sort_keys=True)
        for row in (tool_rows() if train is None else train)
        for m in row["messages"]
        if m.get("tool_calls")
    }
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        name = TOOLS[len(out) % len(TOOLS)]["function"]["name"]
        prompt, args = _case(rng, name, HELD_OUT_CITIES)
        if json.dumps(args, sort_keys=True) in seen:
            continue
        out.append({"prompt": prompt, "name": name, "arguments": args})
    return out


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The first ``<call>NAME {JSON}</call>`` in ``text`` as (name, arguments), whatever follows it (the
    template's ``<|end|>`` is no token of the model's, so a greedy answer runs on past it); None if there is
    none or its arguments are not a JSON object (contract/tools.parse_tool_calls, the server's reader)."""
    from nbtrain.contract.tools import parse_tool_calls

    end = text.find("</call>")
    parsed = parse_tool_calls(text[: end + len("</call>")] if end >= 0 else text, "nbtrain")
    if parsed.error or not parsed.calls:
        return None
    return parsed.calls[0]["name"], parsed.calls[0]["arguments"]


def _link_or_copy(src: str, dst: str) -> None:
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return  # linked by an earlier call (the lab's cell run again)
    try:
        os.link(src, dst)  # a model's weights are not copied where a hard link will do
    except OSError:
        shutil.copy2(src, dst)


def tool_model(src: str | Path, dest: str | Path) -> Path:
    """A copy of the model folder ``src`` whose chat template is ``TOOLS_TEMPLATE`` (files hard-linked
    where possible; the two it changes are written anew, never through a link)."""
    out = Path(dest)
    shutil.copytree(src, out, dirs_exist_ok=True, copy_function=_link_or_copy)
    template = out / "chat_template.jinja"
    template.unlink(missing_ok=True)
    template.write_text(TOOLS_TEMPLATE, encoding="utf-8")
    config = out / "tokenizer_config.json"
    if config.is_file():  # a template stored in the tokenizer's config would win over the file
        data = json.loads(config.read_text(encoding="utf-8"))
        if data.pop("chat_template", None) is not None:
            config.unlink()
            config.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return out


def call_accuracy(model_dir: str | Path, cases: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """The share of ``cases`` (``held_out``) that the model at ``model_dir`` answers, greedily, with a
    well-formed call to the right function with the right arguments; and its answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbtrain.examples.pretrained import answers

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tools: list[Any] = list(TOOLS)
    prompts = [
        str(
            tok.apply_chat_template(
                [{"role": "user", "content": c["prompt"]}],
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for c in cases
    ]
    said = answers(model, tok, prompts, max_new_tokens=48)
    right = [parse_call(s) == (c["name"], c["arguments"]) for s, c in zip(said, cases, strict=True)]
    return sum(right) / len(cases), said
