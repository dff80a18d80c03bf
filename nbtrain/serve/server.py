"""An OpenAI-compatible server for one run, on loopback:

    python -m nbtrain.serve.server RUN_DIR [--port N] [--base-only] [--device auto|cpu|cuda]
                                   [--engine auto|builtin|vllm]

With ``vllm`` installed and a GPU, it runs ``vllm serve BASE --enable-lora --lora-modules NAME=ADAPTER``
(as its child, in this process group); otherwise the built-in server answers from one process with both
the tuned and the base model: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions``. Once it listens it writes RUN_DIR/serve.json (pid, pgid, url, models, started)
for the kernel that waits on it; it removes the file when it stops (SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
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

from nbtrain.rundir import RunPaths, atomic_write_json, read_json
from nbtrain.serve.engine import BASE, TUNED, Engine, Output, Params, RequestError, model_names

HOST = "127.0.0.1"  # loopback only: the server has no authentication
MAX_BODY = 8 * 1024 * 1024
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def serve_file(run_dir: Path) -> Path:
    return run_dir / "serve.json"


def write_info(run_dir: Path, url: str, models: dict[str, str], engine: str, device: str) -> None:
    import psutil

    atomic_write_json(serve_file(run_dir), {
        "pid": os.getpid(), "pgid": os.getpgid(0), "create_time": psutil.Process().create_time(),
        "url": url, "models": models, "engine": engine, "device": device, "started": time.time(),
    })  # fmt: skip


def remove_info(run_dir: Path) -> None:
    # Only our own file: a newer server of the same run may have replaced it.
    try:
        if read_json(serve_file(run_dir)).get("pid") == os.getpid():
            serve_file(run_dir).unlink()
    except (FileNotFoundError, ValueError):
        pass


# ------------------------------------------------------------------------------------ built-in
def _error(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _usage(o: Output) -> dict[str, int]:
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    engine_started = time.time()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "nbtrain-serve"

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/v1/models":
                created = int(engine_started)
                data = [
                    {"id": name, "object": "model", "created": created, "owned_by": "nbtrain", "kind": kind}
                    for kind, name in engine.names.items()
                ]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, _error(f"no route GET {path}; try /v1/models or /health", kind="not_found"))

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0:
                raise RequestError("the request has no JSON body")
            if length > MAX_BODY:
                raise RequestError(f"the request body is over {MAX_BODY} bytes")
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from None
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            return body

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            try:
                if path == "/v1/chat/completions":
                    self._send(200, self._chat(self._body()))
                elif path == "/v1/completions":
                    self._send(200, self._complete(self._body()))
                else:
                    self._send(
                        404, _error(f"no route POST {path}; try /v1/chat/completions", kind="not_found")
                    )
            except RequestError as e:
                self._send(e.status, _error(str(e), e.param))
            except Exception as e:  # noqa: BLE001 - a failed generation answers 500, the server stays up
                import traceback

                traceback.print_exc()
                self._send(500, _error(f"{type(e).__name__}: {e}", kind="server_error"))

        def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
            kind = engine.which(body.get("model"))
            params = Params.from_request(body)
            out = engine.chat(body.get("messages"), kind, params)
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": engine.names[kind],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": out.text},
                        "finish_reason": out.finish_reason,
                    }
                ],
                "usage": _usage(out),
            }

        def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
            kind = engine.which(body.get("model"))
            params = Params.from_request(body)
            prompt = body.get("prompt")
            prompts = prompt if isinstance(prompt, list) else [prompt]
            if not prompts:
                raise RequestError("prompt must be a string or a non-empty list of strings", "prompt")
            outs = [engine.complete(p, kind, params) for p in prompts]
            return {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": engine.names[kind],
                "choices": [
                    {"index": i, "text": o.text, "finish_reason": o.finish_reason, "logprobs": None}
                    for i, o in enumerate(outs)
                ],
                "usage": {
                    k: sum(_usage(o)[k] for o in outs)
                    for k in ("prompt_tokens", "completion_tokens", "total_tokens")
                },
            }

    return Handler


def serve_builtin(run_dir: Path, port: int, base_only: bool, device: str, *, lean: bool = False) -> int:
    if lean:
        from nbtrain.worker.lean import hide_for_run

        hide_for_run(run_dir, label="nbtrain serve")  # before the engine imports torch and peft
    engine = Engine(run_dir, base_only=base_only, device=device)
    httpd = ThreadingHTTPServer((HOST, port), make_handler(engine))
    httpd.daemon_threads = True
    url = f"http://{HOST}:{httpd.server_address[1]}/v1"

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"nbtrain serve: {signal.Signals(signum).name}, shutting down", flush=True)
        # shutdown() waits for serve_forever to return, so it cannot run on the thread serving.
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    write_info(run_dir, url, dict(engine.names), "builtin", engine.device)
    print(f"nbtrain serve: {', '.join(engine.names.values())} at {url} ({engine.device})", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        remove_info(run_dir)
        httpd.server_close()
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

    resolved = read_json(RunPaths(run_dir).resolved)
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
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)  # same process group: stopped with us

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
            write_info(run_dir, f"{base}/v1", names, "vllm", "cuda")
        return child.wait()
    finally:
        remove_info(run_dir)


def main(argv: list[str] | None = None, *, lean: bool = False) -> int:
    """``lean``: this process is the server command, so it may leave unused packages out."""
    ap = argparse.ArgumentParser(prog="python -m nbtrain.serve.server", description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--base-only", action="store_true", help="serve only the base model")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (built-in engine)")
    ap.add_argument("--engine", choices=["auto", "builtin", "vllm"], default="auto")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    use_vllm = args.engine == "vllm" or (args.engine == "auto" and vllm_usable())
    if use_vllm:
        return serve_vllm(run_dir, args.port, args.base_only)
    return serve_builtin(run_dir, args.port, args.base_only, args.device, lean=lean)


if __name__ == "__main__":
    raise SystemExit(main(lean=True))
