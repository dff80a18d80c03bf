"""Continuous batching for the built-in server: transformers' ContinuousBatchingManager, one per model and
decoding mode, shared by every request thread.

Concurrent requests are generated together: each step of the manager's loop runs one forward over every
active request (a new one's prompt joins as the others decode), so eight clients get close to eight times
one client's tokens/s instead of waiting in line. transformers' manager owns the scheduling, the paged KV
cache and the sampling; this module gives it the server's contract: a request's tokens streamed to its
thread as they come, stopped when its client leaves or a stop string appears, its finish reason.

The manager decides greedy or sampled for all its requests (its generation config), and samples with the
per-request temperature / top_p it is given; a request's own random seed it cannot honour, so seeded
sampling stays on the engine's one-at-a-time path. Measured in bench/bench_serving.py.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_S = 0.05  # how often a waiting request looks at its cancel check
BLOCK_SIZE = 32  # tokens a page of the KV cache
# Tokens the KV cache holds across the requests in flight (SmolLM2-135M: 46 KiB a token in fp32, so 0.75
# GiB); more requests than fit wait for room, as transformers' scheduler decides.
CACHE_TOKENS = 16384


@dataclass
class Generated:
    tokens: list[int]
    finished: bool  # the manager ended it (end-of-sequence or max tokens), not a stop or a cancel


class Batcher:
    """One ContinuousBatchingManager over ``model`` (greedy, or sampling with per-request temperature and
    top_p), and a thread that hands each result to the request it belongs to."""

    def __init__(self, model: Any, *, sampling: bool, pad_token_id: int | None, context: int) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        gen = GenerationConfig(
            do_sample=sampling,
            max_new_tokens=context,
            pad_token_id=pad_token_id,
            eos_token_id=-1,  # every request names its own
            # not the neutral 1.0: transformers builds a warper only for a setting that does something, and
            # every request then gives its own values (these defaults are never used)
            **({"temperature": 0.5, "top_p": 0.5, "top_k": 0} if sampling else {}),
        )
        cb = ContinuousBatchingConfig(
            page_size=BLOCK_SIZE,
            per_request_processors=True,  # each request its own temperature and top_p
            num_blocks=-(-max(context, CACHE_TOKENS) // BLOCK_SIZE),  # one full-context request always fits
            max_batch_tokens=max(512, min(context, 2048)),
        )
        self.sampling = sampling
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.manager.start()
        self._queues: dict[str, queue.Queue[Any]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._route, name="nbtrain-batcher", daemon=True)
        self._thread.start()

    def _route(self) -> None:
        """Hand every result the manager produces to its request's queue."""
        while not self._closed.is_set():
            out = self.manager.get_result(timeout=0.1)
            if out is None:
                continue
            with self._lock:
                q = self._queues.get(out.request_id)
            if q is not None:
                q.put(out)

    def generate(
        self,
        input_ids: list[int],
        *,
        max_tokens: int,
        eos: list[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        on_tokens: Callable[[list[int]], bool] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Generated:
        """Generate for ``input_ids``. ``on_tokens`` gets the tokens so far after each step and returns True
        to stop there (a stop string); ``cancel`` is checked while waiting (the client left). Raises
        RuntimeError with the manager's message when the request failed."""
        rid = uuid.uuid4().hex
        q: queue.Queue[Any] = queue.Queue()
        with self._lock:
            self._queues[rid] = q
        extra = {"temperature": float(temperature), "top_p": float(top_p)} if self.sampling else {}
        try:
            self.manager.add_request(
                list(input_ids), request_id=rid, max_new_tokens=max_tokens, streaming=True,
                eos_token_id=list(eos) or -1, **extra,
            )  # fmt: skip
            tokens: list[int] = []
            while True:
                try:
                    out = q.get(timeout=POLL_S)
                except queue.Empty:
                    if cancel is not None and cancel():
                        self.manager.cancel_request(rid)
                        return Generated(tokens, False)
                    if not self.manager.is_running():
                        raise RuntimeError("the batching loop stopped") from None
                    continue
                if out.error:
                    raise RuntimeError(str(out.error))
                tokens = list(out.generated_tokens)
                stop = on_tokens is not None and on_tokens(tokens)
                if out.is_finished():
                    return Generated(tokens, not stop)
                if stop or (cancel is not None and cancel()):
                    self.manager.cancel_request(rid)
                    return Generated(tokens, False)
        finally:
            with self._lock:
                self._queues.pop(rid, None)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(Exception):
            self.manager.stop(block=True, timeout=10)
        self._thread.join(5)
