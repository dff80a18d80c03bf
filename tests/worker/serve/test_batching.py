"""Continuous batching in the built-in server (serve/batching.py): concurrent requests, tuned and base at
once, are answered as each would be alone; a stop string and max_tokens end a batched answer; the engine
without batching (NBTRAIN_SERVE_BATCHING=0) answers the same."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbtrain.control.jobs.serve import ServerHandle, serve
from tests.conftest import TUNED_ANSWERS
from tests.worker.serve.test_server import greedy

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process

PROMPTS = list(TUNED_ANSWERS)


@pytest.fixture(scope="module")
def server(tuned_run: Path) -> Iterator[ServerHandle]:
    h = serve(tuned_run)
    yield h
    h.stop()


def _answer(server: ServerHandle, prompt: str, model: str, **extra: Any) -> dict[str, Any]:
    out = greedy(server, prompt, model, **extra)
    return {"text": out["choices"][0]["message"]["content"], "finish": out["choices"][0]["finish_reason"],
            "tokens": out["usage"]["completion_tokens"]}  # fmt: skip


def test_concurrent_requests_of_both_models_are_answered_as_each_alone(server: ServerHandle) -> None:
    asks = [(p, m) for p in PROMPTS for m in ("tuned", "tuned:base")]
    alone = {a: _answer(server, *a) for a in asks}
    together: dict[tuple[str, str], dict[str, Any]] = {}
    errors: list[BaseException] = []

    def one(a: tuple[str, str]) -> None:
        try:
            together[a] = _answer(server, *a)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(a,)) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert together == alone
    # the tuned model is the adapter merged, the base the model without it: each answers as itself
    assert [alone[(p, "tuned")] for p in PROMPTS] != [alone[(p, "tuned:base")] for p in PROMPTS]


def test_a_stop_string_and_max_tokens_end_a_batched_answer(server: ServerHandle) -> None:
    full = _answer(server, PROMPTS[1], "tuned:base")
    assert len(full["text"]) > 4, full
    stop = full["text"][3:5]
    cut = _answer(server, PROMPTS[1], "tuned:base", stop=[stop])
    assert cut["finish"] == "stop" and cut["text"] == full["text"][: full["text"].index(stop)]
    short = _answer(server, PROMPTS[1], "tuned", max_tokens=2)
    assert short["finish"] == "length" and short["tokens"] == 2


def test_without_batching_the_engine_answers_the_same(server: ServerHandle, tuned_run: Path) -> None:
    batched = [_answer(server, p, "tuned") for p in PROMPTS]
    server.stop()
    os.environ["NBTRAIN_SERVE_BATCHING"] = "0"
    try:
        plain = serve(tuned_run)
        try:
            assert [_answer(plain, p, "tuned") for p in PROMPTS] == batched
        finally:
            plain.stop()
    finally:
        del os.environ["NBTRAIN_SERVE_BATCHING"]
