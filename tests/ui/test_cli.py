"""The nbtrain command line, run as a user would (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lora_yaml


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbtrain.ui.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dry_run_prints_the_plan_and_starts_nothing(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml())
    p = cli("run", "c.yaml", "--dry-run", "--name", "clidry")
    assert p.returncode == 0, p.stderr
    assert "nbtrain dry run: clidry" in p.stdout and "train args (SFTConfig)" in p.stdout
    assert cli("ls").stdout.splitlines()[0] == "no runs yet"  # (a line on warm processes may follow)


def test_bad_config_exits_2_with_the_problems(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml().replace("method: lora", "method: lorra"))
    p = cli("run", "c.yaml")
    assert p.returncode == 2
    assert "did you mean 'lora'" in p.stderr and "line 2" in p.stderr


@pytest.mark.slow
def test_run_wait_ls_status_logs(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml(5))
    p = cli("run", "c.yaml", "--name", "clirun", "--wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "completed (step 5/5)" in p.stdout and "output:" in p.stdout
    ls = cli("ls").stdout
    assert "clirun" in ls and "completed" in ls
    assert "completed" in cli("status", "clirun").stdout
    assert "nbtrain worker: completed" in cli("logs", "clirun", "-n", "3").stdout
    assert cli("wait", "clirun").returncode == 0
    missing = cli("status", "nope")
    assert missing.returncode == 1 and "no run matches 'nope'" in missing.stderr


def test_export_and_eval_refuse_a_run_without_trained_weights(tuned_run: Path, workdir: Path) -> None:
    import shutil

    run = workdir / "untrained"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("checkpoints", "output"))
    p = cli("export", str(run), "--to", "out")
    assert p.returncode == 1 and "no trained weights" in p.stderr and not (workdir / "out").exists()
    p = cli("eval", str(run), "--compare-base")
    assert p.returncode == 1 and "no trained weights" in p.stderr and not (run / "eval").exists()


def test_probe_is_refused_for_a_bad_config_like_run(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml().replace("method: lora", "method: lorra"))
    p = cli("probe", "c.yaml", "--steps", "2", "--name", "pr")
    assert p.returncode == 2 and "did you mean 'lora'" in p.stderr
    assert cli("ls").stdout.splitlines()[0] == "no runs yet"  # (a line on warm processes may follow)


def test_record_prints_the_run_record_as_json(tuned_run: Path, workdir: Path) -> None:
    import json

    p = cli("record", str(tuned_run))
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec["run_dir"] == str(tuned_run) and rec["state"] == "completed" and rec["step"] == 40
    assert rec["final_metrics"]["loss"] < rec["first_metrics"]["loss"]
    assert "adapter_config.json" in rec["output_files"]


def _metric(run_dir: Path, key: str) -> list[float]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [float(r[key]) for r in map(json.loads, lines) if isinstance(r.get(key), (int, float))]


def test_compare_prints_the_loss_of_each_run_side_by_side(
    tuned_run: Path, qlora_run: Path, workdir: Path
) -> None:
    p = cli("compare", str(tuned_run), str(qlora_run))
    assert p.returncode == 0, p.stderr
    table, _, differ = p.stdout.partition("\nsettings that differ:\n")
    header, *rows = table.strip().splitlines()
    assert header.split()[:4] == ["id", "name", "state", "steps"] and "min loss at step" in header
    assert [r.split()[:4] for r in rows] == [
        [tuned_run.name, "tuned", "completed", "40"],
        [qlora_run.name, "qlora", "completed", "30"],
    ]
    for row, run in zip(rows, (tuned_run, qlora_run), strict=True):
        losses = _metric(run, "loss")
        first, last, lowest = (float(v) for v in row.split()[4:7])
        assert (first, last, lowest) == pytest.approx((losses[0], losses[-1], min(losses)), rel=1e-4)
    # then the settings they differ in, one row each: the method, and not what they share (the model)
    settings = {line.split()[0]: line.split()[1:] for line in differ.strip().splitlines()[1:]}
    assert settings["method"] == ["lora", "qlora"] and "model" not in settings
    p = cli("compare", str(qlora_run), "--key", "eval_loss")
    assert p.returncode == 0 and "last eval_loss" in p.stdout


def test_eval_takes_the_batch_size(run_copy: Path, workdir: Path) -> None:
    p = cli("eval", str(run_copy), "--batch-size", "0")
    assert p.returncode == 1 and "batch_size must be at least 1, not 0" in p.stderr
    p = cli("eval", str(run_copy), "--file", "data/add.jsonl", "--limit", "6", "--batch-size", "3")
    assert p.returncode == 0, p.stderr
    assert "held-out" in p.stdout and "perplexity" in p.stdout and "(saved in " in p.stdout
    log = (run_copy / "logs" / "eval.log").read_text()
    assert "--batch-size 3" in log and "--compare-base" in log  # base beside tuned unless told otherwise


def _lines_until(proc: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    """What ``proc`` printed up to the first line matching ``pattern`` (fails after ``timeout`` s)."""
    import re
    import select
    import time

    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            seen += line
            if re.search(pattern, line):
                return seen
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(
        f"no line matching {pattern!r} in:\n{seen}\n{proc.stderr.read() if proc.stderr else ''}"
    )


def _serve_in_background(run: Path) -> tuple[subprocess.Popen[str], str]:
    import re

    proc = subprocess.Popen(
        [sys.executable, "-m", "nbtrain.ui.cli", "serve", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = _lines_until(proc, r"at http://\S+/v1 ", 300)
    url = re.search(r"at (http://\S+/v1) ", out)
    assert url is not None and "Ctrl-C stops it" in out
    return proc, url.group(1)


@pytest.mark.slow
def test_serve_serves_in_the_foreground_until_stopped(run_copy: Path, workdir: Path) -> None:
    import json
    import signal
    import urllib.request

    import psutil

    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    proc, url = _serve_in_background(run_copy)
    try:
        info = json.loads((run_copy / "serve.json").read_text())
        server, key = info["pid"], info["api_key"]
        request = urllib.request.Request(f"{url}/models", headers={"Authorization": f"Bearer {key}"})
        with no_proxy.open(request, timeout=30) as r:
            assert len(json.load(r)["data"]) >= 1
        # a second command finds the server of the first and leaves it to it
        again = cli("serve", str(run_copy))
        assert again.returncode == 0 and "already running" in again.stdout and url in again.stdout
        assert f"API key: {key}" in again.stdout  # a terminal shows the key to paste into a client
        # stopped from elsewhere: the serving command notices and ends
        stop = cli("serve", "--stop", str(run_copy))
        assert stop.returncode == 0 and "stopped the server of" in stop.stdout, stop.stderr
        assert proc.wait(timeout=60) == 0
        assert "the server of" in (proc.stdout.read() if proc.stdout else "")
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()
    # Ctrl-C in the terminal stops the server with the command
    proc, url = _serve_in_background(run_copy)
    try:
        server = json.loads((run_copy / "serve.json").read_text())["pid"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped the server of" in (proc.stdout.read() if proc.stdout else "")
        assert not (run_copy / "serve.json").exists()
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()


@pytest.mark.slow
def test_tensorboard_starts_and_stops_from_the_terminal(qlora_run: Path, tmp_path: Path) -> None:
    import re
    import shutil
    import urllib.request

    run = tmp_path / "runs" / qlora_run.name
    shutil.copytree(qlora_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    p = cli("tensorboard", str(run))
    assert p.returncode == 0, p.stderr
    url = re.search(r"TensorBoard started at (http://127\.0\.0\.1:\d+/)", p.stdout)
    assert url is not None and "--stop" in p.stdout
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(url.group(1), timeout=30) as r:
        assert r.status == 200
    assert "already running" in cli("tensorboard", str(run)).stdout
    stop = cli("tensorboard", str(run), "--stop")
    assert stop.returncode == 0 and "TensorBoard stopped" in stop.stdout
    assert "TensorBoard was not running" in cli("tensorboard", str(run), "--stop").stdout
