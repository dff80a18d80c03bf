"""The built-in OpenAI-compatible server of a run, driven over plain HTTP, and its kernel-side control:
one real server process on the shared tuned run (tests/conftest.py), started once for the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from nbtrain.control.jobs.serve import ServeError, ServerGone, ServerHandle, find_server, serve
from nbtrain.control.runs.run import get_run
from nbtrain.ui.chat import ChatWidget
from tests.conftest import TUNED_ANSWERS

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process

PROMPTS = list(TUNED_ANSWERS)
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def started(tuned_run: Path) -> Iterator[list[ServerHandle]]:
    handles = [serve(tuned_run)]
    yield handles
    for h in handles:
        h.stop()


@pytest.fixture
def server(started: list[ServerHandle], tuned_run: Path) -> ServerHandle:
    """The module's server; started again if a test stopped it (the serve --stop test does)."""
    if not started[-1].alive():
        started.append(serve(tuned_run))
    return started[-1]


def _left(pid: int) -> str | None:
    """What is left of process ``pid``: None when it is gone, or is a zombie that is not this process's
    to collect (a server forked by the warm process is reparented when that process idles out, and the
    collecting is then the new parent's: this container's init may take its time)."""
    try:
        p = psutil.Process(pid)
        status, parent = p.status(), p.ppid()
    except psutil.NoSuchProcess:
        return None
    if status == psutil.STATUS_ZOMBIE and parent != os.getpid():
        return None
    return f"{status}, parent {parent}"


def http(url: str, body: Any = None, *, raw: bytes | None = None, key: str | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with NO_PROXY.open(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def greedy(server: ServerHandle, prompt: str, model: str, **extra: Any) -> dict[str, Any]:
    status, out = http(
        server.url + "/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
         "max_tokens": 12, **extra},
        key=server.api_key,
    )  # fmt: skip
    assert status == 200, out
    return dict(out)


def test_chat_completion_answers_in_the_openai_response_shape(server: ServerHandle) -> None:
    out = greedy(server, PROMPTS[0], server.models["tuned"])
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    assert out["model"] == server.models["tuned"] == "tuned"
    choice = out["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = out["usage"]
    assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_models_lists_the_tuned_and_the_base_model(server: ServerHandle) -> None:
    status, out = http(server.url + "/models", key=server.api_key)
    assert status == 200 and out["object"] == "list"
    assert [m["id"] for m in out["data"]] == ["tuned", "tuned:base"]
    status, health = http(server.url.removesuffix("/v1") + "/health")
    assert (status, health) == (200, {"status": "ok"})
    # a LoRA run: the server process left bitsandbytes and scipy out (nbtrain.worker.lean)
    log = (server.run_dir / "logs" / "serve.log").read_text()
    assert "nbtrain serve: not loaded (this run does not use them): bitsandbytes, scipy" in log


def test_tuned_answer_differs_from_base_answer_on_training_prompts(server: ServerHandle) -> None:
    tuned = [greedy(server, p, "tuned")["choices"][0]["message"]["content"] for p in PROMPTS]
    base = [greedy(server, p, "tuned:base")["choices"][0]["message"]["content"] for p in PROMPTS]
    assert all(t != b for t, b in zip(tuned, base, strict=True)), (tuned, base)


def test_completions_and_sampling_settings_are_honoured(server: ServerHandle) -> None:
    status, out = http(
        server.url + "/completions",
        {"model": "tuned", "prompt": ["<|user|>\nSay", "What"], "max_tokens": 3},
        key=server.api_key,
    )
    assert status == 200 and out["object"] == "text_completion"
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"]["completion_tokens"] <= 6
    sampled = [
        greedy(server, PROMPTS[1], "tuned:base", temperature=1.5, top_p=0.9, seed=s, max_tokens=8)
        for s in (7, 7, 8)
    ]
    texts = [s["choices"][0]["message"]["content"] for s in sampled]
    assert texts[0] == texts[1] != texts[2]  # the seed makes sampling repeatable
    base = greedy(server, PROMPTS[1], "tuned:base", max_tokens=12)["choices"][0]["message"]["content"]
    cut = base[3:5]
    stopped = greedy(server, PROMPTS[1], "tuned:base", stop=[cut], max_tokens=12)["choices"][0]
    assert stopped["message"]["content"] == base[: base.index(cut)] and stopped["finish_reason"] == "stop"
    assert greedy(server, PROMPTS[1], "tuned", max_tokens=2)["choices"][0]["finish_reason"] == "length"


def stream(server: ServerHandle, path: str, body: dict[str, Any]) -> list[Any]:
    """The events of a streamed answer (``data:`` lines, JSON-decoded; the last one is "[DONE]")."""
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
    )
    with NO_PROXY.open(req, timeout=120) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln for ln in r.read().decode().split("\n\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines), lines
    return [ln[6:] if ln == "data: [DONE]" else json.loads(ln[6:]) for ln in lines]


def test_streamed_answers_add_up_to_the_whole_answer(server: ServerHandle) -> None:
    msgs = [{"role": "user", "content": PROMPTS[2]}]
    whole = greedy(server, PROMPTS[2], "tuned:base", max_tokens=16)["choices"][0]
    events = stream(
        server,
        "/chat/completions",
        {"model": "tuned:base", "messages": msgs, "temperature": 0, "max_tokens": 16,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == 16
    chunks = events[:-2]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(chunks) > 3  # the text came in pieces, as it was generated
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"] == "length"

    events = stream(
        server, "/completions", {"model": "tuned:base", "prompt": "What", "temperature": 0, "max_tokens": 16}
    )
    plain = "".join(e["choices"][0]["text"] for e in events[:-1])
    cut = plain[5:7]  # a stop string: the streamed text ends before it, as the whole answer does
    status, out = http(
        server.url + "/completions",
        {"model": "tuned:base", "prompt": "What", "temperature": 0, "max_tokens": 16, "stop": [cut]},
        key=server.api_key,
    )
    assert status == 200
    events = stream(
        server,
        "/completions",
        {"model": "tuned:base", "prompt": "What", "temperature": 0, "max_tokens": 16, "stop": [cut]},
    )
    stopped = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert stopped == out["choices"][0]["text"] and cut not in stopped and plain.startswith(stopped)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "tuned"}, 400, "messages must be a non-empty list"),
        ({"messages": [{"role": "user"}]}, 400, "'role' and 'content'"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, 400, "temperature must be"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens must be"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"},
            404,
            "use one of tuned, tuned:base",
        ),
    ],
)
def test_bad_requests_get_an_error_that_says_what_to_change(
    server: ServerHandle, body: Any, status: int, says: str
) -> None:
    raw = body if isinstance(body, bytes) else None
    code, out = http(server.url + "/chat/completions", None if raw else body, raw=raw, key=server.api_key)
    assert code == status
    assert says in out["error"]["message"] and out["error"]["type"] == "invalid_request_error"


def test_server_listens_on_loopback_only(server: ServerHandle) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    listening = [c for c in psutil.Process(server.pid).net_connections("tcp") if c.status == "LISTEN"]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]


def test_generate_in_a_fresh_process_equals_the_server_greedy_answer_and_never_imports_torch(
    server: ServerHandle, tuned_run: Path, tmp_path: Path
) -> None:
    # A copy of the run has no server, so generate() there runs the one-shot process; the kernel side
    # (magics, control, chat widget) is imported and used in a fresh interpreter that must stay torch-free.
    copy = tmp_path / "copy"
    shutil.copytree(tuned_run, copy, ignore=shutil.ignore_patterns("serve.json", "logs"))
    script = f"""
import json, sys
import nbtrain, nbtrain.ui.magics, nbtrain.ui.chat
from nbtrain import get_run  # the notebook handle: generate is a verb above the control Run
via_server = get_run({str(tuned_run)!r}).generate({PROMPTS!r}, max_new_tokens=12)
one_shot = get_run({str(copy)!r}).generate({PROMPTS!r}, max_new_tokens=12)
heavy = sorted(m for m in ("torch", "transformers", "peft", "bitsandbytes") if m in sys.modules)
print(json.dumps({{"server": via_server, "one_shot": one_shot, "heavy": heavy}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    expected = [greedy(server, p, "tuned")["choices"][0]["message"]["content"] for p in PROMPTS]
    assert out["server"] == expected
    assert out["one_shot"] == expected


def test_second_serve_reuses_the_server_and_a_conflicting_one_is_refused(
    server: ServerHandle, tuned_run: Path
) -> None:
    again = serve(tuned_run)
    assert again.reused and again.pid == server.pid and again.url == server.url
    with pytest.raises(ServeError, match=r"already has a server at .*serve --stop"):
        serve(tuned_run, base_only=True)
    assert find_server(tuned_run) is not None and server.alive()


def test_serve_refuses_a_run_without_trained_weights_and_starts_nothing(
    tuned_run: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(
        tuned_run, bare, ignore=shutil.ignore_patterns("output", "checkpoints", "serve.json", "logs")
    )
    with pytest.raises(ServeError, match=r"no trained weights yet .*--base-only"):
        serve(bare)
    assert not (bare / "serve.json").exists() and not (bare / "logs" / "serve.log").exists()


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    sh = InteractiveShell.instance(config=cfg)
    try:
        sh.run_line_magic("load_ext", "nbtrain")
        yield sh
    finally:
        InteractiveShell.clear_instance()


def test_serve_magic_prints_the_url_and_serve_stop_stops_the_process_group(
    server: ServerHandle, tuned_run: Path, shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("finetune", f"serve {tuned_run}")
    out = capsys.readouterr().out
    assert f"already running: tuned, tuned:base at {server.url}" in out
    # where the key is, not the key: a saved notebook keeps its output
    assert server.api_key and server.api_key not in out and ".serve().api_key" in out
    chat = shell.run_line_magic("finetune", f"chat {tuned_run} --compare-base --max-tokens 4")
    chat.wait(60)
    assert isinstance(chat, ChatWidget) and chat.compare_base and chat.max_tokens.value == 4
    assert chat.server is not None and chat.server.pid == server.pid and not chat.started_server
    chat.close()  # a server the widget did not start outlives it
    assert server.alive()
    shell.run_line_magic("finetune", f"serve --stop {tuned_run}")
    out = capsys.readouterr().out
    assert "stopped the server of" in out
    assert not _left(server.pid), out  # stopped and collected: no zombie of ours left
    assert not (tuned_run / "serve.json").exists() and find_server(get_run(tuned_run)) is None
    # the handle this notebook still holds says so when used, and how to go on (not "did not answer")
    with pytest.raises(ServerGone, match=r"is no longer running \(stopped from the sidebar or another cell"):
        server.chat("hi", max_tokens=2)
    # its repr: what it is and how to ask, no state to go stale and never the key
    shown = repr(server)
    assert shown.startswith(f"<ServerHandle of run {tuned_run.name} at {server.url} (tuned: ")
    assert ".alive() for its state" in shown and server.api_key not in shown


@pytest.mark.gpu
def test_builtin_server_on_a_gpu_answers_and_its_stop_releases_the_device(
    tuned_run: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "gpu"
    shutil.copytree(tuned_run, copy, ignore=shutil.ignore_patterns("serve.json", "logs"))
    h = serve(copy, device="cuda", engine="builtin")
    try:
        assert h.device.startswith("cuda")
        out = greedy(h, PROMPTS[0], "tuned")
        assert out["choices"][0]["message"]["content"]
    finally:
        h.stop()
    assert not psutil.pid_exists(h.pid)  # stopped and collected: no zombie left


@pytest.mark.gpu
def test_vllm_serves_the_adapter_as_a_lora_module(tuned_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    copy = tmp_path / "vllm"
    shutil.copytree(tuned_run, copy, ignore=shutil.ignore_patterns("serve.json", "logs"))
    h = serve(copy, engine="vllm", timeout=600)
    try:
        assert h.engine == "vllm"
        status, models = http(h.url + "/models", key=h.api_key)
        assert status == 200 and {"tuned", "tuned:base"} <= {m["id"] for m in models["data"]}
        tuned = greedy(h, PROMPTS[0], "tuned")["choices"][0]["message"]["content"]
        base = greedy(h, PROMPTS[0], "tuned:base")["choices"][0]["message"]["content"]
        assert tuned != base
    finally:
        h.stop(timeout=30)


def test_vllm_command_serves_the_base_with_the_runs_adapter_as_a_lora_module(tuned_run: Path) -> None:
    from nbtrain.worker.serve.server import vllm_argv

    argv, names = vllm_argv(tuned_run, base_only=False)
    resolved = json.loads((tuned_run / "resolved.json").read_text())
    assert argv[1:3] == ["serve", resolved["config"]["model"]]
    assert argv[argv.index("--lora-modules") + 1] == f"tuned={tuned_run / 'output'}"
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--served-model-name") + 1] == "tuned:base" and names == {
        "tuned": "tuned",
        "base": "tuned:base",
    }
    argv, names = vllm_argv(tuned_run, base_only=True)
    assert "--enable-lora" not in argv and names == {"base": "tuned:base"}
