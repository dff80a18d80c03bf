"""SLURM runs on a real cluster (tests/slurmcluster.py: munged, slurmctld and two one-CPU slurmd on this
machine): the run's state is SLURM's, stop cancels, time limits requeue. ``make test`` installs SLURM and
requires these tests (NBTRAIN_REQUIRE_SLURM); elsewhere a machine without SLURM skips them, saying why."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.rundir import latest_complete_checkpoint
from nbtrain.control.launch import slurm
from tests.conftest import lora_yaml
from tests.slurmcluster import Cluster, missing, on_slurm, slowed

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(slurm_cluster: Cluster) -> Cluster:
    return slurm_cluster


def job_of(run: nbtrain.Run) -> str:
    return str(json.loads(run.paths.status.read_text())["slurm_job"])


def until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:g} s")
        time.sleep(0.3)


def test_a_two_node_ddp_run_completes_with_falling_loss_and_reads_slurms_state_meanwhile(
    cluster: Cluster, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = nbtrain.finetune(on_slurm(20, nodes=2), name="ddp")
    if slurm.filesystem(run.dir) in slurm.LOCAL_FILESYSTEMS:  # the nodes are this machine here
        assert "set NBTRAIN_RUNS_DIR to a folder on storage the nodes share" in capsys.readouterr().out
    seen = until(
        lambda: (st := run.status()).slurm and st.slurm.get("state") == "RUNNING" and st, 60, "running"
    )
    assert "n[1-2]" in seen.slurm["words"] or "n1" in seen.slurm["words"]
    st = run.wait(timeout=240)
    assert st.state == "completed"
    loss = run.metrics()["loss"].dropna()
    assert loss.iloc[-3:].mean() < loss.iloc[:3].mean()
    assert "--nodes=2" in (run.dir / "slurm.sbatch").read_text()


def test_a_pending_job_reads_queued_with_slurms_reason_and_stop_cancels_it(
    cluster: Cluster, workdir: Path
) -> None:
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--wrap", "sleep 300").stdout.strip()
    try:
        until(lambda: blocker not in cluster.run("squeue", "-h", "-t", "PD", "-o", "%i").stdout.split(), 30,
              "the blocker running")  # fmt: skip
        run = nbtrain.finetune(on_slurm(10), name="pending")
        st = until(lambda: (s := run.status()).slurm and s.slurm.get("reason") and s, 30, "a pending reason")
        assert st.state == "queued" and st.slurm["state"] == "PENDING"
        assert st.slurm["reason"] in ("Resources", "Priority") and st.slurm["position"] == 1
        assert "position 1 in the queue" in st.slurm["words"]
        # and, once SLURM's backfill has planned it, when it expects to start it
        assert (st.phase_text() or "").startswith(f"SLURM job {job_of(run)} pending ({st.slurm['reason']})")
        t = time.monotonic()
        final = run.stop(timeout=30)
        assert final.state == "stopped" and time.monotonic() - t < 10
        assert job_of(run) not in cluster.jobs()
        assert slurm.query(job_of(run), fresh=True).state == "CANCELLED"  # type: ignore[union-attr]
    finally:
        cluster.run("scancel", blocker, check=False)


def test_a_job_failing_before_the_worker_starts_reads_failed_with_slurms_exit_code(
    cluster: Cluster, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rendezvous that cannot happen (the job's MASTER_PORT comes from this environment): torchrun exits
    # before any worker starts, and nothing but SLURM can say what became of the run.
    monkeypatch.setenv("MASTER_PORT", "99999999")
    run = nbtrain.finetune(on_slurm(10), name="early-death")
    ended = until(lambda: slurm.query(job_of(run), fresh=True).ended, 120, "the job ending")  # type: ignore[union-attr]
    assert ended
    t = time.monotonic()
    st = until(lambda: (s := run.status()).done and s, 30, "the run's final state")
    assert time.monotonic() - t < 30 and st.state == "failed"
    err = st.error or {}
    assert err["type"] == "slurm" and "FAILED" in err["message"] and "exit code" in err["message"]
    assert f"slurm-{job_of(run)}.log" in err["message"]


def test_scancel_from_outside_while_training_reads_stopped_by_slurm(cluster: Cluster, workdir: Path) -> None:
    run = nbtrain.finetune(on_slurm(100000), name="cancelled")
    until(lambda: run.status().step >= 3, 120, "training")
    cluster.run("scancel", job_of(run))
    st = until(lambda: (s := run.status()).done and s.slurm and s, 60, "stopped, with SLURM's word")
    assert st.state == "stopped"
    status = json.loads(run.paths.status.read_text())
    assert status["stop_reason"] == "slurm-cancelled" and "cancelled in SLURM (scancel)" in status["note"]


def test_stop_while_training_checkpoints_and_resume_submits_a_job_that_continues_the_curve(
    cluster: Cluster, workdir: Path
) -> None:
    run = nbtrain.finetune(on_slurm(600, save_steps=1000), name="resumed")
    until(lambda: run.status().step >= 3, 120, "training")
    run.checkpoint()  # checkpoint-now, in the job: a checkpoint appears and the run goes on
    saved = until(lambda: latest_complete_checkpoint(run.paths), 60, "the checkpoint asked for")
    assert run.status().state == "running" and int(saved.name.split("-")[1]) < 1000
    first_job = job_of(run)
    st = run.stop(timeout=60)
    assert st.state == "stopped" and latest_complete_checkpoint(run.paths) is not None
    stopped_at = st.step
    resumed = nbtrain.resume(run)
    assert job_of(resumed) != first_job
    assert resumed.wait(timeout=240).state == "completed"
    steps = resumed.metrics()["step"].tolist()
    assert steps == sorted(steps) and len(steps) == len(set(steps)) and steps[-1] == 600
    assert min(s for s in steps if s > stopped_at) <= stopped_at + 5  # from the checkpoint, not step 0


def test_a_course_preset_sends_student_runs_to_the_cluster_and_caps_their_runs_at_once(
    cluster: Cluster, workdir: Path
) -> None:
    (workdir / "nbtrain.lab.yaml").write_text(
        "course: Fine-tuning 101\nslurm: {partition: debug, time: '00:05:00'}\nmax_runs_at_once: 1\n"
    )
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--time=5", "--wrap", "sleep 300").stdout.strip()
    try:
        first = nbtrain.finetune(lora_yaml(10), name="student")  # the config says nothing of SLURM
        st = until(lambda: (s := first.status()).slurm and s.slurm.get("position") and s, 30, "a queue place")
        assert st.state == "queued" and re.search(r"position \d+ in the queue", st.phase_text() or "")
        with pytest.raises(nbtrain.NbtrainError, match=r"allows 1 run\(s\) on the cluster at once .*student"):
            nbtrain.finetune(lora_yaml(10), name="second")
        first.stop(timeout=30)
        second = nbtrain.finetune(lora_yaml(10), name="second")
        assert job_of(second) != job_of(first)
        second.stop(timeout=30)
    finally:
        cluster.run("scancel", blocker, check=False)


INSIDE = """
import json, sys
import nbtrain
run = nbtrain.finetune(sys.argv[1], name="allocated")
st = run.wait(timeout=300)
print(json.dumps({"state": st.state, "status": json.loads(run.paths.status.read_text()),
                  "launch": run.paths.launch.exists(), "loss": run.metrics()["loss"].dropna().tolist()}))
"""


def test_inside_an_allocation_the_run_starts_with_srun_on_its_nodes_instead_of_a_new_job(
    cluster: Cluster, workdir: Path
) -> None:
    # As a notebook started by salloc (or batchspawner) is: SLURM_JOB_ID and the allocation's nodes set.
    (workdir / "inside.py").write_text(INSIDE)
    salloc = shutil.which("salloc") or "salloc"
    out = subprocess.run(
        [salloc, "-N2", sys.executable, "inside.py", on_slurm(20, nodes=2)],
        # this test's NBTRAIN_HOME and runs folder (cluster.env is the session's, from before they were set)
        cwd=workdir, env={**os.environ, "SLURM_CONF": str(cluster.conf)}, capture_output=True, text=True,
        timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["state"] == "completed" and got["launch"]  # started here, as a local launcher
    assert "slurm_allocation" in got["status"] and "slurm_job" not in got["status"]
    assert got["loss"][-1] < got["loss"][0]
    assert "inside SLURM allocation" in out.stdout
    allocation = got["status"]["slurm_allocation"]
    assert slurm.query(allocation, fresh=True).state == "COMPLETED"  # type: ignore[union-attr]
    # no job of its own was queued (the time-limit test's runs go on meanwhile, in partition long)
    assert cluster.jobs("debug") == []


def ends_within_30_s_of_its_job(run: nbtrain.Run, timeout: float) -> nbtrain.RunStatus:
    """The run's final state, read within 30 s of SLURM saying its job ended (the must-hold)."""
    until(lambda: slurm.query(job_of(run), fresh=True).ended, timeout, "the job ending")  # type: ignore[union-attr]
    t = time.monotonic()
    st = until(lambda: (s := run.status()).done and s, 30, "the run's final state")
    assert time.monotonic() - t < 30
    return st  # type: ignore[no-any-return]


def test_a_run_that_hits_its_time_limit_three_times_completes_with_requeue_auto(
    cluster: Cluster, slurm_time_limits: dict[str, nbtrain.Run]
) -> None:
    run, timed_out = slurm_time_limits["run"], slurm_time_limits["timed_out"]
    assert "watch" not in (timed_out.dir / "slurm.sbatch").read_text()
    st = ends_within_30_s_of_its_job(timed_out, 150)
    assert st.state == "stopped" and slurm.query(job_of(timed_out), fresh=True).state == "TIMEOUT"  # type: ignore[union-attr]
    status = json.loads(timed_out.paths.status.read_text())
    assert status["stop_reason"] == "slurm-timeout" and "TIMEOUT" in status["note"]
    st = run.wait(timeout=900)
    assert st.state == "completed", run.failure_report(st)
    job = slurm.query(job_of(run), fresh=True)
    assert job is not None and job.restarts >= 3, job
    steps = run.metrics()["step"].tolist()
    assert steps == list(range(1, 561)), [s for s in steps if steps.count(s) > 1][:5]  # none trained twice
    log = (run.dir / "logs" / f"slurm-{job_of(run)}.log").read_text()
    assert log.count("the run stops at a checkpoint") >= 3 and log.count("resuming") >= 3


def test_preemption_requeues_a_requeue_auto_run_which_goes_on_and_ends_a_requeue_never_run(
    cluster: Cluster, workdir: Path
) -> None:
    # The test cluster's partition "urgent" preempts "debug" (PreemptMode=REQUEUE): a job that may not be
    # requeued is ended PREEMPTED instead.
    text, ns = slowed(on_slurm(120, save_steps=5))
    goes_on = nbtrain.finetune(text, name="preempted-goes-on", namespace=ns)
    ends = nbtrain.finetune(on_slurm(100000, slurm_extra=", requeue: never"), name="preempted-ends")
    until(lambda: goes_on.status().step >= 6 and ends.status().step >= 1, 120, "both training")
    urgent = cluster.run("sbatch", "--parsable", "-p", "urgent", "-N2", "--wrap", "sleep 2").stdout.strip()
    st = ends_within_30_s_of_its_job(ends, 60)
    assert st.state == "stopped" and slurm.query(job_of(ends), fresh=True).state == "PREEMPTED"  # type: ignore[union-attr]
    assert json.loads(ends.paths.status.read_text())["stop_reason"] == "slurm-preempted"
    # until its job starts again (the urgent job's 2 s, then SLURM's wait before a requeued job starts)
    queued = until(lambda: (s := goes_on.status()).state == "queued" and s, 30, "the requeued run queued")
    # pending again, or already restarted and resuming: either way an earlier start's state is not shown
    words = queued.phase_text() or ""
    job = job_of(goes_on)
    assert words.startswith(
        (f"SLURM requeued job {job} (restart 1)", f"SLURM job {job} started again (restart 1)")
    )
    # the urgent job runs once both preempted jobs have let go of their nodes (a checkpoint may take a while)
    until(
        lambda: slurm.query(urgent, fresh=True).state in ("RUNNING", "COMPLETED", "COMPLETING"),  # type: ignore[union-attr]
        60,
        "the urgent job running",
    )
    st = goes_on.wait(timeout=300)
    assert st.state == "completed", goes_on.failure_report(st)
    assert slurm.query(job_of(goes_on), fresh=True).restarts >= 1  # type: ignore[union-attr]
    steps = goes_on.metrics()["step"].tolist()
    assert steps == sorted(steps) and len(steps) == len(set(steps)) and steps[-1] == 120
    assert "resuming" in (goes_on.dir / "logs" / f"slurm-{job_of(goes_on)}.log").read_text()


def test_a_node_failing_under_a_running_job_reads_failed_naming_the_node(
    cluster: Cluster, workdir: Path
) -> None:
    run = nbtrain.finetune(on_slurm(100000, slurm_extra=", requeue: never"), name="node-fail")
    until(lambda: run.status().step >= 1, 120, "training")
    node = slurm.query(job_of(run), fresh=True).nodes  # type: ignore[union-attr]
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=nbtrain-test")
    try:
        st = ends_within_30_s_of_its_job(run, 60)
    finally:
        # (ReturnToService=2 may have taken it back already when slurmd registered again)
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    assert st.state == "failed"
    err = st.error or {}
    assert (
        "NODE_FAIL" in err["message"]
        and "a node of the job failed" in err["message"]
        and node in err["message"]
    )
    until(lambda: node in cluster.run("sinfo", "-h", "-t", "idle", "-N", "-o", "%N").stdout.split(), 60,
          "the node back")  # fmt: skip


def test_a_job_killed_for_its_memory_reads_failed_out_of_memory_with_the_fix(
    cluster: Cluster, workdir: Path
) -> None:
    # No cgroups here: SLURM's accounting kills the step over its --mem, and the job ends FAILED; only its
    # log says why, and the run says it.
    run = nbtrain.finetune(on_slurm(10, slurm_extra=", mem: 300M, requeue: never"), name="oom")
    st = ends_within_30_s_of_its_job(run, 120)
    assert st.state == "failed"
    err = st.error or {}
    assert err["type"] == "OutOfMemory" and "exceeded memory limit" in err["message"]
    assert "ran out of memory" in err["message"] and "raise slurm: mem" in err["message"]


def test_the_cluster_leaves_no_daemon_job_or_folder_behind() -> None:
    why = missing()
    if why is not None:
        if os.environ.get("NBTRAIN_REQUIRE_SLURM"):
            pytest.fail(why)
        pytest.skip(why)
    c = Cluster().start()
    pids = [p.pid for p in c.procs]
    job = c.run("sbatch", "--parsable", "--wrap", "sleep 600").stdout.strip()
    until(lambda: job in c.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split(), 30, "the job running")
    c.stop()
    assert not c.root.exists()
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert alive == []
    left = subprocess.run(["pgrep", "-f", str(c.root)], capture_output=True, text=True).stdout.split()
    assert left == [], left


def test_a_cluster_that_does_not_answer_is_said_and_not_asked_again_on_every_status_read(
    cluster: Cluster, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real scontrol, logged, against a configuration that names no reachable slurmctld (and no sbatch
    # on PATH: the run's script is written, not submitted); the partition's nodes, which the run is
    # planned for, are read from the test cluster.
    real = shutil.which("scontrol")
    bin_ = workdir / "bin"
    bin_.mkdir()
    calls = workdir / "calls"
    (bin_ / "scontrol").write_text(
        f'#!/bin/sh\ncase "$*" in *"show partition"*|*"show node"*)\n'
        f'  SLURM_CONF={cluster.conf} exec {real} "$@";;\nesac\necho x >> {calls}\nexec {real} "$@"\n'
    )
    (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))
    monkeypatch.setenv("SLURM_CONF", str(workdir / "no-such-slurm.conf"))
    run = nbtrain.finetune(lora_yaml(5) + "distributed:\n  slurm: {}\n", name="offline")  # no sbatch: written
    status = json.loads(run.paths.status.read_text())
    run.paths.status.write_text(json.dumps({**status, "slurm_job": "4242"}))
    first, second = run.status(), run.status()
    assert first.state == second.state == "queued"
    assert "unavailable" in (first.slurm or {}) and "unavailable" in (second.slurm or {})
    assert calls.read_text().count("x") == 1  # the second read did not ask again
