"""An OpenAI-compatible server for one run, on loopback:

    python -m nbtrain.worker.serve.server RUN_DIR [--port N] [--base-only] [--device auto|cpu|cuda]
                                   [--engine auto|builtin|vllm] [--request-timeout S]

With ``vllm`` installed and a GPU, it runs ``vllm serve BASE --enable-lora --lora-modules NAME=ADAPTER``
(as its child, in this process group); otherwise the built-in server answers from one process with both
the tuned and the base model: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (``stream: true`` answers server-sent events).

Every ``/v1`` route needs the server's key, ``Authorization: Bearer KEY`` (401 otherwise): a key made
at start, kept only in RUN_DIR/serve.json, which only its owner may read (mode 0600), so another local
user cannot call the model. Once it listens the server writes serve.json (pid, pgid, url, models, key,
started) for the kernel that waits on it; it removes the file when it stops (SIGTERM or SIGINT).

The built-in server stays available to the next client: a request's headers and body must arrive within
``--request-timeout`` seconds (else the connection is closed, or 408), bodies are at most 8 MiB (413),
at most 64 connections are open at once (503 beyond), a completion fits the model's context (400), and
a generation stops as soon as its client goes away. Every error is an OpenAI-style JSON error object.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import importlib.util
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from nbtrain.contract.rundir import RunPaths, read_json
from nbtrain.hardware.clock import start_record
from nbtrain.worker.gguf import use_converted
from nbtrain.worker.serve.engine import (
    BASE,
    TUNED,
    Cancelled,
    Engine,
    Output,
    Params,
    Prompt,
    RequestError,
    model_names,
)
from nbtrain.worker.serve.tools import HoldCalls, ToolRequest, openai_calls
from nbtrain.worker.serve.tools import message as tool_message

HOST = "127.0.0.1"  # loopback only, and every /v1 route needs the key
MAX_BODY = 8 * 1024 * 1024
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT = 30.0
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def serve_file(run_dir: Path) -> Path:
    return run_dir / "serve.json"


def new_api_key() -> str:
    return "nbt-" + secrets.token_urlsafe(32)


def write_info(
    run_dir: Path, url: str, models: dict[str, str], engine: str, device: str, api_key: str
) -> None:
    """serve.json, atomically and readable by its owner only (mode 0600 from the moment it exists)."""
    import psutil

    info = {
        "pid": os.getpid(), "pgid": os.getpgid(0), **start_record(psutil.Process()),
        "url": url, "models": models, "engine": engine, "device": device, "started": time.time(),
        "api_key": api_key,
    }  # fmt: skip
    path = serve_file(run_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(info, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_info(run_dir: Path) -> None:
    # Only our own file: a newer server of the same run may have replaced it.
    try:
        if read_json(serve_file(run_dir)).get("pid") == os.getpid():
            serve_file(run_dir).unlink()
    except (FileNotFoundError, ValueError):
        pass


# ------------------------------------------------------------------------------------ built-in
def _error(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _usage(o: Output) -> dict[str, int]:
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class ClientGone(Exception):
    """The client closed its connection; nothing is left to answer."""


class Watchdog:
    """Closes connections whose request line and headers did not all arrive in time (a client that
    sends them a byte at a time holds a connection for ever otherwise); one thread for all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}
        threading.Thread(target=self._run, name="nbtrain-serve-watchdog", daemon=True).start()

    def arm(self, sock: socket.socket, seconds: float) -> None:
        with self._lock:
            self._due[sock] = time.monotonic() + seconds

    def disarm(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def _run(self) -> None:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with self._lock:
                late = [s for s, t in self._due.items() if t <= now]
                for s in late:
                    del self._due[s]
            for s in late:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them; one more is answered 503 at once."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            body = json.dumps(_error(
                f"the server has {self.max_connections} connections open; retry shortly",
                kind="server_error", code="too_many_connections",
            )).encode()  # fmt: skip
            head = (
                f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(head.encode() + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def make_handler(
    engine: Engine, api_key: str, key_file: Path, *, request_timeout: float = REQUEST_TIMEOUT
) -> type[BaseHTTPRequestHandler]:
    engine_started = time.time()
    key = api_key.encode()
    watchdog = Watchdog()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "nbtrain-serve"
        timeout = request_timeout  # every read or write on the socket: a stalled peer is dropped

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

        def handle_one_request(self) -> None:
            self.left = False
            watchdog.arm(self.connection, request_timeout)  # the request line and headers, in time
            try:
                super().handle_one_request()
            except OSError:  # the peer reset or the watchdog closed it; nobody to answer
                self.close_connection = True
            finally:
                watchdog.disarm(self.connection)

        # ----------------------------------------------------------------------- answering
        def _send(
            self,
            status: int,
            body: dict[str, Any],
            *,
            close: bool = False,
            headers: dict[str, str] | None = None,
        ) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if close:  # the body was not read: what follows on the connection is not a request
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def _fail(self, e: RequestError, *, close: bool = False) -> None:
            self._send(e.status, _error(str(e), e.param, code=e.code), close=close)

        def _authorized(self) -> bool:
            """True for a request with the key; else answers 401 (OpenAI's shape) and returns False."""
            scheme, _, token = (self.headers.get("Authorization") or "").strip().partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                token.strip().encode("utf-8", "replace"), key
            ):
                return True
            where = (
                f'the key is "api_key" in {key_file} (readable by its owner only) and .api_key of the '
                f"handle run.serve() returns"
            )
            msg = (
                f"You didn't provide an API key. Send it as 'Authorization: Bearer KEY'; {where}."
                if not token
                else f"Incorrect API key provided; {where}."
            )
            self._send(
                401, _error(msg, code="invalid_api_key"), close=True,
                headers={"WWW-Authenticate": 'Bearer realm="nbtrain"'},
            )  # fmt: skip
            return False

        def gone(self) -> bool:
            """Has the client closed its connection? (Read-ready with nothing to read: end of stream.)"""
            if not self.left:
                try:
                    p = select.poll()
                    p.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
                    if p.poll(0) and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        self.left = True
                except (OSError, ValueError):
                    self.left = True
            return self.left

        # ---------------------------------------------------------------------------- GET
        def do_GET(self) -> None:
            watchdog.disarm(self.connection)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path.startswith("/v1") and not self._authorized():
                return
            elif path == "/v1/models":
                created = int(engine_started)
                data = [
                    {"id": name, "object": "model", "created": created, "owned_by": "nbtrain", "kind": kind}
                    for kind, name in engine.names.items()
                ]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, _error(f"no route GET {path}; try /v1/models or /health", kind="not_found"))

        # --------------------------------------------------------------------------- POST
        def _body(self) -> dict[str, Any]:
            if self.headers.get("Transfer-Encoding"):
                raise RequestError(
                    "chunked request bodies are not supported; send the JSON body with a Content-Length",
                    status=411,
                )
            lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
            if not lengths:
                raise RequestError("the request has no Content-Length; send a JSON body with it", status=411)
            value = lengths.pop() if len(lengths) == 1 else ""
            if not re.fullmatch(r"[0-9]{1,15}", value):
                shown = ", ".join(self.headers.get_all("Content-Length") or [])
                raise RequestError(f"Content-Length must be one whole number of bytes, not {shown!r}")
            length = int(value)
            if length == 0:
                raise RequestError("the request has no JSON body")
            if length > MAX_BODY:
                raise RequestError(f"the request body is over {MAX_BODY} bytes ({length})", status=413)
            data = self._read(length)
            try:
                body = json.loads(data, parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from None
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            return body

        def _read(self, length: int) -> bytes:
            """``length`` bytes of body, all within the request timeout (else 408)."""
            deadline = time.monotonic() + request_timeout
            chunks: list[bytes] = []
            got = 0
            try:
                while got < length:
                    left = deadline - time.monotonic()
                    try:
                        if left <= 0:
                            raise TimeoutError
                        self.connection.settimeout(left)
                        chunk = self.rfile.read1(min(length - got, 1 << 16))
                    except TimeoutError:
                        raise RequestError(
                            f"the request body did not arrive within {request_timeout:g} s ({got} of "
                            f"{length} bytes came)",
                            status=408,
                        ) from None
                    if not chunk:
                        raise ClientGone(f"the client left after {got} of {length} body bytes")
                    chunks.append(chunk)
                    got += len(chunk)
            finally:
                self.connection.settimeout(request_timeout)
            return b"".join(chunks)

        def do_POST(self) -> None:
            watchdog.disarm(self.connection)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path.startswith("/v1") and not self._authorized():
                return
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(
                    404,
                    _error(f"no route POST {path}; try /v1/chat/completions", kind="not_found"),
                    close=True,
                )
                return
            try:
                body = self._body()
            except RequestError as e:
                self._fail(e, close=True)
                return
            except ClientGone as e:
                self.log_message("%s", str(e))
                self.close_connection = True
                return
            self.streaming = False
            try:
                self._answer(path, body)
            except RequestError as e:
                self._fail(e)
            except (Cancelled, ClientGone) as e:
                self.log_message("the client went away: %s", str(e))
                sys.stderr.flush()
                self.close_connection = True
            except Exception as e:  # noqa: BLE001 - a failed generation answers 500, the server stays up
                import traceback

                traceback.print_exc()
                error = _error(f"{type(e).__name__}: {e}", kind="server_error")
                if self.streaming:  # the 200 has gone out: the error is the stream's last event
                    self._event(error)
                else:
                    self._send(500, error)

        def _answer(self, path: str, body: dict[str, Any]) -> None:
            kind = engine.which(body.get("model"))
            params = Params.from_request(body)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(f"stream must be true or false, not {stream!r}", "stream")
            options = body.get("stream_options")
            if options is not None and (not stream or not isinstance(options, dict)):
                raise RequestError(
                    "stream_options must be an object, and only with stream: true", "stream_options"
                )
            usage = bool((options or {}).get("include_usage"))
            tools = None
            if path == "/v1/chat/completions":
                tools = ToolRequest.from_body(body, engine.call_style)
                prompts = [engine.chat_prompt(body.get("messages"), params, tools)]
                head: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
            else:
                prompt = body.get("prompt")
                texts = prompt if isinstance(prompt, list) else [prompt]
                if not texts:
                    raise RequestError("prompt must be a string or a non-empty list of strings", "prompt")
                prompts = [engine.text_prompt(p, params) for p in texts]
                head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
            head.update(created=int(time.time()), model=engine.names[kind])
            chat = path == "/v1/chat/completions"
            if stream:
                self._stream(head, chat, prompts, kind, params, usage, tools)
                return
            outs = [
                engine.generate(p, kind, params, cancel=self.gone, special=tools is not None) for p in prompts
            ]
            if chat and tools is not None:
                parsed = tools.read(outs[0].text)
                msg, finish = tool_message(parsed, tools.opening + outs[0].text)
                finish = finish if parsed.calls else outs[0].finish_reason
                choices: list[dict[str, Any]] = [{"index": 0, "message": msg, "finish_reason": finish}]
            elif chat:
                choices = [
                    {"index": 0, "message": {"role": "assistant", "content": outs[0].text},
                     "finish_reason": outs[0].finish_reason}
                ]  # fmt: skip
            else:
                choices = [
                    {"index": i, "text": o.text, "finish_reason": o.finish_reason, "logprobs": None}
                    for i, o in enumerate(outs)
                ]
            self._send(200, {**head, "choices": choices, "usage": _total_usage(outs)})

        # ------------------------------------------------------------------------ streaming
        def _event(self, data: dict[str, Any] | str) -> None:
            line = data if isinstance(data, str) else json.dumps(data)
            try:
                self.wfile.write(f"data: {line}\n\n".encode())
            except OSError:  # closed, reset, or not reading for request_timeout
                self.left = True

        def _stream(
            self,
            head: dict[str, Any],
            chat: bool,
            prompts: list[Prompt],
            kind: str,
            params: Params,
            usage: bool,
            tools: ToolRequest | None = None,
        ) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")  # the stream ends when the connection does
            self.end_headers()
            self.close_connection = True
            self.streaming = True
            obj = "chat.completion.chunk" if chat else "text_completion"
            chunk = {**head, "object": obj}

            def piece(i: int, text: str | None, finish: str | None) -> dict[str, Any]:
                if chat:
                    delta = {} if text is None else {"content": text}
                    if text == "":
                        delta["role"] = "assistant"
                    return {**chunk, "choices": [{"index": i, "delta": delta, "finish_reason": finish}]}
                return {**chunk, "choices": [{"index": i, "text": text or "", "finish_reason": finish,
                                               "logprobs": None}]}  # fmt: skip

            outs = []
            for i, prompt in enumerate(prompts):
                if chat:
                    self._event(piece(i, "", None))

                hold = HoldCalls(tools) if tools is not None else None

                def on_text(text: str, i: int = i, hold: HoldCalls | None = hold) -> None:
                    text = hold.feed(text) if hold is not None else text
                    if text:
                        self._event(piece(i, text, None))

                out = engine.generate(
                    prompt, kind, params, cancel=self.gone, on_text=on_text, special=tools is not None
                )
                if tools is not None and hold is not None:
                    self._stream_calls(chunk, i, tools, hold, out)
                else:
                    self._event(piece(i, None, out.finish_reason))
                outs.append(out)
            if usage:
                self._event({**chunk, "choices": [], "usage": _total_usage(outs)})
            self._event("[DONE]")
            if self.left:
                raise ClientGone("it stopped reading before the end of the stream")

        def _stream_calls(
            self, chunk: dict[str, Any], i: int, tools: ToolRequest, hold: HoldCalls, out: Output
        ) -> None:
            """The end of a streamed answer to a request with tools: what text is left, then the calls as
            OpenAI streams them (one delta each, with its id, name and whole arguments)."""

            def event(delta: dict[str, Any], finish: str | None, **extra: Any) -> None:
                choice = {"index": i, "delta": delta, "finish_reason": finish, **extra}
                self._event({**chunk, "choices": [choice]})

            parsed = tools.read(out.text)
            if parsed.calls:
                said = hold.passed.strip()
                left = parsed.content[len(said) :].strip() if parsed.content.startswith(said) else ""
                if left:
                    event({"content": left}, None)
                for j, call in enumerate(openai_calls(parsed)):
                    event({"tool_calls": [{"index": j, **call}]}, None)
                event({}, "tool_calls")
                return
            text = tools.opening + out.text
            left = text[len(hold.passed) :] if text.startswith(hold.passed) else ""
            if left:
                event({"content": left}, None)
            flag = {"nbtrain_tool_call_error": parsed.error} if parsed.error else {}
            event({}, out.finish_reason, **flag)

    return Handler


def _total_usage(outs: list[Output]) -> dict[str, int]:
    return {
        k: sum(_usage(o)[k] for o in outs) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }


def serve_builtin(
    run_dir: Path,
    port: int,
    base_only: bool,
    device: str,
    *,
    lean: bool = False,
    request_timeout: float = REQUEST_TIMEOUT,
) -> int:
    if lean:
        from nbtrain.worker.lean import hide_for_run

        hide_for_run(run_dir, label="nbtrain serve")  # before the engine imports torch and peft
    engine = Engine(run_dir, base_only=base_only, device=device, batching=True)
    api_key = new_api_key()
    handler = make_handler(engine, api_key, serve_file(run_dir), request_timeout=request_timeout)
    httpd = Server((HOST, port), handler, MAX_CONNECTIONS)
    url = f"http://{HOST}:{httpd.server_address[1]}/v1"

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"nbtrain serve: {signal.Signals(signum).name}, shutting down", flush=True)
        # shutdown() waits for serve_forever to return, so it cannot run on the thread serving.
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    write_info(run_dir, url, dict(engine.names), "builtin", engine.device, api_key)
    print(
        f"nbtrain serve: {', '.join(engine.names.values())} at {url} ({engine.device}, context "
        f"{engine.context_length} tokens); the API key is in {serve_file(run_dir)}",
        flush=True,
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        remove_info(run_dir)
        httpd.server_close()
        engine.close()  # the batching loops' threads would keep the process alive
    return 0


# ---------------------------------------------------------------------------------------- vLLM
def vllm_usable() -> bool:
    """vllm is installed and a GPU is visible (NVML; this process does not initialise CUDA for it)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    from nbtrain.hardware import probe

    return bool(probe().gpus)


def vllm_argv(run_dir: Path, base_only: bool) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command for a run and the model names it will serve."""
    from nbtrain.worker.tuned import trained_weights_dir

    resolved = use_converted(read_json(RunPaths(run_dir).resolved))  # a GGUF base: its converted folder
    cfg = resolved["config"]
    names = model_names(run_dir)
    exe = Path(sys.executable).with_name("vllm")
    head = [str(exe)] if exe.exists() else [shutil.which("vllm") or "vllm"]
    if base_only:
        return [*head, "serve", cfg["model"], "--served-model-name", names[BASE]], {BASE: names[BASE]}
    weights = trained_weights_dir(run_dir)
    if cfg["method"] == "full":  # the tuned weights are a whole model; the base is not served alongside
        return [*head, "serve", str(weights), "--served-model-name", names[TUNED]], {TUNED: names[TUNED]}
    r = int(cfg["lora"]["r"])
    rank = next((x for x in VLLM_LORA_RANKS if x >= r), r)
    argv = [*head, "serve", cfg["model"], "--served-model-name", names[BASE], "--enable-lora",
            "--lora-modules", f"{names[TUNED]}={weights}", "--max-lora-rank", str(rank)]  # fmt: skip
    return argv, names


def serve_vllm(run_dir: Path, port: int, base_only: bool) -> int:
    import socket

    if port == 0:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
    argv, names = vllm_argv(run_dir, base_only)
    argv += ["--host", HOST, "--port", str(port)]
    if read_json(RunPaths(run_dir).resolved)["config"].get("trust_remote_code"):
        argv.append("--trust-remote-code")
    print("nbtrain serve: " + " ".join(argv), flush=True)
    api_key = new_api_key()  # vLLM reads it from its environment: never on a command line or in a log
    env = {**os.environ, "VLLM_API_KEY": api_key}
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env)  # same process group: stopped with us

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        child.terminate()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    base = f"http://{HOST}:{port}"
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        while child.poll() is None:
            try:
                with no_proxy.open(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        if child.poll() is None:
            write_info(run_dir, f"{base}/v1", names, "vllm", "cuda", api_key)
        return child.wait()
    finally:
        remove_info(run_dir)


def main(argv: list[str] | None = None, *, lean: bool = False) -> int:
    """``lean``: this process is the server command, so it may leave unused packages out."""
    ap = argparse.ArgumentParser(prog="python -m nbtrain.worker.serve.server", description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--base-only", action="store_true", help="serve only the base model")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (built-in engine)")
    ap.add_argument("--engine", choices=["auto", "builtin", "vllm"], default="auto")
    ap.add_argument(
        "--request-timeout", type=float, default=REQUEST_TIMEOUT,
        help="seconds a request's headers, and then its body, may take to arrive (built-in engine)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if not args.request_timeout > 0:
        ap.error(f"--request-timeout must be a positive number of seconds, not {args.request_timeout}")
    run_dir = Path(args.run_dir).resolve()
    use_vllm = args.engine == "vllm" or (args.engine == "auto" and vllm_usable())
    if use_vllm:
        return serve_vllm(run_dir, args.port, args.base_only)
    return serve_builtin(
        run_dir, args.port, args.base_only, args.device, lean=lean, request_timeout=args.request_timeout
    )


if __name__ == "__main__":
    raise SystemExit(main(lean=True))
