"""Idle warm processes are bounded (issue 57): one per NBTRAIN_HOME and environment key, ~300-540 MB each,
25 of them once held 13 GB while a run was stopped for lack of memory. At most NBTRAIN_WARM_MAX per user,
across homes (the least recently used idle one exits first); one exits when the machine's available memory
falls below its floor; `%finetune warm` lists each with its memory, idle time and environment. Real warm
processes, each in this test's own folders (the session's are not touched), all stopped at the end."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from nbtrain.contract import warmproto
from nbtrain.control.launch import warm
from nbtrain.control.launch.process import LaunchFailed, job_env, start_process
from nbtrain.ui.verbs import VERBS

pytestmark = pytest.mark.slow


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's own per-user folder; every warm process registered in it is stopped at the end."""
    folder = tmp_path / "user"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(warmproto.ENV_USER_DIR, str(folder))
    monkeypatch.setenv(warmproto.ENV_IDLE, "300")
    yield folder
    for entry in warmproto.registered():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(int(entry["pid"]))
            if abs(proc.create_time() - float(entry["created"])) <= 1:  # the very process, not a reused pid
                proc.terminate()
                proc.wait(timeout=20)


def env_of(tmp_path: Path, home: str, flavour: str) -> dict[str, str]:
    """An environment with its own warm folder (a home) and import-time key (an HF_ variable)."""
    return {**os.environ, warmproto.ENV_DIR: str(tmp_path / home / "warm"), "HF_NBTRAIN_BOUND_TEST": flavour}


def key_of(env: Mapping[str, str]) -> str:
    return warmproto.env_key({**env, **job_env()})


def wait_registered(env: Mapping[str, str], timeout: float = 240) -> dict:
    """The registered entry of ``env``'s warm process once it is ready (its socket is named)."""
    key = key_of(env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [e for e in warmproto.registered(env) if e["key"] == key and e.get("socket")]
        if ready and Path(ready[0]["socket"]).exists():
            return ready[0]
        time.sleep(0.2)
    raise AssertionError(f"no warm process for {key} became ready: {warmproto.registered(env)}")


def alive(entry: Mapping) -> bool:
    return warmproto.is_warm_process(int(entry["pid"]), float(entry["created"]))


def use(entry: Mapping, env: Mapping[str, str]) -> str:
    """One request the warm process answers (cold: a module it does not serve): it was used now."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(entry["socket"]))
        request = {"argv": [sys.executable, "-m", "os"], "cwd": "/", "env": {**env, **job_env()}}
        warmproto.send_request(s, request, [])
        return str(warmproto.recv_reply(s).get("cold"))


def test_a_bound_of_two_over_three_environments_in_two_homes_keeps_the_two_most_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_dir: Path
) -> None:
    monkeypatch.setenv(warmproto.ENV_MAX, "2")
    first, second = env_of(tmp_path, "home1", "a"), env_of(tmp_path, "home1", "b")
    third = env_of(tmp_path, "home2", "c")  # another NBTRAIN_HOME of the same user: the bound is per user
    assert warm.start(first) and warm.start(second)  # two at once (the bound is 2): both start
    a, b = wait_registered(first), wait_registered(second)
    time.sleep(0.05)
    assert "not served warm" in use(a, first)  # a is now used more recently than b, though older
    assert warm.start(third)
    c = wait_registered(third)

    assert alive(a) and alive(c) and not alive(b)  # the least recently used idle one exited first
    assert {e["key"] for e in warmproto.registered()} == {a["key"], c["key"]}
    log = (tmp_path / "home2" / "warm" / f"{c['key']}.log").read_text()
    assert f"warm process {b['pid']} (key {b['key']}" in log and "exited to make room" in log
    assert f"asked to exit: warm process {c['pid']} starts" in (
        (tmp_path / "home1" / "warm" / f"{b['key']}.log").read_text()
    )

    # `%finetune warm` lists every warm process of this user, whatever its home: memory, idle time, env
    monkeypatch.setenv(warmproto.ENV_DIR, first[warmproto.ENV_DIR])
    text = VERBS["warm"].call(argparse.Namespace(action="status"))
    rows = {r["pid"]: r for r in warm.status(every_home=True)}
    assert set(rows) == {a["pid"], c["pid"]}
    for entry, home in ((a, "home1"), (c, "home2")):
        row = rows[entry["pid"]]
        assert row["rss_bytes"] > 50 * 2**20 and row["idle_s"] is not None and row["idle_s"] >= 0
        line = next(x for x in text.splitlines() if x.startswith(f"warm process {entry['pid']}: "))
        held = re.match(rf"warm process {entry['pid']}: (\d+) MiB held, idle \d+ s, up \d+ s", line)
        assert held and abs(int(held[1]) - row["rss_bytes"] / 2**20) < 20, line
        assert f"environment {entry['key']} ({sys.executable}, {tmp_path / home / 'warm'})" in line
    assert f"warm process {b['pid']}" not in text
    # and `%finetune list` says under the runs what they hold together
    from nbtrain.ui.text import warm_line

    together = re.match(r"2 warm processes of yours, ([\d,]+) MiB held \(idle ones exit", warm_line() or "")
    total = sum(rows[e["pid"]]["rss_bytes"] for e in (a, c)) / 2**20
    assert together and abs(int(together[1].replace(",", "")) - total) < 40, warm_line()

    # what a run refused for memory asks of them: every idle one exits, its memory given back
    gone = warm.release_idle("a run needs the memory")
    assert {g["pid"] for g in gone} == {a["pid"], c["pid"]} and all(g["rss_bytes"] > 0 for g in gone)
    assert not alive(a) and not alive(c) and not warmproto.registered()
    assert not Path(a["socket"]).exists() and not Path(c["socket"]).exists()


def test_an_idle_warm_process_exits_when_available_memory_falls_below_its_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_dir: Path
) -> None:
    floor_mb = 2 * psutil.virtual_memory().total // 2**20  # more than this machine has at all
    env = {**env_of(tmp_path, "home", "floor"), warmproto.ENV_MIN_AVAILABLE: str(floor_mb)}
    folder = Path(env[warmproto.ENV_DIR])
    assert not warm.start(env)  # the spawner starts none below the floor
    assert not folder.exists() or not list(folder.iterdir())
    monkeypatch.setenv(warmproto.ENV_DIR, str(folder))
    monkeypatch.setenv(warmproto.ENV_MIN_AVAILABLE, str(floor_mb))
    said = VERBS["warm"].call(argparse.Namespace(action="start"))
    assert said.startswith("no warm process started: the machine has ") and f"below {floor_mb} MiB" in said
    assert not folder.exists() or not list(folder.iterdir())

    # one started anyway (by hand, as the spawner would): it imports, serves, and at its first idle look
    # at the machine's memory gives it back
    folder.mkdir(parents=True, mode=0o700)
    key = key_of(env)
    started = start_process(
        [sys.executable, "-m", "nbtrain.worker.warm"], log=folder / f"{key}.log", cwd=folder,
        env={**env, **job_env()}, replace_env=True, warm=False,
    )  # fmt: skip
    assert not isinstance(started, LaunchFailed)
    proc = psutil.Process(started.pid)
    assert proc.wait(timeout=240) == 0
    log = (folder / f"{key}.log").read_text()
    assert "nbtrain warm: ready in" in log, log
    assert f"MiB ({warmproto.ENV_MIN_AVAILABLE}): exiting to give its memory back" in log, log
    assert f"below {floor_mb} MiB" in log
    assert not warmproto.socket_path(key, env).exists() and not warmproto.registered()


def test_a_run_short_of_ram_only_by_what_idle_warm_processes_hold_has_them_exit_and_fits(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, user_dir: Path
) -> None:
    from dataclasses import replace

    from nbtrain.control.plan.planner import make_plan
    from nbtrain.control.prepare import prepare, reclaim_warm_memory
    from nbtrain.hardware import probe
    from tests.conftest import lora_yaml

    env = env_of(workdir, "home", "ram")
    assert warm.start(env)
    entry = wait_registered(env)
    prep = prepare(lora_yaml(2), hardware=probe())
    # the machine as it would be with 1 MiB available: the tiny run (~60 MiB) fits only in what the warm
    # process holds (~300-500 MiB), so it is asked to exit, and the run is planned on what is there then
    tight = replace(prep.hardware, ram_available=2**20)
    refused = make_plan(prep.resolved, tight)
    assert not refused.fits and "in RAM" in refused.fit_advice

    hw, plan = reclaim_warm_memory(prep.resolved, tight, refused)
    assert plan.fits and hw.ram_available > 2**30  # a fresh probe: the memory the machine has now
    assert "1 idle warm process(es) exited to give their" in " ".join(plan.reasons)
    assert not alive(entry) and not warmproto.registered()
