"""The built-in server's OpenAI-compatible API, a FastAPI application over the Engine (uvicorn runs it,
``server.py`` starts it, ``limits.py`` bounds its connections):

    GET /health                 liveness, no key
    GET /v1/models              the tuned and the base model
    POST /v1/chat/completions   messages (images, tools) -> an answer, or server-sent events with stream
    POST /v1/completions        a prompt, or a list of them -> their completions

Every ``/v1`` route needs ``Authorization: Bearer KEY`` (401 otherwise). A request's body must come with
one Content-Length (411 for none or a chunked body), of at most 8 MiB (413), all within the request timeout
(408), and be a JSON object whose numbers are numbers (no NaN). A generation runs on a worker thread and
stops as soon as its client goes away (the log says "went away: stopped after N of M"); a stream's client
that stops reading for the request timeout is dropped. Every error is an OpenAI-style JSON error object;
once a stream's 200 has gone out, an error is its last event.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from nbtrain.contract.jsonbound import TooDeep, loads
from nbtrain.worker.serve.engine import Cancelled, Engine, Output, Prompt
from nbtrain.worker.serve.limits import error_body
from nbtrain.worker.serve.request import Params, RequestError
from nbtrain.worker.serve.tools import HoldCalls, ToolRequest, openai_calls
from nbtrain.worker.serve.tools import message as tool_message

MAX_BODY = 8 * 1024 * 1024
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


class ClientGone(Exception):
    """The client closed its connection; nothing is left to answer."""


def say(message: str) -> None:
    """A line in the server's log (its stderr is logs/serve.log)."""
    print(f"nbtrain serve: {message}", file=sys.stderr, flush=True)


def _json(status: int, body: dict[str, Any], *, close: bool = False, **headers: str) -> JSONResponse:
    if close:  # the body was not read: what follows on the connection is not a request
        headers["Connection"] = "close"
    return JSONResponse(body, status_code=status, headers=headers)


def _failure(e: RequestError, *, close: bool = False) -> JSONResponse:
    return _json(e.status, error_body(str(e), e.param, code=e.code), close=close)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _usage(outs: list[Output]) -> dict[str, int]:
    p, c = sum(o.prompt_tokens for o in outs), sum(o.completion_tokens for o in outs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# ----------------------------------------------------------------------------------- the body
async def read_body(request: Request, timeout: float) -> dict[str, Any]:
    """The request's JSON object, its framing checked first, all of it within ``timeout`` seconds (h11
    has already refused a Content-Length that is not one whole number)."""
    if request.headers.get("transfer-encoding"):
        raise RequestError(
            "chunked request bodies are not supported; send the JSON body with a Content-Length", status=411
        )
    given = request.headers.get("content-length")
    if given is None:
        raise RequestError("the request has no Content-Length; send a JSON body with it", status=411)
    length = int(given)  # h11 has refused any that is not one whole number (limits.py)
    if length == 0:
        raise RequestError("the request has no JSON body")
    if length > MAX_BODY:
        raise RequestError(f"the request body is over {MAX_BODY} bytes ({length})", status=413)
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    got = 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestError(
                f"the request body did not arrive within {timeout:g} s ({got} of {length} bytes came)",
                status=408,
            ) from None
        except ClientDisconnect:
            raise ClientGone(f"the client left after {got} of {length} body bytes") from None
        chunks.append(chunk)
        got += len(chunk)
    try:
        body = loads(b"".join(chunks), parse_constant=_no_constant)
    except TooDeep as e:
        raise RequestError(f"the request body is {e}") from None
    except ValueError as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


# ------------------------------------------------------------------------------- the request
@dataclass
class Plan:
    """A request read and checked, before anything is generated."""

    chat: bool
    head: dict[str, Any]  # id, object, created, model
    prompts: list[Prompt]
    kind: str
    params: Params
    stream: bool
    usage: bool  # stream_options.include_usage
    tools: ToolRequest | None


def plan(engine: Engine, path: str, body: dict[str, Any]) -> Plan:
    """Checks every value (RequestError names the one that is wrong) and builds the prompts."""
    kind = engine.which(body.get("model"))
    params = Params.from_request(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, not {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise RequestError("stream_options must be an object, and only with stream: true", "stream_options")
    tools = None
    chat = path == CHAT
    if chat:
        tools = ToolRequest.from_body(body, engine.call_style)
        prompts = [engine.chat_prompt(body.get("messages"), params, tools)]
        head: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
    else:
        prompt = body.get("prompt")
        texts = prompt if isinstance(prompt, list) else [prompt]
        if not texts:
            raise RequestError("prompt must be a string or a non-empty list of strings", "prompt")
        prompts = engine.text_prompts(texts, params)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
    head.update(created=int(time.time()), model=engine.names[kind])
    usage = bool((options or {}).get("include_usage"))
    return Plan(chat, head, prompts, kind, params, stream, usage, tools)


def answer(engine: Engine, p: Plan, gone: Callable[[], bool]) -> dict[str, Any]:
    """The whole answer (no stream); raises Cancelled when ``gone()`` turns true."""
    special = p.tools is not None
    outs = [engine.generate(x, p.kind, p.params, cancel=gone, special=special) for x in p.prompts]
    if p.chat and p.tools is not None:
        parsed = p.tools.read(outs[0].text)
        msg, finish = tool_message(parsed, p.tools.opening + outs[0].text)
        finish = finish if parsed.calls else outs[0].finish_reason
        choices: list[dict[str, Any]] = [{"index": 0, "message": msg, "finish_reason": finish}]
    elif p.chat:
        choices = [
            {"index": 0, "message": {"role": "assistant", "content": outs[0].text},
             "finish_reason": outs[0].finish_reason}
        ]  # fmt: skip
    else:
        choices = [
            {"index": i, "text": o.text, "finish_reason": o.finish_reason, "logprobs": None}
            for i, o in enumerate(outs)
        ]
    return {**p.head, "choices": choices, "usage": _usage(outs)}


def stream(
    engine: Engine, p: Plan, gone: Callable[[], bool], emit: Callable[[dict[str, Any] | str], None]
) -> None:
    """The answer as OpenAI streams it: each event handed to ``emit`` as it is made, ``[DONE]`` last."""
    chunk = {**p.head, "object": "chat.completion.chunk" if p.chat else "text_completion"}

    def piece(i: int, text: str | None, finish: str | None) -> dict[str, Any]:
        if p.chat:
            delta = {} if text is None else {"content": text}
            if text == "":
                delta["role"] = "assistant"
            return {**chunk, "choices": [{"index": i, "delta": delta, "finish_reason": finish}]}
        return {**chunk, "choices": [{"index": i, "text": text or "", "finish_reason": finish,
                                       "logprobs": None}]}  # fmt: skip

    outs = []
    for i, prompt in enumerate(p.prompts):
        if p.chat:
            emit(piece(i, "", None))
        hold = HoldCalls(p.tools) if p.tools is not None else None

        def on_text(text: str, i: int = i, hold: HoldCalls | None = hold) -> None:
            text = hold.feed(text) if hold is not None else text
            if text:
                emit(piece(i, text, None))

        out = engine.generate(
            prompt, p.kind, p.params, cancel=gone, on_text=on_text, special=hold is not None
        )
        if p.tools is not None and hold is not None:
            for event in call_events(chunk, i, p.tools, hold, out):
                emit(event)
        else:
            emit(piece(i, None, out.finish_reason))
        outs.append(out)
    if p.usage:
        emit({**chunk, "choices": [], "usage": _usage(outs)})
    emit("[DONE]")


def call_events(
    chunk: dict[str, Any], i: int, tools: ToolRequest, hold: HoldCalls, out: Output
) -> list[dict[str, Any]]:
    """The end of a streamed answer to a request with tools: what text is left, then the calls as OpenAI
    streams them (one delta each, with its id, name and whole arguments)."""

    def event(delta: dict[str, Any], finish: str | None, **extra: Any) -> dict[str, Any]:
        return {**chunk, "choices": [{"index": i, "delta": delta, "finish_reason": finish, **extra}]}

    parsed = tools.read(out.text)
    events = []
    if parsed.calls:
        said = hold.passed.strip()
        left = parsed.content[len(said) :].strip() if parsed.content.startswith(said) else ""
        if left:
            events.append(event({"content": left}, None))
        for j, call in enumerate(openai_calls(parsed)):
            events.append(event({"tool_calls": [{"index": j, **call}]}, None))
        return [*events, event({}, "tool_calls")]
    text = tools.opening + out.text
    left = text[len(hold.passed) :] if text.startswith(hold.passed) else ""
    if left:
        events.append(event({"content": left}, None))
    flag = {"nbtrain_tool_call_error": parsed.error} if parsed.error else {}
    return [*events, event({}, out.finish_reason, **flag)]


# --------------------------------------------------------------------------------- the app
def create_app(
    engine: Engine,
    api_key: str,
    key_file: Path,
    *,
    request_timeout: float,
    send_timeout: float | None = None,
    threads: int = 64,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The application; ``on_ready`` runs once it is about to take requests. ``threads``: generations
    that may wait on the engine at once (each holds a worker thread)."""
    started = int(time.time())
    key = api_key.encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        if on_ready is not None:
            on_ready()
        yield

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def denied(request: Request) -> Response | None:
        """None for a request with the key; else the 401 (OpenAI's shape)."""
        scheme, _, token = (request.headers.get("authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8", "replace"), key):
            return None
        where = (
            f'the key is "api_key" in {key_file} (readable by its owner only) and .api_key of the handle '
            f"run.serve() returns"
        )
        msg = (
            f"You didn't provide an API key. Send it as 'Authorization: Bearer KEY'; {where}."
            if not token
            else f"Incorrect API key provided; {where}."
        )
        return _json(
            401,
            error_body(msg, code="invalid_api_key"),
            close=True,
            **{"WWW-Authenticate": 'Bearer realm="nbtrain"'},
        )

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, e: HTTPException) -> Response:
        # FastAPI's own 404 / 405 answers, in OpenAI's shape
        path = request.url.path
        msg = f"no route {request.method} {path}; try POST {CHAT}, GET /v1/models or GET /health"
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        return _json(e.status_code, error_body(msg, kind=kind), close=request.method != "GET")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if (refusal := denied(request)) is not None:
            return refusal
        data = [
            {"id": name, "object": "model", "created": started, "owned_by": "nbtrain", "kind": kind}
            for kind, name in engine.names.items()
        ]
        return _json(200, {"object": "list", "data": data})

    @app.post(CHAT)
    @app.post(TEXT)
    async def complete(request: Request) -> Response:
        if (refusal := denied(request)) is not None:
            return refusal
        try:
            body = await read_body(request, request_timeout)
        except RequestError as e:
            return _failure(e, close=True)
        except ClientGone as e:
            say(str(e))
            return Response(status_code=400, headers={"Connection": "close"})
        try:
            p = await run_in_threadpool(plan, engine, request.url.path, body)
        except RequestError as e:
            return _failure(e)
        except Exception as e:  # noqa: BLE001 - a check that failed is a JSON 500, never starlette's text one
            traceback.print_exc()
            return _json(500, error_body(f"{type(e).__name__}: {e}", kind="server_error"))
        if p.stream:
            return streamed(p)
        left = threading.Event()
        watcher = asyncio.create_task(_watch(request, left))
        try:
            return _json(200, await run_in_threadpool(answer, engine, p, left.is_set))
        except RequestError as e:
            return _failure(e)
        except Cancelled as e:
            say(f"the client went away: {e}")
            return Response(status_code=499)  # nobody reads it
        except Exception as e:  # noqa: BLE001 - a failed generation answers 500, the server stays up
            traceback.print_exc()
            return _json(500, error_body(f"{type(e).__name__}: {e}", kind="server_error"))
        finally:
            watcher.cancel()

    def streamed(p: Plan) -> EventSourceResponse:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | str | None] = asyncio.Queue()
        left = threading.Event()

        def emit(event: dict[str, Any] | str | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        def work() -> None:
            try:
                stream(engine, p, left.is_set, emit)
            except Cancelled as e:
                say(f"the client went away: {e}")
            except Exception as e:  # noqa: BLE001 - the 200 has gone out: the error is the last event
                traceback.print_exc()
                emit(error_body(f"{type(e).__name__}: {e}", kind="server_error"))
            finally:
                emit(None)

        async def events() -> AsyncIterator[dict[str, str]]:
            task = asyncio.ensure_future(run_in_threadpool(work))
            try:
                while (event := await queue.get()) is not None:
                    yield {"data": event if isinstance(event, str) else json.dumps(event)}
                await task
            finally:
                left.set()  # the client went away (or stopped reading): the generation stops

        return EventSourceResponse(
            events(),
            sep="\n",
            send_timeout=send_timeout or request_timeout,
            headers={"Cache-Control": "no-cache"},
        )

    return app


async def _watch(request: Request, left: threading.Event) -> None:
    """Sets ``left`` when the client closes its connection (the body is read: the next message is the
    disconnect, or the end of the answer)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    left.set()
