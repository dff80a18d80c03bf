"""A generation request's settings as the OpenAI API spells them (max_tokens, temperature, top_p, seed, stop,
n), checked into ``Params``; what this server does not do refused rather than ignored; and ``RequestError``,
the one error a request the engine cannot answer raises (HTTP 400 by default)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes
MAX_STOP_CHARS = 256


class RequestError(ValueError):
    """A request the engine cannot answer; the message says what to change (HTTP 400 by default)."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
        raise RequestError(f"{key} must be a number from {lo:g} to {hi:g}, not {v!r}", key)
    return float(v)


@dataclass
class Params:
    """OpenAI-style generation settings, checked. ``max_tokens`` None: the default, as far as the
    context allows."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> Params:
        p = cls()
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        mt = body.get(key)
        if mt is not None:
            if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
                raise RequestError(f"{key} must be a positive integer, not {mt!r}", key)
            p.max_tokens = mt
        temperature = _number(body, "temperature", 0.0, 2.0)
        if temperature is not None:
            p.temperature = temperature
        top_p = _number(body, "top_p", 0.0, 1.0)
        if top_p is not None:
            p.top_p = top_p
        seed = body.get("seed")
        if seed is not None:
            lo, hi = SEED_RANGE
            if not isinstance(seed, int) or isinstance(seed, bool) or not lo <= seed <= hi:
                raise RequestError(f"seed must be an integer from -2**63 to 2**64-1, not {seed!r}", "seed")
            p.seed = seed
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None:
            if (
                not isinstance(stop, list)
                or not 0 < len(stop) <= 4
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)
            ):
                raise RequestError(
                    f"stop must be a non-empty string or a list of up to 4 of them, each at most "
                    f"{MAX_STOP_CHARS} characters",
                    "stop",
                )
            p.stop = stop
        n = body.get("n", 1)
        if n != 1 or isinstance(n, bool):
            raise RequestError("n must be 1: this server returns one choice per request", "n")
        for key, asks in UNHONOURED.items():  # a 400 rather than a 200 that quietly ignores them
            if asks(body.get(key)):
                raise RequestError(
                    f"{key} is not supported by this server (nbtrain's built-in one) and would be ignored: "
                    f"leave it out",
                    key,
                )
        return p


# What this server does not do, as a request asks for it (a client's defaults, 0 and empty, pass).
UNHONOURED: dict[str, Callable[[Any], bool]] = {
    "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v not in (None, 0),
    "logit_bias": lambda v: bool(v),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "presence_penalty": lambda v: v not in (None, 0),
    "frequency_penalty": lambda v: v not in (None, 0),
    "suffix": lambda v: bool(v),
    "echo": lambda v: bool(v),
    "best_of": lambda v: v not in (None, 1),
}
