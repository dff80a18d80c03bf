"""Kernel side of serving: start a run's server process, find it, talk to it, stop it; one-shot generate.

Stdlib (+ psutil) only, so a kernel stays free of torch and CUDA: the model lives in the server process
(``python -m nbtrain.worker.serve.server``), started with ``sys.executable`` in its own session and logging to
RUN_DIR/logs/serve.log. The server announces itself in RUN_DIR/serve.json once it listens; that file is
how any kernel finds (and reuses, or stops) a run's server. It also holds the server's API key (the file
is readable by its owner only): every request the kernel sends carries ``Authorization: Bearer KEY``.
Stopping signals only the server's own process group, so the GPU memory it held is released with it.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import latest_complete_checkpoint, read_json, tail_text
from nbtrain.control.launch import process
from nbtrain.control.runs.run import Run, get_run

START_TIMEOUT = 300.0  # loading a large model onto a GPU takes a while; the tiny one takes seconds
LOG_NAME = "serve.log"
# Loopback requests must not go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Servers this process started (run dir -> handle): `serve --stop` without a run stops these.
_STARTED: dict[Path, ServerHandle] = {}


class ServeError(NbtrainError):
    """A server could not be started or answered with an error."""


class ServerGone(ServeError):
    """The server did not answer at all, or its connection broke mid-answer: it was stopped or exited."""


@dataclass
class ServerHandle:
    """A running server of one run: ``url`` is the OpenAI base URL (ending in /v1), ``api_key`` the key
    every /v1 request needs (``Authorization: Bearer KEY``; e.g. ``OpenAI(base_url=h.url,
    api_key=h.api_key)``). The key is left out of the handle's repr, so a notebook's saved output
    never holds it."""

    run_dir: Path
    url: str
    pid: int
    pgid: int
    models: dict[str, str]  # {"tuned": id, "base": id}; one of them with --base-only
    engine: str = "builtin"
    device: str = "cpu"
    create_time: float | None = None
    reused: bool = False
    api_key: str | None = field(default=None, repr=False)
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_info(cls, run_dir: Path, info: dict[str, Any]) -> ServerHandle:
        return cls(
            run_dir=run_dir, url=str(info["url"]), pid=int(info["pid"]), pgid=int(info["pgid"]),
            models=dict(info["models"]), engine=str(info.get("engine", "builtin")),
            device=str(info.get("device", "cpu")), create_time=info.get("create_time"),
            api_key=info.get("api_key"), info=info,
        )  # fmt: skip

    def _launch_info(self) -> dict[str, Any]:
        return {"pid": self.pid, "pgid": self.pgid, "create_time": self.create_time,
                "boot_time": self.info.get("boot_time")}  # fmt: skip

    def alive(self) -> bool:
        return process.group_alive(self._launch_info())

    def stop(self, timeout: float = 15.0) -> str:
        """SIGTERM the server's process group, SIGKILL it after ``timeout`` s; returns what it took."""
        how = process.terminate_group(self._launch_info(), grace=timeout)
        _STARTED.pop(self.run_dir, None)
        f = self.run_dir / "serve.json"
        try:
            if int(read_json(f).get("pid", -1)) == self.pid:
                f.unlink()  # killed before it could remove its own file
        except (FileNotFoundError, ValueError):
            pass
        return how

    def model(self, base: bool = False) -> str:
        kind = "base" if base else "tuned"
        if kind not in self.models:
            raise ServeError(
                f"the server at {self.url} does not serve the {kind} model (models: "
                f"{', '.join(self.models.values())}); stop it and serve again"
                + (" without --base-only" if kind == "tuned" else "")
            )
        return self.models[kind]

    def request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> Any:
        """GET (no body) or POST JSON to ``url + path``; an HTTP error raises ServeError with its message."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with _OPENER.open(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise self._refused(e) from None
        except urllib.error.URLError as e:
            raise self._gone(e.reason) from None
        except TimeoutError:
            raise self._slow(timeout) from None
        except (OSError, http.client.HTTPException) as e:  # reset or cut off while answering
            raise self._gone(e) from None

    def _refused(self, e: urllib.error.HTTPError) -> ServeError:
        try:
            msg = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError, OSError):
            msg = e.reason
        return ServeError(f"the server of run {self.run_dir.name} answered {e.code}: {msg}")

    def _slow(self, timeout: float) -> ServeError:
        return ServeError(
            f"the server of run {self.run_dir.name} at {self.url} sent nothing for {timeout:g} s; "
            f"see {self.run_dir / 'logs' / LOG_NAME}"
        )

    def _gone(self, why: object) -> ServerGone:
        if not self.alive():  # stopped elsewhere (the sidebar, %finetune serve stop, another cell) or exited
            return ServerGone(
                f"the server of run {self.run_dir.name} at {self.url} is no longer running (stopped from "
                f"the sidebar or another cell, or it exited: see {self.run_dir / 'logs' / LOG_NAME}); "
                "start it again with run.serve() (or %finetune serve) and use the new handle"
            )
        return ServerGone(
            f"the server of run {self.run_dir.name} at {self.url} did not answer ({why}); "
            f"see {self.run_dir / 'logs' / LOG_NAME}"
        )

    def __repr__(self) -> str:
        # No state here (a notebook keeps a repr forever): what it is, where, and how to ask; never the key.
        models = ", ".join(f"{k}: {v}" for k, v in self.models.items())
        return (
            f"<ServerHandle of run {self.run_dir.name} at {self.url} ({models}; {self.engine} on "
            f"{self.device}, pid {self.pid}{'; its key: .api_key' if self.api_key else ''}) — .alive() for "
            "its state, .stop() to stop it>"
        )

    def chat(self, messages: str | list[dict[str, Any]], *, base: bool = False, **params: Any) -> str:
        """The assistant's reply to ``messages`` (a string is one user message). ``params``: max_tokens,
        temperature, top_p, seed, stop."""
        msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        out = self.request("/chat/completions", {"model": self.model(base), "messages": msgs, **params})
        return str(out["choices"][0]["message"]["content"])

    def stream_chat(
        self,
        messages: str | list[dict[str, Any]],
        *,
        base: bool = False,
        timeout: float = 600.0,
        into: dict[str, Any] | None = None,
        **params: Any,
    ) -> Generator[str, None, None]:
        """The assistant's reply to ``messages``, piece by piece as the server generates it (``stream:
        true``, server-sent events); the pieces add up to what ``chat`` returns. A server that is not
        there, or whose connection breaks before ``[DONE]``, raises ServerGone; an error the server
        reports raises ServeError with its message.

        ``into``: gets what is not text as it comes: ``tool_calls`` (a request with ``tools``; the calls'
        deltas put together: id, name, JSON arguments), ``finish_reason``, and ``nbtrain_tool_call_error``
        when the model wrote a call the server could not read."""
        msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        body = {"model": self.model(base), "messages": msgs, **params, "stream": True}
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + "/chat/completions", json.dumps(body).encode(), headers)
        try:
            response = _OPENER.open(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise self._refused(e) from None
        except urllib.error.URLError as e:
            raise self._gone(e.reason) from None
        except TimeoutError:
            raise self._slow(timeout) from None
        except (OSError, http.client.HTTPException) as e:
            raise self._gone(e) from None
        with response:
            try:
                for raw in response:  # one line at a time, as the events arrive
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event:
                        msg = (event["error"] or {}).get("message", "an error while streaming")
                        raise ServeError(f"the server of run {self.run_dir.name} failed: {msg}")
                    for choice in event.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if into is not None:
                            _gather(into, choice, delta)
                        piece = delta.get("content")
                        if piece:
                            yield str(piece)
            except TimeoutError:
                raise self._slow(timeout) from None
            except (OSError, http.client.HTTPException) as e:
                raise self._gone(e) from None
        raise self._gone("the answer ended before its last event")


# ------------------------------------------------------------------------------------ finding
def _gather(into: dict[str, Any], choice: dict[str, Any], delta: dict[str, Any]) -> None:
    """Put a streamed choice's tool-call deltas together in ``into`` as OpenAI clients do (by index: the
    first delta of a call brings its id and name, the arguments may come in pieces)."""
    for d in delta.get("tool_calls") or []:
        calls = into.setdefault("tool_calls", [])
        i = d.get("index", len(calls))
        while len(calls) <= i:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call, fn = calls[i], d.get("function") or {}
        call["id"] = d.get("id") or call["id"]
        call["function"]["name"] = fn.get("name") or call["function"]["name"]
        call["function"]["arguments"] += fn.get("arguments") or ""
    if choice.get("finish_reason"):
        into["finish_reason"] = choice["finish_reason"]
    if choice.get("nbtrain_tool_call_error"):
        into["nbtrain_tool_call_error"] = choice["nbtrain_tool_call_error"]


def find_server(run: Run | str | Path) -> ServerHandle | None:
    """The live server of ``run`` (started by any process), or None; a stale serve.json is removed.

    serve.json says which process group a stop signals and where prompts and the key go, so it is read
    only when it and its run directory are this user's (``RunPaths.not_yours``): otherwise ServeError
    says whose they are, and serve, generate, chat and stop act on nothing."""
    run = get_run(run)
    f = run.dir / "serve.json"
    if why := run.paths.not_yours(f):
        raise ServeError(f"not using the server of run {run.id}: {why}")
    try:
        info = read_json(f)
    except (FileNotFoundError, ValueError):
        return None
    except PermissionError:  # yours (checked above), yet not readable: its mode was changed by hand
        raise ServeError(
            f"{f} of run {run.id} cannot be read (its mode was changed), nor the key of its server with "
            f"it; give it back its own (chmod 600 {f})"
        ) from None
    handle = ServerHandle.from_info(run.dir.resolve(), info)
    if process.leader_alive(handle._launch_info()):
        return handle
    f.unlink(missing_ok=True)
    return None


def _generates(run: Run) -> None:
    """A reward run scores text, it generates none: say so before starting a process for it."""
    if run.config.get("objective") == "reward":
        raise ServeError(
            f"run {run.id} is a reward model (objective: reward): it scores answers and generates none; "
            f"train a policy against it (objective: rloo or grpo with rewards: [{{model: {run.id}}}]), or "
            f"export it as a sequence classifier with run.export(DIR)"
        )


def _has_weights(run: Run) -> bool:
    out = run.output_dir
    if (out / "adapter_config.json").exists() or (out / "config.json").exists():
        return True
    return latest_complete_checkpoint(run.paths) is not None


# ----------------------------------------------------------------------------------- starting
def serve(
    run: Run | str | Path,
    *,
    port: int = 0,
    base_only: bool = False,
    device: str = "auto",
    engine: str = "auto",
    timeout: float = START_TIMEOUT,
    request_timeout: float | None = None,
) -> ServerHandle:
    """Start (or reuse) the OpenAI-compatible server of ``run`` on 127.0.0.1; returns when it listens.

    A server already up for the run is reused when it serves what is asked, else refused with the fix.
    The handle's ``api_key`` is what clients send as ``Authorization: Bearer KEY``. ``request_timeout``:
    seconds a request's headers, then its body, may take to arrive (default 30; built-in engine).
    """
    run = get_run(run)
    _generates(run)
    run_dir = run.dir.resolve()
    current = find_server(run)
    if current is not None:
        wanted_tuned = not base_only
        port_ok = port == 0 or current.url.rsplit(":", 1)[1].startswith(f"{port}/")
        if port_ok and (("tuned" in current.models) == wanted_tuned):
            current.reused = True
            return current
        raise ServeError(
            f"run {run.id} already has a server at {current.url} (models: "
            f"{', '.join(current.models.values())}, pid {current.pid}); stop it first with "
            f"%finetune serve --stop {run.id} (or run.stop_serving()), then serve again"
        )
    if not base_only and not _has_weights(run):
        raise ServeError(
            f"run {run.id} has no trained weights yet (no output/ and no complete checkpoint); wait "
            f"for it to finish or ask for a checkpoint (%finetune checkpoint {run.id}), or serve the "
            f"base model alone with --base-only"
        )
    if port and not 0 < port < 65536:
        raise ServeError(f"port {port} is not a TCP port (1-65535; 0 picks a free one)")
    if request_timeout is not None and not request_timeout > 0:
        raise ServeError(f"request_timeout must be a positive number of seconds, not {request_timeout!r}")
    argv = [sys.executable, "-m", "nbtrain.worker.serve.server", str(run_dir), "--port", str(port),
            "--device", device, "--engine", engine]  # fmt: skip
    if request_timeout is not None:
        argv += ["--request-timeout", str(request_timeout)]
    if base_only:
        argv.append("--base-only")
    log = run_dir / "logs" / LOG_NAME
    proc = process.start_process(argv, log=log, cwd=run_dir, env=process.job_env())
    if isinstance(proc, process.LaunchFailed):
        raise ServeError(f"the server of run {run.id} could not start: {proc.reason}")
    offset = proc.log_offset
    deadline = time.monotonic() + timeout
    f = run_dir / "serve.json"
    while True:
        try:
            info = read_json(f)
            if int(info.get("pid", -1)) == proc.pid:
                break
        except (FileNotFoundError, ValueError):
            pass
        code = proc.exit_code()
        if code is not None:
            raise ServeError(
                f"the server of run {run.id} exited (code {code}) before it listened.\n"
                f"--- {log} ---\n{_log_since(log, offset)}"
            )
        if time.monotonic() > deadline:
            proc.stop(grace=5)
            raise ServeError(
                f"the server of run {run.id} did not listen within {timeout:.0f} s and was stopped; "
                f"pass a longer timeout for a large model.\n--- {log} ---\n{_log_since(log, offset)}"
            )
        time.sleep(0.1)
    handle = ServerHandle.from_info(run_dir, info)
    _STARTED[run_dir] = handle
    return handle


def _log_since(log: Path, offset: int, n: int = 30) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-n:]) or tail_text(log, n)


# ----------------------------------------------------------------------------------- stopping
def stop_serving(run: Run | str | Path | None = None, timeout: float = 15.0) -> list[str]:
    """Stop the server of ``run`` (whoever started it), or with no run every server this process
    started. Returns one line per server stopped."""
    if run is not None:
        r = get_run(run)
        handles = [h for h in [find_server(r)] if h is not None]
        if not handles:
            raise ServeError(f"run {r.id} has no server running")
    else:
        handles = list(_STARTED.values())
    done = []
    for h in handles:
        how = h.stop(timeout)
        done.append(f"stopped the server of {h.run_dir.name} at {h.url} ({how})")
    return done


@atexit.register
def _stop_ours() -> None:
    # A kernel that exits takes the servers it started with it (they hold the model, maybe a GPU).
    for h in list(_STARTED.values()):
        with contextlib.suppress(Exception):  # best effort at interpreter exit: nothing to report to
            h.stop(timeout=5)


# ---------------------------------------------------------------------------------- generating
def with_images(prompts: list[Any], images: Any) -> list[Any]:
    """Each text prompt as one user message with its images first (as ``image_url`` parts, the same the
    server takes); ``images`` holds one entry per prompt (an image, or a list of images)."""
    per_prompt = images if isinstance(images, (list, tuple)) and len(prompts) > 1 else [images]
    if len(per_prompt) != len(prompts):
        raise ServeError(f"images: one entry per prompt ({len(prompts)}), got {len(per_prompt)}")
    out = []
    for prompt, imgs in zip(prompts, per_prompt, strict=True):
        if not isinstance(prompt, str):
            raise ServeError(
                "images go with text prompts; in a list of messages give image_url parts instead"
            )
        imgs = list(imgs) if isinstance(imgs, (list, tuple)) else [imgs]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in imgs]
        out.append([{"role": "user", "content": [*parts, {"type": "text", "text": prompt}]}])
    return out


def data_uri(image: Any) -> str:
    """A data: URI of an image given as a path, a PIL image, raw bytes or a data: URI already."""
    import base64
    import io

    if isinstance(image, str) and image.startswith("data:"):
        return image
    if isinstance(image, (str, Path)):
        p = Path(image).expanduser()
        if not p.is_file():
            raise ServeError(f"image not found: {p.resolve()}")
        data = p.read_bytes()
    elif isinstance(image, bytes):
        data = image
    elif hasattr(image, "save"):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        data = buf.getvalue()
    else:
        raise ServeError(f"an image is a path, a PIL image or bytes, not {type(image).__name__}")
    return "data:image;base64," + base64.b64encode(data).decode("ascii")


def generate(
    run: Run | str | Path,
    prompts: str | list[Any],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    base: bool = False,
    chat: bool = True,
    device: str = "auto",
    timeout: float = 600.0,
    images: Any = None,
) -> list[str]:
    """Completions of ``prompts`` by the tuned model (``base=True``: the base model), greedy by default.

    With ``chat`` each prompt is a user message (or a list of messages) put through the chat template;
    without, raw text continued. Uses the run's server when one is up, else a one-shot process.
    ``images`` (a vision-language run): one image per prompt, or a list of them per prompt (paths, PIL
    images or data: URIs), shown before the prompt's text.
    """
    items = [prompts] if isinstance(prompts, str) else list(prompts)
    if images is not None:
        items = with_images(items, images)
    params = _params(max_new_tokens, temperature, top_p, seed, stop)
    outs = _answers(get_run(run), items, params, base=base, chat=chat, device=device, timeout=timeout)
    return [str(o.get("content") or "") if isinstance(o, dict) else str(o) for o in outs]


def chat_with_tools(
    run: Run | str | Path,
    conversations: list[list[dict[str, Any]]],
    tools: list[dict[str, Any]],
    *,
    max_new_tokens: int = 64,
    stop: str | list[str] | None = None,
    base: bool = False,
    device: str = "auto",
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """The model's answer to each conversation with ``tools`` offered (OpenAI's schemas), greedily: the
    assistant message as the server returns it (``content``, and ``tool_calls`` with JSON arguments, or
    ``nbtrain_tool_call_error`` for a malformed call). The run's server when one is up, else a one-shot
    process."""
    params = _params(max_new_tokens, 0.0, 1.0, None, stop)
    outs = _answers(get_run(run), list(conversations), params, base=base, chat=True, device=device,
                    timeout=timeout, tools=tools)  # fmt: skip
    return [o if isinstance(o, dict) else {"role": "assistant", "content": str(o)} for o in outs]


def _params(
    max_new_tokens: int, temperature: float, top_p: float, seed: int | None, stop: str | list[str] | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
    if seed is not None:
        params["seed"] = seed
    if stop is not None:
        params["stop"] = stop
    return params


def _answers(
    run: Run,
    items: list[Any],
    params: dict[str, Any],
    *,
    base: bool,
    chat: bool,
    device: str,
    timeout: float,
    tools: list[dict[str, Any]] | None = None,
) -> list[Any]:
    """Each item's answer: the chat message (a dict) or the completion's text, from the run's server when
    one is up, else from a one-shot process (nbtrain.worker.serve.generate)."""
    _generates(run)
    extra = {"tools": tools} if tools else {}
    server = find_server(run)
    if server is not None and ("base" if base else "tuned") in server.models:
        name = server.model(base)
        outs: list[Any] = []
        for p in items:
            if chat:
                msgs = [{"role": "user", "content": p}] if isinstance(p, str) else p
                body = {"model": name, "messages": msgs, **params, **extra}
                outs.append(server.request("/chat/completions", body, timeout)["choices"][0]["message"])
            else:
                r = server.request("/completions", {"model": name, "prompt": p, **params}, timeout)
                outs.append(str(r["choices"][0]["text"]))
        return outs
    if not base and not _has_weights(run):
        raise ServeError(
            f"run {run.id} has no trained weights yet (no output/ and no complete checkpoint); wait for "
            f"it to finish, or pass base=True for the base model's answers"
        )
    run_dir = run.dir.resolve()
    with tempfile.TemporaryDirectory(prefix="nbtrain-gen-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps({"prompts": items, "chat": chat, "base": base, "device": device,
                                   "params": params, **extra}), encoding="utf-8")  # fmt: skip
        argv = [sys.executable, "-m", "nbtrain.worker.serve.generate", str(run_dir), str(req), str(res)]
        log = run_dir / "logs" / "generate.log"
        offset = log.stat().st_size if log.exists() else 0  # this call's output starts there
        try:  # an interrupt stops the process group too
            code = process.run_to_end(
                argv, log=log, cwd=run_dir, env=process.job_env(), timeout=timeout, grace=5
            )
        except subprocess.TimeoutExpired:
            raise ServeError(f"generate for run {run.id} took over {timeout:.0f} s and was stopped") from None
        try:
            result = read_json(res)
        except (FileNotFoundError, ValueError):
            raise ServeError(
                f"generate for run {run.id} failed (exit code {code}).\n"
                f"--- {log} ---\n{_log_since(log, offset)}"
            ) from None
    if "error" in result:
        raise ServeError(f"generate for run {run.id}: {result['error']}")
    return list(result["outputs"])
