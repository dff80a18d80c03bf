"""Issue 57 (N3 and the findings beside it): the files of a run directory that decide what nbtrain does to
processes or where prompts go (serve.json, tensorboard.json, launch.json) are acted on only when they and
their folder are this user's (``RunPaths.not_yours``); a registry row that names no run directory of this
user's is no run; a launch.json of garbage makes a lost run, not one running for ever. Another user is
real here: uid 65534 through ``setpriv``, as in test_trust_faults.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import tornado.web

import nbtrain
from nbtrain.contract.errors import NbtrainError, RunNotFound
from nbtrain.contract.rundir import atomic_write_json, write_status
from nbtrain.control.jobs import serve as serving
from nbtrain.control.launch import process, tracking
from nbtrain.control.runs import registry
from nbtrain.control.runs.run import Run, create_run_dir
from nbtrain.ui.server import handlers
from tests.faults.test_trust_faults import NOBODY, as_nobody, shared_runs  # noqa: F401 - a fixture

PLACES = ["their folder", "their file in my folder"]


@pytest.fixture
def mine() -> Iterator[subprocess.Popen[bytes]]:
    """One of my processes, leading a group of its own: what a forged file would have nbtrain stop."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


class TheirServer:
    """Another user's OpenAI-like server on loopback: it keeps every request that reaches it."""

    def __init__(self) -> None:
        got: list[bytes] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                got.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": "theirs"},
                                               "text": "theirs"}]}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def their_server() -> Iterator[TheirServer]:
    s = TheirServer()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def group_record(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """pid, process group and start time of ``proc``, as serve.json and tensorboard.json keep them."""
    return {"pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}


def plant(shared: Path, place: str, name: str, content: dict[str, Any]) -> Path:
    """A finished run directory holding ``name`` (``content``) written by uid 65534: the whole folder theirs,
    or my run's folder, writable by others, with only that file theirs. Returns the folder."""
    if place == "their folder":
        run_dir = shared / "20261205-120000-theirs-abcd"
        resolved = {"id": run_dir.name, "name": "theirs", "config": {}}
        as_nobody(
            "import json, pathlib\n"
            f"d = pathlib.Path({str(run_dir)!r}); d.mkdir(); (d / 'logs').mkdir()\n"
            f"(d / 'resolved.json').write_text(json.dumps({resolved!r}))\n"
            "(d / 'status.json').write_text(json.dumps({'state': 'completed', 'step': 3}))\n"
            f"(d / {name!r}).write_text(json.dumps({content!r}))\n"
        )
        return run_dir
    run = create_run_dir("mine", "model: x\n", {"config": {}})
    write_status(run.paths, "completed")
    run.dir.chmod(0o777)
    as_nobody(
        f"import json, pathlib\npathlib.Path({str(run.dir / name)!r}).write_text(json.dumps({content!r}))"
    )
    return run.dir


@pytest.mark.parametrize("place", PLACES)
def test_another_users_serve_json_neither_stops_my_processes_nor_gets_my_prompts(
    shared_runs: Path,  # noqa: F811 - the fixture imported above
    mine: subprocess.Popen[bytes],
    their_server: TheirServer,
    place: str,
) -> None:
    forged = {**group_record(mine), "url": f"{their_server.url}/v1", "models": {"tuned": "t", "base": "b"},
              "api_key": "their-key", "engine": "builtin", "device": "cpu"}  # fmt: skip
    run_dir = plant(shared_runs, place, "serve.json", forged)
    says = rf"not using the server of run .*owned by uid {NOBODY}, not by you"
    with pytest.raises(serving.ServeError, match=says):
        serving.stop_serving(run_dir)
    assert mine.poll() is None  # my process group was not signalled
    with pytest.raises(serving.ServeError, match=says):
        serving.serve(run_dir)  # not their server handed back as a reused one, with its URL and key
    with pytest.raises(serving.ServeError, match=says):
        serving.generate(run_dir, "my private prompt")
    with pytest.raises(serving.ServeError, match=says):
        serving.find_server(run_dir)
    assert their_server.got == []  # no prompt reached their server
    assert not (run_dir / "logs" / "serve.log").exists()  # and no server of mine was started on their files
    assert mine.poll() is None


@pytest.mark.parametrize("place", PLACES)
def test_another_users_tensorboard_json_neither_stops_my_processes_nor_is_handed_back(
    shared_runs: Path,  # noqa: F811 - the fixture imported above
    mine: subprocess.Popen[bytes],
    place: str,
) -> None:
    forged = {**group_record(mine), "port": 6006, "url": "http://127.0.0.1:6006/"}
    run_dir = plant(shared_runs, place, "tensorboard.json", forged)
    says = rf"not using the TensorBoard of run .*owned by uid {NOBODY}, not by you"
    with pytest.raises(NbtrainError, match=says):
        tracking.stop_tensorboard(run_dir, timeout=5)
    assert mine.poll() is None
    with pytest.raises(NbtrainError, match=says):
        tracking.tensorboard(run_dir, timeout=5)
    assert (run_dir / "tensorboard.json").exists()  # their file left as it was
    assert mine.poll() is None


def test_registry_rows_naming_no_run_directory_of_mine_are_never_listed_nor_looked_up(
    shared_runs: Path,  # noqa: F811 - the fixture imported above
) -> None:
    ok = create_run_dir("ok", "model: x\n", {"config": {}})
    theirs = shared_runs / "20261205-120002-theirs-abcd"
    as_nobody(
        "import json, pathlib\n"
        f"d = pathlib.Path({str(theirs)!r}); d.mkdir()\n"
        f"(d / 'resolved.json').write_text(json.dumps({{'id': d.name, 'name': 'theirs', 'config': {{}}}}))\n"
        "(d / 'status.json').write_text(json.dumps({'state': 'running', 'step': 1}))\n"
    )
    rows = {"root-row": "/", "etc-row": "/etc", "relative-row": os.path.relpath("/etc")}
    rows[theirs.name] = str(theirs)
    for run_id, where in rows.items():
        registry.add(run_id, run_id, Path(where))  # a registry written by hand, or by another tool
    assert [r.id for r in nbtrain.runs()] == [ok.id]  # nbtrain.runs() and %finetune list
    assert [r["id"] for r in handlers.list_runs()] == [ok.id]  # the server extension's GET runs
    for run_id in rows:
        with pytest.raises(RunNotFound, match="no run matches"):
            nbtrain.get_run(run_id)
        with pytest.raises(tornado.web.HTTPError) as e:
            handlers.run_status(run_id)  # GET runs/ID (and every route of one run: they look up alike)
        assert e.value.status_code in (400, 404)
    assert handlers.run_status(ok.id)["state"] == "queued"


GARBAGE = {
    "not JSON": ("{not json", "Expecting property name"),
    "an array": ("[1, 2]", "it holds an array, not a JSON object"),
    "null": ("null", "it holds null, not a JSON object"),
    "no host": ('{"pid": 12345, "create_time": 1.0}', "it names no host"),
    "no pid": (json.dumps({"host": socket.gethostname(), "pgid": 12345}), "it names no process id"),
    "a notebook record without its kernel": (
        json.dumps({"notebook": True, "host": socket.gethostname()}),
        "names no kernel pid and start time",
    ),
}


@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_a_running_run_whose_launch_json_is_garbage_reads_lost_with_the_reason(garbage: str) -> None:
    text, why = GARBAGE[garbage]
    run = create_run_dir("garbled", "model: x\n", {"config": {}})
    write_status(run.paths, "running", step=3)
    run.paths.launch.write_text(text, encoding="utf-8")
    st = run.status()
    assert (st.state, st.error and st.error["type"]) == ("failed", "lost"), st
    assert st.error is not None
    message = st.error["message"]
    assert f"{run.paths.launch} is not a launch record nbtrain wrote" in message and why in message
    assert "Resume it from its last checkpoint" in message
    assert Run(run.dir).status().state == "failed"  # written down: every reader sees it the same


@pytest.fixture
def nobodys() -> Iterator[psutil.Process]:
    """A live process of uid 65534, leading a group of its own."""
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root and setpriv")
    who = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    proc = subprocess.Popen(["setpriv", *who, "sleep", "300"], start_new_session=True, cwd="/")
    try:
        p = psutil.Process(proc.pid)
        deadline = time.monotonic() + 10
        while p.uids().real != NOBODY:  # setpriv has not switched yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield p
    finally:
        proc.kill()
        proc.wait()


def test_a_launch_json_naming_another_users_live_process_reads_lost_and_signals_it_not(
    nobodys: psutil.Process,
) -> None:
    run = create_run_dir("not-ours", "model: x\n", {"config": {}})
    write_status(run.paths, "running", step=3)
    rec = {"pid": nobodys.pid, "pgid": nobodys.pid, "create_time": nobodys.create_time()}
    atomic_write_json(run.paths.launch, {**rec, "procs": [rec], "host": socket.gethostname(), "argv": ["x"],
                                         "start_time": time.time()})  # fmt: skip
    st = run.status()
    assert (st.state, st.error and st.error["type"]) == ("failed", "lost")  # not running for ever
    info = process.read_launch(run.paths)
    assert info is not None and not process.signal_group(info, signal.SIGTERM)
    assert nobodys.is_running() and nobodys.status() != psutil.STATUS_ZOMBIE


def test_another_users_finished_run_is_not_moved_to_the_trash(
    shared_runs: Path,  # noqa: F811 - the fixture imported above
) -> None:
    from nbtrain.control.runs.run import trash_run

    run_dir = shared_runs / "20261205-120002-done-abcd"
    as_nobody(
        "import json, os, pathlib\n"
        f"d = pathlib.Path({str(run_dir)!r}); d.mkdir()\n"
        "(d / 'resolved.json').write_text(json.dumps({'id': d.name, 'name': 'done', 'config': {}}))\n"
        "(d / 'status.json').write_text(json.dumps({'state': 'completed', 'step': 4}))\n"
        "for p in [d, *d.iterdir()]: os.chmod(p, 0o777 if p.is_dir() else 0o666)\n"
    )
    with pytest.raises(NbtrainError, match=rf"not deleting run .*owned by uid {NOBODY}"):
        trash_run(Run(run_dir))
    assert run_dir.is_dir() and not (shared_runs / ".trash").exists()
