"""Trust boundaries (issue 36): what another local user can leave in a shared runs root, a copied run
directory, and a status file of the wrong shape. Another user is real here: uid 65534 through ``setpriv``
(the tests that need it skip where this user cannot switch uids)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import atomic_write_json
from nbtrain.control.runs.run import Run
from tests.conftest import lora_yaml

NOBODY = 65534


def as_nobody(code: str) -> None:
    """Run ``code`` (Python) as uid/gid 65534: the system's Python, which any user may run."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another uid needs root and setpriv")
    who = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    subprocess.run(["setpriv", *who, "/usr/bin/python3", "-c", code], check=True, timeout=60, cwd="/")


def started(config: str, monkeypatch: pytest.MonkeyPatch, name: str) -> nbtrain.Run:
    """A registered run directory made by start() whose process is never launched."""
    from nbtrain.control import start

    monkeypatch.setattr(start, "_launch", lambda prep, run, lock: run)
    return nbtrain.start(nbtrain.prepare(config, name=name, namespace={}))


def test_a_copied_run_directory_leaves_the_registry_as_it_is(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    run = started(lora_yaml(), monkeypatch, "original")
    shutil.copytree(run.dir, run.dir.parent / "copied-by-hand")  # the same id in its resolved.json
    for _ in range(3):  # every listing
        assert [r.id for r in nbtrain.runs()] == [run.id]
    home = Path(os.environ["NBTRAIN_HOME"])
    assert not [p.name for p in home.rglob("*corrupt*")]  # the registry was never set aside
    assert not [w for w in recwarn if "unreadable" in str(w.message)]


def test_a_status_file_with_fields_of_the_wrong_type_still_reads(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = started(lora_yaml(), monkeypatch, "odd-status")
    atomic_write_json(run.paths.status, {
        "state": "stopped", "step": 12, "max_steps": [30], "error": "disk on fire",
        "updated": "yesterday", "summary": ["not", "a", "mapping"],
    })  # fmt: skip
    st = run.status()
    assert (st.step, st.max_steps, st.updated, st.summary) == (12, None, None, {})
    assert st.error == {"type": "error", "message": "disk on fire"}
    assert st.describe() == "stopped (step 12): error: disk on fire"
    from nbtrain.ui.text import status_text

    assert "stopped" in status_text(run)


@pytest.fixture
def shared_runs(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runs root everyone may write to (a course's shared folder), with the sticky bit as /tmp has; in
    /tmp, which every user can reach (pytest's own folders are private)."""
    root = Path(tempfile.mkdtemp(prefix="nbtrain-shared-runs-"))
    root.chmod(0o1777)
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_another_users_run_directory_is_neither_listed_nor_resumed_nor_stopped(
    shared_runs: Path, workdir: Path
) -> None:
    # one of my processes, in a group of its own, that the other user's launch.json names
    mine = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        victim = psutil.Process(mine.pid)
        forged = {
            "argv": ["sleep", "300"], "pid": mine.pid, "pgid": mine.pid, "create_time": victim.create_time(),
            "host": socket.gethostname(), "start_time": time.time(), "procs": [],
        }  # fmt: skip
        resolved = {
            "id": "20261205-120000-theirs-abcd", "name": "theirs",
            "config": {"model": str(workdir / "tiny-llama"), "method": "lora", "trust_remote_code": True,
                       "data": {"train": str(workdir / "data" / "add.jsonl")}},
        }  # fmt: skip
        run_dir = shared_runs / "20261205-120000-theirs-abcd"
        as_nobody(
            "import json, os, pathlib\n"
            f"d = pathlib.Path({str(run_dir)!r}); d.mkdir(); (d / 'control').mkdir()\n"
            f"(d / 'resolved.json').write_text(json.dumps({resolved!r}))\n"
            f"(d / 'launch.json').write_text(json.dumps({forged!r}))\n"
            "(d / 'status.json').write_text(json.dumps({'state': 'running', 'step': 3}))\n"
            "for p in [d, *d.iterdir()]: os.chmod(p, 0o777 if p.is_dir() else 0o666)\n"
        )
        assert [r.name for r in nbtrain.runs()] == []  # not listed
        theirs = Run(run_dir)
        with pytest.raises(NbtrainError, match=rf"not stopping run .*owned by uid {NOBODY}, not by you"):
            theirs.stop(timeout=5)
        assert mine.poll() is None and victim.is_running()  # my process was not signalled
        atomic_write_json(
            run_dir / "status.json", {"state": "stopped", "step": 3}
        )  # resumable, if it were mine
        with pytest.raises(NbtrainError, match=rf"not resuming run .*owned by uid {NOBODY}"):
            nbtrain.resume(run_dir)
        assert not (run_dir / "logs").exists()  # nothing of it ran
    finally:
        mine.send_signal(signal.SIGKILL)
        mine.wait()


def test_a_notebook_launcher_record_of_another_user_signals_none_of_my_pids(
    shared_runs: Path, workdir: Path
) -> None:
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        run_dir = shared_runs / "20261205-120001-ranks-abcd"
        record = {"notebook": True, "kernel_pid": os.getpid(), "start_time": time.time() + 60,
                  "host": socket.gethostname()}  # fmt: skip
        as_nobody(
            "import json, os, pathlib\n"
            f"d = pathlib.Path({str(run_dir)!r}); d.mkdir(); (d / 'control').mkdir()\n"
            "(d / 'resolved.json').write_text(json.dumps({'id': d.name, 'name': 'ranks', 'config': {}}))\n"
            f"(d / 'launch.json').write_text(json.dumps({record!r}))\n"
            "(d / 'status.json').write_text(json.dumps({'state': 'running', 'step': 1}))\n"
            f"(d / 'control' / 'pid-rank0').write_text('{mine.pid}')\n"
        )
        with pytest.raises(NbtrainError, match="not stopping run"):
            Run(run_dir).stop(timeout=5)
        assert mine.poll() is None
    finally:
        mine.kill()
        mine.wait()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # left as it was


def test_exit_files_nobody_will_read_are_removed_at_the_next_start(workdir: Path) -> None:
    from nbtrain.contract import warmproto
    from nbtrain.control.launch import warmclient

    exits = warmproto.warm_dir(os.environ) / "exit"
    exits.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (exits / f"{gone.pid}-1").write_text("0")  # its asker is gone: nobody reads it
    (exits / f"{os.getpid()}-2").write_text("0")  # this process may still read it
    old = exits / f"{os.getpid()}-3"
    old.write_text("0")
    os.utime(old, (time.time() - 2 * 86400,) * 2)  # two days unread
    env = {**os.environ, "NBTRAIN_WARM": "1"}
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.preview"]
    with open(workdir / "log", "ab") as log:
        warmclient.try_warm(argv, log_fd=log.fileno(), cwd=workdir, env=env, pass_fds=())
    left = {p.name for p in exits.iterdir()}
    assert f"{gone.pid}-1" not in left and f"{os.getpid()}-3" not in left and f"{os.getpid()}-2" in left


def test_a_run_that_sets_its_thread_count_is_not_forked_from_a_process_with_another() -> None:
    from nbtrain.contract import warmproto

    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    plain = warmproto.env_key(base)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        one = warmproto.env_key({**base, var: "1"})
        assert one != plain and one != warmproto.env_key({**base, var: "2"})  # a warm process of its own
    assert warmproto.env_key({**base, "CUDA_VISIBLE_DEVICES": "1"}) == plain  # read in the child: shared


def test_a_warm_folder_another_user_made_first_gets_no_request_and_no_secret(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.contract import warmproto
    from nbtrain.control.launch import warmclient

    folder = Path(tempfile.mkdtemp(prefix="nbtrain-their-warm-"))
    got = folder / "what-i-received"
    env = {**os.environ, warmproto.ENV_DIR: str(folder / "warm"), "HF_TOKEN": "hf_secret_of_mine"}
    sock = warmproto.socket_path(warmproto.env_key(env), env)
    folder.chmod(0o777)  # /tmp-like: anyone may make the warm folder first
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another uid needs root and setpriv")
    listening = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import os, pathlib, socket\n"
            f"d = pathlib.Path({str(sock.parent)!r}); d.mkdir(mode=0o777); os.chmod(d, 0o777)\n"
            "s = socket.socket(socket.AF_UNIX); "
            f"s.bind({str(sock)!r}); os.chmod({str(sock)!r}, 0o777); s.listen(); s.settimeout(8)\n"
            "try:\n    c, _ = s.accept(); c.settimeout(3)\n"
            f"    pathlib.Path({str(got)!r}).write_bytes(c.recv(1 << 20))\n"
            "except OSError:\n    pass\n",
        ],
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline and listening.poll() is None
            time.sleep(0.05)
        argv = [sys.executable, "-m", "nbtrain.worker", str(workdir)]
        with open(workdir / "log", "ab") as log:
            cold = warmclient.try_warm(argv, log_fd=log.fileno(), cwd=workdir, env=env, pass_fds=())
        assert isinstance(cold, warmclient.Cold) and not cold.start_one
        assert f"owned by uid {NOBODY}, not by you" in str(cold)
        assert listening.wait(timeout=20) == 0
        assert not got.exists()  # nothing reached their socket: no environment, no token, no descriptor
    finally:
        listening.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_warm_folder_and_the_registry_read_nbtrain_home_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.contract import warmproto
    from nbtrain.contract.paths import home_dir

    monkeypatch.chdir(tmp_path)
    for home in ("~/nb-home", "relative/home", str(tmp_path / "abs")):
        env = {k: v for k, v in os.environ.items() if k != warmproto.ENV_DIR} | {"NBTRAIN_HOME": home}
        assert warmproto.warm_dir(env) == home_dir(env) / "warm"
        assert warmproto.warm_dir(env).is_absolute() and "~" not in str(warmproto.warm_dir(env))
