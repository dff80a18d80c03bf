"""Faults around a run directory: a full disk before, during and after start, a failed start. A run directory
is created whole or not at all, and a full disk is named with its path, never reported as a lost run.

The disks are real: small tmpfs mounts (skipped where this user cannot mount one)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import RunPaths, atomic_write_json, write_status
from nbtrain.control.prepare import prepare
from nbtrain.control.runs import registry
from nbtrain.control.runs.run import Run
from nbtrain.control.start import start
from tests.conftest import lora_yaml
from tests.control.test_resume import wait_step


@contextlib.contextmanager
def small_disk(where: Path, size: str = "256k") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


def test_a_full_runs_disk_refuses_the_start_naming_it_and_leaves_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prep = prepare(lora_yaml(5))
    with small_disk(workdir / "disk") as disk:
        monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(disk / "runs"))
        (disk / "runs").mkdir()
        fill(disk)
        with pytest.raises(
            NbtrainError, match=r"could not create the run directory .*no space left on the device"
        ):
            start(prep)
        assert sorted(p.name for p in (disk / "runs").iterdir()) == []  # no run dir, no .partial
        assert registry.rows() == []


def test_a_full_registry_disk_refuses_the_start_naming_nbtrain_home_and_leaves_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prep = prepare(lora_yaml(5))
    with small_disk(workdir / "home") as home:
        monkeypatch.setenv("NBTRAIN_HOME", str(home))
        registry.rows()  # the registry exists; then its disk fills up
        fill(home)
        with pytest.raises(NbtrainError, match=r"could not register the run in .*NBTRAIN_HOME"):
            start(prep)
    runs = Path(os.environ["NBTRAIN_RUNS_DIR"])
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_run_whose_disk_filled_up_mid_run_says_so_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(disk))
        paths = RunPaths(disk / "r1")
        paths.make()
        atomic_write_json(paths.resolved, {"id": "r1", "name": "r1", "config": {}})
        write_status(paths, "running", step=3, max_steps=10)
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        dead = int(gone.stdout)  # a process that has exited: the run's workers are gone
        atomic_write_json(
            paths.launch, {"pid": dead, "pgid": dead, "create_time": 1.0, "host": os.uname().nodename}
        )
        fill(disk)
        st = Run(paths.root).status()
        assert st.state == "failed" and st.error is not None
        assert st.error["type"] == "disk-full" and "no space left" in st.error["message"], st.error
        assert str(disk) in st.error["message"]


def test_a_start_whose_launch_fails_leaves_no_run_behind(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prep = prepare(lora_yaml(5))
    monkeypatch.setattr(sys, "executable", str(workdir / "no-such-python"))  # the spawner's argv[0]
    with pytest.raises(NbtrainError, match="could not start"):
        start(prep)
    assert nbtrain.runs() == []
    runs = Path(os.environ["NBTRAIN_RUNS_DIR"])
    assert list(runs.iterdir()) == []
    json.dumps(prep.to_dict())  # the prepared config is untouched and still usable


def test_one_writer_per_run_dir_concurrent_resumes_start_one_worker(workdir: Path) -> None:
    """6 resumes of one stopped run at once (what 6 `resume: auto` cells do): exactly one worker trains,
    every step is logged once; the others are refused before they change anything."""
    import threading

    from nbtrain.contract.rundir import read_jsonl

    text = lora_yaml(120).replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 4")
    run = nbtrain.finetune(text, name="locked")
    wait_step(run, 6)
    assert run.stop().state == "stopped"
    outcomes: list[str] = []

    def resume() -> None:
        try:
            nbtrain.resume(run.id)
            outcomes.append("resumed")
        except NbtrainError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=resume) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("resumed") == 1, outcomes
    assert all("locked" in o or "stop it before resuming" in o for o in outcomes if o != "resumed"), outcomes
    assert run.wait(timeout=300).state == "completed"
    steps = [int(r["step"]) for r in read_jsonl(run.paths.metrics) if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 120, steps


def test_a_worker_started_by_hand_on_a_locked_run_dir_refuses_to_write(tmp_path: Path) -> None:
    from nbtrain.contract.rundir import lock_run

    paths = RunPaths(tmp_path / "r")
    paths.make()
    write_status(paths, "running", step=3)
    before = paths.status.read_bytes()
    fd = lock_run(paths)  # a live worker holds it
    assert fd is not None and lock_run(paths) is None
    try:
        out = subprocess.run([sys.executable, "-m", "nbtrain.worker", str(paths.root)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(fd)
    assert out.returncode == 3 and "lock is held" in out.stderr
    assert paths.status.read_bytes() == before  # nothing written
    fd2 = lock_run(paths)  # released with its holder
    assert fd2 is not None
    os.close(fd2)


def test_a_loss_that_becomes_nan_fails_the_run_at_that_step_without_saving_it(workdir: Path) -> None:
    from nbtrain.contract.rundir import read_jsonl

    text = (
        lora_yaml(40, method="full")
        .replace("3.0e-3", "1.0e+30")
        .replace("  logging_steps: 1", "  logging_steps: 1\n  max_grad_norm: 0\n  save_steps: 1000")
    )
    run = nbtrain.finetune(text, name="diverges")
    st = run.wait(timeout=300, check=False)
    assert st.state == "failed", run.logs(30)
    error = st.error or {}
    assert error.get("type") == "NonFiniteTraining", error
    bad = next(r for r in read_jsonl(run.paths.metrics) if "loss" in r and r.get("nonfinite"))
    message = error["message"]
    assert f"training stopped at step {bad['step']}" in message and "learning_rate" in message
    assert st.step == bad["step"] < 40  # it stopped there, not at the end
    assert not list(run.paths.checkpoints.glob("checkpoint-*")) and not run.paths.output.exists()

    # on_nan: continue trains on, as the Trainer alone would; the steps stay flagged in the metrics.
    goes_on = nbtrain.finetune(text.replace("max_steps: 40", "max_steps: 6") + "on_nan: continue\n")
    assert goes_on.wait(timeout=300, check=False).state == "completed", goes_on.logs(30)
    assert any(r.get("nonfinite") for r in read_jsonl(goes_on.paths.metrics))
    assert "on_nan: continue goes on" in goes_on.logs(200)


def test_memory_about_to_run_out_fails_the_run_by_name_not_by_the_oom_killer(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's rule with its reserve set past the machine's memory: memory is 'about to run out' from the
    first look, and the worker (oom_score_adj raised, so the kernel's pick) fails the run by name."""
    from nbtrain.worker.control import MemoryGuard, headroom

    limit, left = headroom()
    assert 0 < left <= limit
    monkeypatch.setenv("NBTRAIN_MEMORY_RESERVE_MIB", str(limit // 2**20 + 1))
    run = nbtrain.finetune(lora_yaml(40), name="oom")
    st = run.wait(timeout=120, check=False)
    assert st.state == "failed", run.logs(30)
    error = st.error or {}
    assert error.get("type") == "OutOfMemory", error
    message = error["message"]  # whose memory it is, and what shrinks a LoRA run (never "use lora")
    assert "Whose memory (RSS): this run" in message and "per_device_train_batch_size" in message, error
    assert "method: lora" not in message, error
    assert "out of memory" in run.logs(30)
    import psutil

    pid = json.loads(run.paths.status.read_text())["pid"]
    group = [p for p in psutil.process_iter(["status"]) if _group_of(p.pid) == pid]
    assert all(p.info["status"] == psutil.STATUS_ZOMBIE for p in group), group  # nothing holds memory
    assert MemoryGuard.OOM_SCORE_ADJ > 0


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# A notebook's callback that sends the worker SIGTERM as its last step begins (as a SLURM time limit or a
# user's stop can arrive just then).
STOP_AT_LAST_STEP = """
import os, signal
from transformers import TrainerCallback


class StopAtLastStep(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps - 1:
            os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_stop_that_arrives_during_the_last_step_leaves_the_run_completed(workdir: Path) -> None:
    # "stopped" here would have a requeued SLURM job or a resume train a step past max_steps
    ns: dict[str, object] = {"__name__": "__main__"}
    exec(compile(STOP_AT_LAST_STEP, "<notebook cell>", "exec"), ns)
    run = nbtrain.finetune(
        lora_yaml(6) + "hooks:\n  callbacks: [StopAtLastStep]\n", name="last", namespace=ns
    )
    st = run.wait(timeout=300, check=False)
    assert st.state == "completed" and st.step == 6, run.logs(30)
    assert run.paths.output.is_dir()
