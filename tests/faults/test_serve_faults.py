"""The built-in server under hostile or careless clients: one real server process (tiny model, a copy of
the shared tuned run) for the module, driven over raw sockets and HTTP. Each case ends with the server
still answering the next client."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbtrain.control.jobs.serve import ServerHandle, serve

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process

REQUEST_TIMEOUT = 1.5  # the server's limit for a request's headers, then its body (default 30 s)
LONG = 500  # completion tokens of a request that takes seconds on the tiny model (context: 512)


@pytest.fixture(scope="module")
def server(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    run = tmp_path_factory.mktemp("serve-faults") / "tuned"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("serve.json", "logs", "checkpoints"))
    h = serve(run, request_timeout=REQUEST_TIMEOUT)
    yield h
    h.stop()


def address(h: ServerHandle) -> tuple[str, int]:
    host, port = h.url.removeprefix("http://").removesuffix("/v1").split(":")
    return host, int(port)


def call(
    h: ServerHandle,
    path: str,
    body: Any = None,
    *,
    key: str | None = "server",
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, http.client.HTTPResponse]:
    """One request on a fresh connection; key "server" sends the server's own key."""
    conn = http.client.HTTPConnection(*address(h), timeout=60)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        hdrs["Authorization"] = f"Bearer {h.api_key if key == 'server' else key}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request("GET" if data is None else "POST", "/v1" + path if path != "/health" else path, data, hdrs)
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, json.loads(out), r


def raw_request(h: ServerHandle, head: str, body: bytes = b"", *, wait: float = 10.0) -> bytes:
    """Send bytes as they are and return all the server answers until it closes (or ``wait`` s)."""
    with socket.create_connection(address(h), timeout=wait) as s:
        s.sendall(head.encode() + body)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
    return got


def post_head(h: ServerHandle, length: str, *, extra: str = "") -> str:
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {h.api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    )


def assert_answers(h: ServerHandle, within: float = 10.0) -> None:
    t = time.monotonic()
    status, out, _ = call(h, "/completions", {"prompt": "What", "max_tokens": 2, "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] >= 1, out
    assert time.monotonic() - t < within


def went_away(h: ServerHandle, since: int, n: int = 1, wait: float = 15.0) -> list[tuple[int, int]]:
    """(generated, max_tokens) of the first ``n`` generations stopped because their client left, as the
    server logged them after byte ``since`` of its log."""
    log = h.run_dir / "logs" / "serve.log"
    deadline = time.monotonic() + wait
    while True:
        text = log.read_bytes()[since:].decode(errors="replace")
        found = [(int(a), int(b)) for a, b in re.findall(r"went away: stopped after (\d+) of (\d+)", text)]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def log_size(h: ServerHandle) -> int:
    return (h.run_dir / "logs" / "serve.log").stat().st_size


def long_body(stream: bool = False) -> bytes:
    body = {"model": "tuned:base", "prompt": "What", "max_tokens": LONG, "temperature": 0, "stream": stream}
    return json.dumps(body).encode()


# ------------------------------------------------------------------------------------- the key
def test_every_v1_route_needs_the_servers_key_which_only_serve_json_holds(server: ServerHandle) -> None:
    for key, says in ((None, "didn't provide an API key"), ("nbt-guess", "Incorrect API key")):
        status, out, r = call(server, "/models", key=key)
        assert status == 401 and r.getheader("WWW-Authenticate", "").startswith("Bearer")
        assert out["error"]["code"] == "invalid_api_key" and says in out["error"]["message"]
        assert "serve.json" in out["error"]["message"]
        status, out, _ = call(
            server, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, key=key
        )
        assert status == 401
    assert call(server, "/models")[0] == 200
    assert call(server, "/health", key=None)[:2] == (200, {"status": "ok"})  # liveness needs no key

    info = server.run_dir / "serve.json"
    assert stat.S_IMODE(info.stat().st_mode) == 0o600 and info.stat().st_uid == os.getuid()
    assert json.loads(info.read_text())["api_key"] == server.api_key and len(server.api_key or "") > 40
    elsewhere = [
        p
        for p in server.run_dir.rglob("*")
        if p.is_file() and p != info and server.api_key.encode() in p.read_bytes()
    ]
    assert elsewhere == [] and server.api_key not in repr(server)
    # the kernel's own helpers send it
    assert isinstance(server.chat("What is 2 + 3?", max_tokens=4, temperature=0), str)


# ------------------------------------------------------------------------------ bad requests
@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"seed": 10**23}, "seed", "seed must be an integer"),
        ({"seed": 1e23}, "seed", "seed must be an integer"),
        ({"temperature": -0.5}, "temperature", "temperature must be a number from 0 to 2"),
        ({"top_p": 1.5}, "top_p", "top_p must be a number from 0 to 1"),
        ({"top_p": -0.1}, "top_p", "top_p must be"),
        ({"max_tokens": 2.5}, "max_tokens", "max_tokens must be a positive integer"),
        ({"max_tokens": True}, "max_tokens", "max_tokens must be a positive integer"),
        ({"max_tokens": 1_000_000_000}, "max_tokens", "maximum context length is 512 tokens"),
        ({"stream": "yes"}, "stream", "stream must be true or false"),
        ({"n": 3}, "n", "n must be 1"),
        ({"stop": ["x" * 300]}, "stop", "at most 256 characters"),
    ],
)
def test_bad_values_get_an_openai_style_400_naming_the_parameter(
    server: ServerHandle, extra: dict[str, Any], param: str, says: str
) -> None:
    t = time.monotonic()
    status, out, _ = call(server, "/completions", {"prompt": "What", "max_tokens": 2, **extra})
    assert status == 400, out
    assert out["error"]["param"] == param and says in out["error"]["message"]
    assert out["error"]["type"] == "invalid_request_error"
    assert time.monotonic() - t < 5  # refused before generating anything


def test_max_tokens_past_the_context_is_refused_before_generating_with_openais_code(
    server: ServerHandle,
) -> None:
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    status, out, _ = call(server, "/chat/completions", {"messages": msgs, "max_tokens": 1_000_000_000})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in out["error"]["message"]
    long_prompt = " ".join(["What is 2 + 3?"] * 200)  # the prompt alone is over the context
    status, out, _ = call(server, "/completions", {"prompt": long_prompt})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert_answers(server, within=5)


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b'{"prompt": "What", "temperature": NaN}', 400, "NaN is not a JSON number"),
        (b'{"prompt": "What", "top_p": Infinity}', 400, "Infinity is not a JSON number"),
        (b"[" * 200_000, 400, "is nested 200000 levels deep, past the 100 levels"),
        (b'"just a string"', 400, "must be a JSON object"),
        (b"\xff\xfe{}", 400, "not valid JSON"),
    ],
)
def test_bodies_that_are_not_a_json_object_get_a_400(
    server: ServerHandle, raw: bytes, status: int, says: str
) -> None:
    code, out, _ = call(server, "/completions", raw=raw)
    assert code == status and says in out["error"]["message"], out


@pytest.mark.parametrize(
    ("length", "extra", "status", "says"),
    [
        # refused by uvicorn's HTTP parser (h11), answered by limits.py with the reason it gives
        ("abc", "", 400, "(bad Content-Length)"),
        ("-5", "", 400, "(bad Content-Length)"),
        ("1e3", "", 400, "(bad Content-Length)"),
        ("4", "Content-Length: 9\r\n", 400, "(conflicting Content-Length headers)"),
        ("0", "", 400, "no JSON body"),
        (str(9 * 1024 * 1024), "", 413, "over 8388608 bytes"),
        ("4", "Transfer-Encoding: chunked\r\n", 411, "chunked request bodies are not supported"),
    ],
)
def test_bad_content_length_is_answered_and_the_connection_closed(
    server: ServerHandle, length: str, extra: str, status: int, says: str
) -> None:
    got = raw_request(server, post_head(server, length, extra=extra), b"{}")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), got[:300]
    assert b"connection: close" in head.lower()  # what follows is not read as a request
    assert says in json.loads(body)["error"]["message"]
    assert_answers(server)


# -------------------------------------------------------------------------------- slow clients
def test_a_body_that_does_not_arrive_in_time_gets_408(server: ServerHandle) -> None:
    t = time.monotonic()
    got = raw_request(server, post_head(server, "100"), b'{"prompt": ')  # 11 of 100 bytes, then nothing
    waited = time.monotonic() - t
    assert got.startswith(b"HTTP/1.1 408 "), got[:300]
    assert b"did not arrive within 1.5 s (11 of 100 bytes came)" in got
    assert REQUEST_TIMEOUT - 0.1 < waited < REQUEST_TIMEOUT + 3
    assert_answers(server)


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server: ServerHandle) -> None:
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        s.setblocking(False)
        t = time.monotonic()
        closed = False
        while time.monotonic() - t < REQUEST_TIMEOUT + 4:
            try:
                s.sendall(b"X")  # always a little more: no single read waits long
                if s.recv(1) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:  # reset by the server
                closed = True
                break
            time.sleep(0.2)
        assert closed and time.monotonic() - t < REQUEST_TIMEOUT + 3
    assert_answers(server)


def test_a_kept_alive_connection_serves_requests_past_the_timeout_then_cuts_off_trickled_headers(
    server: ServerHandle,
) -> None:
    # The headers' time limit runs per request, from the previous answer: a client that keeps using one
    # connection for longer than the limit is not cut off; one that then trickles its next request is.
    with socket.create_connection(address(server), timeout=10) as s:
        t = time.monotonic()
        answers = 0
        while time.monotonic() - t < 2 * REQUEST_TIMEOUT:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b'"ok"' not in got:
                chunk = s.recv(65536)
                assert chunk, (answers, got)  # closed while in use
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in got.lower()
            answers += 1
            time.sleep(0.3)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        t = time.monotonic()
        closed = False
        while not closed and time.monotonic() - t < REQUEST_TIMEOUT + 4:
            try:
                s.sendall(b"X")
                s.settimeout(0.2)
                closed = s.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:  # reset by the server
                closed = True
        assert closed and time.monotonic() - t < REQUEST_TIMEOUT + 3
    assert_answers(server)


def test_connections_past_the_limit_are_refused_with_503_and_the_slots_come_back(
    server: ServerHandle,
) -> None:
    idle = [socket.create_connection(address(server), timeout=5) for _ in range(64)]
    try:
        time.sleep(0.3)  # all accepted, each waiting for its request line
        got = raw_request(server, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", wait=5)
        assert got.startswith(b"HTTP/1.1 503 "), got[:300]
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Retry-After: 1" in head and json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    assert_answers(server)


def test_another_local_user_holds_four_connections_at_most_and_none_of_the_owners(
    server: ServerHandle,
) -> None:
    """uid 65534 (setpriv) opens 12 connections: 8 are answered 503 at once, and the owner is served while
    it holds the other 4 (its connections never count against the owner's 64)."""
    import subprocess

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another uid needs root and setpriv")
    host, port = address(server)
    code = (
        "import socket, sys, time\n"
        f"ss = [socket.create_connection(({host!r}, {port}), timeout=5) for _ in range(12)]\n"
        "refused = 0\n"
        "for s in ss:\n"
        "    s.settimeout(0.1)\n"
        "    try:\n"
        "        refused += s.recv(100).startswith(b'HTTP/1.1 503 ')\n"
        "    except OSError:\n"
        "        pass\n"
        "print(refused, flush=True)\n"
        "sys.stdin.read()\n"  # holds the rest until the test is done
    )
    who = ["--reuid=65534", "--regid=65534", "--clear-groups"]
    other = subprocess.Popen(["setpriv", *who, "/usr/bin/python3", "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd="/")  # fmt: skip
    try:
        assert other.stdout is not None
        assert other.stdout.readline().strip() == "8"
        assert_answers(server)  # the owner's slots are all there
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------------------- clients that leave
def test_a_client_that_leaves_stops_its_generation_and_the_next_client_is_served(
    server: ServerHandle,
) -> None:
    # How long the whole answer takes here (a quiet machine makes it in well under a second), so the
    # client leaves part of the way into it, not after it. Under load one answer can take less time than
    # the one measured: then the client leaves sooner on the next try (at most three).
    t = time.monotonic()
    status, out, _ = call(server, "/completions", json.loads(long_body()))
    whole = time.monotonic() - t
    assert status == 200 and out["usage"]["completion_tokens"] == LONG, out
    for part in (3, 8, 20):
        since = log_size(server)
        with socket.create_connection(address(server), timeout=10) as s:
            s.sendall(post_head(server, str(len(long_body()))).encode() + long_body())
            time.sleep(whole / part)  # generating
        assert_answers(server, within=5)
        stopped = went_away(server, since, wait=5)
        if stopped:
            break
    log = (server.run_dir / "logs" / "serve.log").read_bytes()[since:].decode(errors="replace")
    assert len(stopped) == 1, log[-3000:]  # what the server said instead, should it ever differ
    [(generated, asked)] = stopped
    assert asked == LONG and generated < LONG


def test_a_streaming_client_that_leaves_and_one_that_gave_up_waiting_generate_nothing_more(
    server: ServerHandle,
) -> None:
    since = log_size(server)
    streaming = socket.create_connection(address(server), timeout=10)
    streaming.sendall(post_head(server, str(len(long_body(True)))).encode() + long_body(True))
    got = b""
    while b"data: {" not in got:  # until its first tokens come
        chunk = streaming.recv(65536)
        assert chunk, got
        got += chunk
    with socket.create_connection(address(server), timeout=10) as waiting:  # a second request meanwhile
        waiting.sendall(post_head(server, str(len(long_body()))).encode() + long_body())
        time.sleep(0.3)
    streaming.close()
    assert_answers(server, within=5)
    stopped = sorted(went_away(server, since, n=2))
    assert len(stopped) == 2, stopped
    # With continuous batching the second request starts beside the stream instead of waiting for it
    # (without batching it never started: 0 tokens); either way both stop once their clients are gone,
    # long before the tokens they asked for.
    assert all(n < LONG and asked == LONG for n, asked in stopped) and stopped[1][0] > 0, stopped


ASK = {"role": "user", "content": "Weather in Oslo?"}
BAD_CALL = {
    "role": "assistant",
    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{bad"}}],
}


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"tools": "get_weather"}, "tools", "tools must be a list"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools", "no function name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{"}}]},
            "tools",
            "not JSON",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "writes no tool calls"),
        ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
        ({"messages": [ASK, {"role": "tool", "content": "sunny"}]}, "messages", "no call before it"),
        (
            {"messages": [ASK, BAD_CALL, {"role": "tool", "content": "1"}]},
            "messages",
            "arguments is not JSON",
        ),
        (
            {"messages": [ASK, {"role": "assistant", "tool_calls": "f()"}]},
            "messages",
            "must be a list of calls",
        ),
    ],
)
def test_hostile_tool_requests_get_a_400_naming_the_field_before_generating(
    server: ServerHandle, extra: dict[str, Any], param: str, says: str
) -> None:
    t = time.monotonic()
    status, out, _ = call(server, "/chat/completions", {"messages": [ASK], "max_tokens": 2, **extra})
    assert status == 400, out
    assert out["error"]["param"] == param and says in out["error"]["message"], out
    assert time.monotonic() - t < 5  # refused before generating anything
    assert_answers(server)


def test_stopping_the_server_mid_stream_ends_it_on_sigterm_within_seconds(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "tuned"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("serve.json", "logs", "checkpoints"))
    h = serve(run)
    streaming = socket.create_connection(address(h), timeout=10)
    try:
        streaming.sendall(post_head(h, str(len(long_body(True)))).encode() + long_body(True))
        got = b""
        while b"data: {" not in got:  # generating
            chunk = streaming.recv(65536)
            assert chunk, got
            got += chunk
        t = time.monotonic()
        assert h.stop(timeout=20) == "terminated"  # not killed: it ended the stream and returned
        assert time.monotonic() - t < 10
        assert not (run / "serve.json").exists()
        log = (run / "logs" / "serve.log").read_text(errors="replace")
        assert "went away: stopped after" in log or "Finished server process" in log, log[-2000:]
    finally:
        streaming.close()


def test_settings_the_server_does_not_honour_get_a_400_naming_them_not_a_quiet_200() -> None:
    from nbtrain.worker.serve.request import Params, RequestError

    asked = {"logprobs": True, "top_logprobs": 3, "logit_bias": {"7": 5}, "presence_penalty": 0.5,
             "response_format": {"type": "json_object"}, "suffix": "x", "echo": 1, "best_of": 2}  # fmt: skip
    for key, value in asked.items():
        with pytest.raises(RequestError, match=f"{key} is not supported by this server") as e:
            Params.from_request({key: value})
        assert e.value.param == key
    defaults = {"logprobs": False, "top_logprobs": 0, "logit_bias": {}, "presence_penalty": 0,
                "frequency_penalty": 0.0, "response_format": {"type": "text"}, "best_of": 1}  # fmt: skip
    assert Params.from_request(defaults).max_tokens is None  # what clients send by default passes


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_tokenising(
    server: ServerHandle,
) -> None:
    huge = "x" * 7_000_000  # 7 MB: the tokenizer held every request for ~29 s on such a prompt
    for path, body in (
        ("/completions", {"prompt": huge}),
        ("/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
    ):
        t = time.monotonic()
        status, out, _ = call(server, path, body)
        assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
        assert "7000000 characters, more than that many tokens could hold" in out["error"]["message"]
        assert time.monotonic() - t < 10
    assert_answers(server, within=5)
