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

The built-in server is nbtrain's FastAPI application (``app.py``) on uvicorn, with transformers' continuous
batching behind it (``batching.py``). It stays available to the next client: a request's headers and body
must arrive within ``--request-timeout`` seconds (else the connection is closed, or 408), bodies are at most
8 MiB (413), at most 64 connections are open at once (503 beyond, ``limits.py``), a completion fits the
model's context (400), and a generation stops as soon as its client goes away. Every error is an
OpenAI-style JSON error object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

import uvicorn

from nbtrain.contract.rundir import RunPaths, read_json
from nbtrain.hardware.clock import start_record
from nbtrain.worker.gguf import use_converted
from nbtrain.worker.serve.app import create_app
from nbtrain.worker.serve.engine import BASE, TUNED, Engine, model_names
from nbtrain.worker.serve.limits import protocol
from nbtrain.worker.threads import settle

HOST = "127.0.0.1"  # loopback only, and every /v1 route needs the key
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
    if engine.device == "cpu":
        settle()  # the generations' threads: as many as the cores other processes leave free
    api_key = new_api_key()
    sock = socket.socket()
    sock.bind((HOST, port))
    sock.listen(128)
    url = f"http://{HOST}:{sock.getsockname()[1]}/v1"

    def ready() -> None:
        write_info(run_dir, url, dict(engine.names), "builtin", engine.device, api_key)
        print(
            f"nbtrain serve: {', '.join(engine.names.values())} at {url} ({engine.device}, context "
            f"{engine.context_length} tokens); the API key is in {serve_file(run_dir)}",
            flush=True,
        )

    app = create_app(
        engine, api_key, serve_file(run_dir), request_timeout=request_timeout, threads=MAX_CONNECTIONS,
        on_ready=ready,
    )  # fmt: skip
    config = uvicorn.Config(
        app, http=protocol(request_timeout, MAX_CONNECTIONS), lifespan="on", log_level="info",
        timeout_graceful_shutdown=3, ws="none", server_header=False,
    )  # fmt: skip
    try:
        # uvicorn stops on SIGTERM / SIGINT: it stops taking connections, ends the open ones, and returns
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        remove_info(run_dir)
        sock.close()
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
