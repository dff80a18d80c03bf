"""Ray runs on a real Ray cluster (tests/raycluster.py: a head and two worker nodes on this machine, on
loopback): the run's state is its Ray job's, its workers train through Ray Train, stop and resume work as
they do locally, and a lost worker node is survived."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.control.launch import rayjobs
from tests.conftest import lora_yaml, sweep_yaml
from tests.raycluster import RayCluster, missing
from tests.slurmcluster import slowed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head and two worker nodes of one CPU each, on loopback, for this module only: an idle Ray cluster
    (GCS, raylets, dashboard and agents) costs CPU the rest of the suite would share."""
    why = missing()
    if why is not None:
        pytest.skip(why)
    c = RayCluster().start()
    try:
        yield c
    finally:
        c.stop()


def on_ray(address: str, max_steps: int, *, workers: int = 2, extra: str = "", save_steps: int = 5) -> str:
    return lora_yaml(max_steps, extra=f"  save_steps: {save_steps}\n") + (
        f"distributed:\n  strategy: ddp\n  ray: {{address: '{address}', num_workers: {workers}{extra}}}\n"
    )


def job_of(run: nbtrain.Run) -> str:
    return str(json.loads(run.paths.status.read_text())["ray_job"])


def job_ends(cluster: RayCluster, run: nbtrain.Run, timeout: float = 30) -> rayjobs.RayJob:
    deadline = time.monotonic() + timeout
    while not (job := rayjobs.query(cluster.address, job_of(run), fresh=True)) or not job.ended:
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    return job


def test_a_two_worker_run_goes_through_rays_states_survives_a_lost_node_and_completes(
    ray_cluster: RayCluster, workdir: Path
) -> None:
    """pending -> running -> completed with falling loss, its metrics in the run directory; a worker node
    killed mid-run (its raylet and processes at once) is survived: Ray Train restarts the workers, which go
    on from the last complete checkpoint with no step trained twice."""
    from ray.util.state import list_actors

    try:
        # 0.2 s steps (a notebook callback): an idle machine trains 40 tiny steps between two polls otherwise
        text, ns = slowed(on_ray(ray_cluster.address, 40, save_steps=4))
        run = nbtrain.finetune(text, name="ray-ddp", namespace=ns)
        assert any("Ray cluster at" in r and "2 worker(s)" in r for r in run.resolved["plan"]["reasons"])
        seen: list[str] = []
        killed = False
        deadline = time.monotonic() + 400
        while not (st := run.status()).done:
            assert time.monotonic() < deadline, seen
            if not seen or seen[-1] != st.state:
                seen.append(st.state)
            if st.step >= 10 and not killed:
                alive = [("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")]
                on = {a.node_id for a in list_actors(address=ray_cluster.address, filters=alive)}
                ray_cluster.kill_worker(
                    next(n for n in ray_cluster.nodes if n.node_id in on)
                )  # never the head
                killed = True
            time.sleep(0.3)
        seen.append(st.state)
        assert st.state == "completed", run.failure_report(st)
        assert killed and seen[0] == "queued" and "running" in seen, seen
        assert job_ends(ray_cluster, run).status == "SUCCEEDED"  # its driver exits once the run completed
        steps = run.metrics()["step"].tolist()
        assert steps == list(range(1, 41)), steps  # continuous, none trained twice after the restart
        assert run.resolved["resume"]["attempt"] == 2  # Ray restarted the workers once, from a checkpoint
        loss = run.metrics()["loss"].dropna()
        assert loss.tail(3).mean() < loss.head(3).mean()
        assert (run.dir / "logs" / "rank0.log").exists() and (run.dir / "logs" / "rank1.log").exists()
    finally:
        ray_cluster.restore()  # the next tests get their cluster back


def test_with_its_failures_used_up_a_lost_node_fails_the_run_naming_the_node(
    ray_cluster: RayCluster, workdir: Path
) -> None:
    from ray.util.state import list_actors

    try:
        text, ns = slowed(on_ray(ray_cluster.address, 40, extra=", max_failures: 0"))
        run = nbtrain.finetune(text, name="ray-no-retries", namespace=ns)
        deadline = time.monotonic() + 300
        killed = None
        while not (st := run.status()).done:
            assert time.monotonic() < deadline, st
            if st.step >= 3 and killed is None:
                alive = [("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")]
                on = {a.node_id for a in list_actors(address=ray_cluster.address, filters=alive)}
                killed = next(n for n in ray_cluster.nodes if n.node_id in on)
                ray_cluster.kill_worker(killed)
            time.sleep(0.3)
        assert killed is not None and st.state == "failed", st
        assert st.error is not None, st
        message = st.error["message"]
        assert "max_failures used up" in message, message
        assert f"its worker died on node {killed.node_id} at 127.0.0.1" in message, message
    finally:
        ray_cluster.restore()


# A notebook's callback that fails a trial whose learning rate is too high, once it has trained two steps.
BOOM = """
from transformers import TrainerCallback


class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate > 2e-3 and state.global_step >= 2:
            raise RuntimeError("the loss would explode at this learning rate")
"""


def test_a_sweep_on_ray_runs_each_trial_as_a_ray_job_and_a_failed_one_names_its_node(
    ray_cluster: RayCluster, workdir: Path
) -> None:
    """As many trials at once as the cluster holds, each a Ray job; a trial whose training fails is recorded
    with its error and the Ray node it trained on, and the sweep goes on."""
    from nbtrain.control.sweep.sweep import start_sweep

    ns: dict[str, object] = {"__name__": "__main__"}
    exec(compile(BOOM, "<notebook cell>", "exec"), ns)
    ray = f"distributed:\n  ray: {{address: '{ray_cluster.address}', num_workers: 1}}\n"
    grid = sweep_yaml("[3.0e-3, 1.0e-3]", 6).replace("  at_once: 1\n", "")
    text = ray + grid + "hooks:\n  callbacks: [Boom]\n"
    s = start_sweep(text, namespace=ns)
    assert s.why == (
        f"2 at once: each trial is a Ray job of 1 worker (CPU: 1 each); the cluster at {ray_cluster.address} "
        "has room for 3 such workers"
    )
    most = 0
    deadline = time.monotonic() + 300
    while not (st := s.status()).done:
        most = max(most, sum(t["state"] in ("queued", "running") for t in st.trials))
        assert time.monotonic() < deadline, st.describe()
        time.sleep(0.5)
    assert st.state == "completed" and [t["state"] for t in st.trials] == ["failed", "completed"], (
        st.describe(),
        s.paths.log.read_text()[-2000:],
    )
    reason = st.trials[0]["reason"]
    assert "the loss would explode at this learning rate" in reason, reason
    nodes = {n.id for n in rayjobs.nodes(ray_cluster.address)}
    assert re.search(r"\(rank 0, on Ray node (\w+) at 127\.0\.0\.1\)", reason), reason
    assert re.search(r"on Ray node (\w+)", reason).group(1) in nodes, reason  # type: ignore[union-attr]
    jobs = {json.loads(Path(t["run_dir"], "status.json").read_text())["ray_job"] for t in st.trials}
    assert len(jobs) == 2 and most == 2  # a Ray job each, side by side
    assert "warm process" not in s.paths.log.read_text()  # no trial is forked here: none waited for one


def test_a_job_that_fails_before_training_reads_failed_with_rays_words_within_30_s(
    ray_cluster, workdir: Path
) -> None:
    # the cluster's Python as the config names it, which is not there: the job's driver never starts
    run = nbtrain.finetune(
        on_ray(ray_cluster.address, 10, extra=", python: /no/such/python"), name="no-python"
    )
    job = job_ends(ray_cluster, run, 120)
    t = time.monotonic()
    while not (st := run.status()).done:
        assert time.monotonic() - t < 30, st
        time.sleep(0.5)
    assert st.state == "failed" and job.status == "FAILED"
    assert st.error is not None and "Ray job" in st.error["message"] and "failed" in st.error["message"]
    assert "/no/such/python" in st.error.get("log_tail", "") + st.error["message"]


def test_a_runtime_env_ray_refuses_is_said_at_start_and_leaves_no_run(ray_cluster, workdir: Path) -> None:
    with pytest.raises(nbtrain.NbtrainError, match=r"refused the job.*no/such/folder"):
        nbtrain.finetune(
            on_ray(ray_cluster.address, 10, extra=", runtime_env: {working_dir: /no/such/folder}"),
            name="bad-env",
        )


def test_ray_job_stop_from_outside_reads_stopped_by_ray_and_resume_goes_on(
    ray_cluster, workdir: Path
) -> None:
    from nbtrain.contract.rundir import latest_complete_checkpoint

    run = nbtrain.finetune(
        on_ray(ray_cluster.address, 100000, workers=1, save_steps=100000), name="stopped-outside"
    )
    deadline = time.monotonic() + 300
    while run.status().step < 7:
        assert time.monotonic() < deadline and not run.status().done, run.failure_report(run.status())
        time.sleep(0.5)
    run.checkpoint()  # checkpoint now, as on this machine: the rank reads the request in the run directory
    while (saved := latest_complete_checkpoint(run.paths)) is None:
        assert time.monotonic() < deadline and not run.status().done, run.failure_report(run.status())
        time.sleep(0.2)
    ray_cli = Path(sys.executable).with_name("ray")
    out = subprocess.run([str(ray_cli), "job", "stop", "--address", ray_cluster.address, job_of(run)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    t = time.monotonic()
    while not (st := run.status()).done:
        assert time.monotonic() - t < 30, st
        time.sleep(0.5)
    assert st.state == "stopped" and st.stop_reason == "ray-job-stop", st
    # a new process (a restarted kernel, the sidebar's server) reads the same from the run directory and Ray
    probe = (
        "import json, sys; from nbtrain.ui.server.handlers import run_status; "
        "print(json.dumps(run_status(sys.argv[1])))"
    )
    out = subprocess.run([sys.executable, "-c", probe, run.id], capture_output=True, text=True, timeout=120)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert (seen["state"], seen["step"], seen["resumable"]) == ("stopped", st.step, True), seen
    stopped_at = st.step
    resumed = nbtrain.resume(run)
    while resumed.status().step <= stopped_at + 2:
        assert time.monotonic() - t < 300 and not resumed.status().done, resumed.failure_report(
            resumed.status()
        )
        time.sleep(0.5)
    final = resumed.stop()
    assert final.state == "stopped" and final.stop_reason == "user"
    steps = run.metrics()["step"].tolist()
    assert steps == sorted(steps) and len(steps) == len(set(steps)), steps  # the curve goes on, none twice
    assert resumed.resolved["resume"]["from"] == str(saved)  # it went on from the checkpoint asked for


def test_a_run_waiting_for_the_clusters_resources_says_what_for_and_stops_at_once(
    ray_cluster, workdir: Path
) -> None:
    run = nbtrain.finetune(on_ray(ray_cluster.address, 10, workers=4), name="too-big")
    assert any("room for 3 now: the job waits for the rest" in r for r in run.resolved["plan"]["reasons"])
    deadline = time.monotonic() + 120
    while "waiting for Ray: 4 workers" not in (run.status().phase_text() or ""):
        assert time.monotonic() < deadline, run.status()
        time.sleep(0.5)
    assert run.status().state == "queued"
    assert "CPU 3 free of 3" in (run.status().phase_text() or "")
    t = time.monotonic()
    st = run.stop()
    assert st.state == "stopped" and time.monotonic() - t < 30
    assert job_ends(ray_cluster, run).status == "STOPPED"
