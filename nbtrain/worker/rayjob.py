"""A run's Ray job: ``python -m nbtrain.worker.rayjob RUN_DIR``, the entrypoint nbtrain submits through
Ray's Jobs API (nbtrain.control.launch.rayjobs). It trains the run with Ray Train: a ``TorchTrainer`` of
``num_workers`` workers, each running nbtrain's own worker (``nbtrain.worker.main``) as one rank of a DDP
run over the process group Ray Train sets up. The run directory is the truth, as for every other launch:
rank 0 writes status, metrics and checkpoints there (storage every node reaches).

Ray Train's ``FailureConfig(max_failures)`` restarts the workers when one is lost (its node gone, its
process killed); the restarted rank 0 goes on from the run's last complete checkpoint (``restart_point``),
setting aside what the lost attempt logged after it, so no step is trained twice. A failure of the training
itself (its status says failed) is not retried: the restarted workers see it and end at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from nbtrain.contract.raywork import worker_resources
from nbtrain.contract.rundir import (
    ACTIVE_STATES,
    RunPaths,
    atomic_write_json,
    latest_complete_checkpoint,
    read_json,
    set_aside_metrics,
    write_status,
)

STORAGE = "ray-train"  # Ray Train's own files (not "ray": a folder of that name on the path shadows Ray)


_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "gloo/transport", "NCCL communicator",
              "ProcessGroupNCCL", "Broken pipe")  # fmt: skip


def peer_lost(e: BaseException) -> bool:
    """A rank's failure in a collective because another rank went away (its node lost, its process
    killed): not the run's failure. Raised on to Ray Train, which restarts the workers; the run goes on
    from its checkpoint. torch raises these as DistError (DistBackendError, DistNetworkError) or, from
    gloo's transport, as a RuntimeError naming it."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    return isinstance(e, RuntimeError) and any(words in str(e) for words in _PEER_LOST)


def restart_point(paths: RunPaths) -> str:
    """Rank 0, as the workers start: what this start of the workers does. "train" (the job's first start,
    or a resume nbtrain set up), "resume" (Ray restarted the workers after one was lost: the run goes on
    from its last complete checkpoint, set up here), or "end" (the run already ended: its own failure,
    which a restart would only repeat, or completed or stopped)."""
    raw = read_json(paths.status)
    state = raw.get("state")
    if state == "queued":
        return "train"
    if state in ("completed", "stopped", "failed"):  # a rank that lost its peer writes no failed state
        return "end"
    resolved = read_json(paths.resolved)
    attempt = int(resolved.get("resume", {}).get("attempt", 1)) + 1
    ckpt = latest_complete_checkpoint(paths, repair=True)
    step = int(ckpt.name.split("-")[1]) if ckpt is not None else 0
    set_aside_metrics(paths, step, attempt - 1)
    resume = {"from": str(ckpt), "step": step, "attempt": attempt} if ckpt is not None else None
    atomic_write_json(paths.resolved, {**resolved, "resume": resume} if resume else
                      {k: v for k, v in resolved.items() if k != "resume"})  # fmt: skip
    where = (
        f"its last complete checkpoint (step {step})" if ckpt is not None else "the start (no checkpoint yet)"
    )
    note = f"Ray restarted the workers after a failure (attempt {attempt}): the run goes on from {where}"
    print(f"nbtrain: {note}", flush=True)
    write_status(paths, "queued", step=step, resumed_from=step, attempt=attempt, note=note)
    return "resume"


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: one rank of the run (Ray Train has set RANK, WORLD_SIZE, MASTER_ADDR and the
    process group)."""
    import torch.distributed as dist

    from nbtrain.worker.__main__ import main

    paths = RunPaths(Path(config["run_dir"]))
    rank = int(os.environ.get("RANK", "0"))
    what = [restart_point(paths) if rank == 0 else ""]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(what, src=0)
    if what[0] == "end":
        return
    code = main([str(paths.root)], passes=peer_lost)
    if code == 3:
        raise RuntimeError(f"rank {rank}: {paths.root} is being trained by another process")
    # a failed rank wrote status failed (rank 0) or its log: not retried (restart_point says "end")
    if code != 0 and rank == 0:
        _name_the_node(paths)


def _name_the_node(paths: RunPaths) -> None:
    """The run's failure, as rank 0 wrote it, with the Ray node it trained on (a cluster's run fails on one
    of many machines: its logs and its hardware are there)."""
    import ray

    raw = read_json(paths.status)
    error = raw.get("error")
    if raw.get("state") != "failed" or not isinstance(error, dict) or "node" in error:
        return
    node = f"{ray.get_runtime_context().get_node_id()} at {ray.util.get_node_ip_address()}"
    message = f"{error.get('message', '')} (rank 0, on Ray node {node})"
    write_status(paths, "failed", error={**error, "message": message, "node": node})


def _waiting_words(need: dict[str, float], workers: int) -> str:
    """What the workers are waiting for: the cluster's resources while their placement group is pending
    (Ray reserves all of them at once, or none), else Ray starting them."""
    import ray
    from ray.util import placement_group_table

    pending = [g for g in placement_group_table().values() if g.get("state") == "PENDING"]
    if not pending:
        return f"Ray is starting {workers} worker(s)"
    free, total = ray.available_resources(), ray.cluster_resources()
    each = ", ".join(f"{k} {v:g}" for k, v in need.items())
    have = ", ".join(f"{k} {free.get(k, 0.0):g} free of {total.get(k, 0.0):g}" for k in need)
    return f"waiting for Ray: {workers} workers of {{{each}}}; the cluster has {have}"


def _watch_pending(paths: RunPaths, need: dict[str, float], workers: int, done: threading.Event) -> None:
    """Until rank 0 starts: say in the status what the workers wait for (the cluster's resources)."""
    shown = None
    while not done.wait(2.0):
        try:
            if read_json(paths.status).get("state") != "queued":
                return
            words = _waiting_words(need, workers)
        except Exception:  # noqa: BLE001 - a help to read, never a reason to fail the job
            continue
        if words != shown:
            write_status(paths, "queued", phase=words)
            shown = words


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nbtrain.worker.rayjob RUN_DIR", file=sys.stderr)
        return 2
    paths = RunPaths(Path(argv[0]).resolve())

    def on_stop(signum: int, frame: FrameType | None) -> None:
        # Ray's stop (`ray job stop`, the dashboard): SIGTERM, and a kill seconds later, too soon for a
        # checkpoint. The run reads stopped, said so; resume goes on from its last complete checkpoint.
        del frame
        raw = read_json(paths.status)
        if raw.get("state") in ACTIVE_STATES:
            asked = paths.control_file("stop").exists()
            write_status(paths, "stopped", stop_reason="user" if asked else "ray-job-stop",
                         note=f"the Ray job was stopped ({signal.Signals(signum).name})"
                         + ("" if asked else ": by ray job stop, not by nbtrain"))  # fmt: skip
        os._exit(0)

    signal.signal(signal.SIGTERM, on_stop)
    resolved = read_json(paths.resolved)
    ray_cfg = resolved["config"]["distributed"]["ray"]
    plan = resolved["plan"]
    workers = int(plan["nodes"]) * int(plan["num_processes"])
    need = worker_resources(ray_cfg.get("resources_per_worker"), gpu=plan["device"] == "cuda")

    # Ray Train sends each worker's print() through its logger too: nbtrain's rank logs get every line
    # twice, and the output libraries capture (dill disassembles functions into a captured stdout to hash
    # them) leaks into them. Passed on to the workers by Ray Train (its ENV_VARS_TO_PROPAGATE).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address="auto", log_to_driver=False)  # the job's cluster (RAY_ADDRESS, set by the Jobs API)
    done = threading.Event()
    threading.Thread(target=_watch_pending, args=(paths, need, workers, done), daemon=True).start()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"run_dir": str(paths.root)},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=plan["device"] == "cuda",
            resources_per_worker=need,
        ),
        torch_config=TorchConfig(backend="nccl" if plan["device"] == "cuda" else "gloo"),
        run_config=RunConfig(
            name=str(resolved.get("id") or paths.root.name),
            storage_path=str(paths.root / STORAGE),
            failure_config=FailureConfig(max_failures=int(ray_cfg.get("max_failures", 3))),
        ),
    )
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - Ray Train's TrainingFailedError: the workers' errors, said
        done.set()
        raw = read_json(paths.status)
        if raw.get("state") in ACTIVE_STATES:
            write_status(paths, "failed", error={"type": "ray", "message": _failure_words(e)[:4000]})
        print(f"nbtrain: Ray Train failed: {e}", file=sys.stderr, flush=True)
        return 1
    done.set()
    raw = read_json(paths.status)
    if raw.get("state") in ACTIVE_STATES:  # the workers returned without the run's final state
        write_status(paths, "failed", error={"type": "ray", "message": "Ray Train's workers ended without "
                                             "the run's final state: see logs/rank0.log"})  # fmt: skip
        return 1
    return 0 if raw.get("state") in ("completed", "stopped") else 1


def _failure_words(e: BaseException) -> str:
    """Which workers failed, where and why (Ray Train's WorkerGroupError lists them by rank): a worker
    whose actor died is named with its node, and the node's fate where Ray knows it (a lost node)."""
    failures = getattr(e, "worker_failures", None) or getattr(getattr(e, "__cause__", None),
                                                              "worker_failures", None)  # fmt: skip
    if isinstance(failures, dict) and failures:
        parts = [f"rank {rank}: {_worker_words(err)}" for rank, err in sorted(failures.items())]
        return f"Ray Train's workers failed (FailureConfig's max_failures used up): {'; '.join(parts)}"
    return f"Ray Train failed: {type(e).__name__}: {e}"


def _worker_words(err: BaseException) -> str:
    err = getattr(err, "health_check_failure", None) or err  # Ray Train's health check found the actor dead
    first = str(err).splitlines()[0][:300] if str(err) else ""
    actor = getattr(err, "actor_id", None)
    if not actor:  # an error the training raised: its own words
        lost = "lost its connection to the other ranks: " if peer_lost(err) else ""
        return f"{lost}{type(err).__name__}: {first}"
    try:
        from ray.util.state import get_actor, get_node

        state = get_actor(actor, timeout=10)
        node = get_node(state.node_id, timeout=10) if state is not None and state.node_id else None
    except Exception:  # noqa: BLE001 - the state API is best effort here: the error's own words stand
        node = None
    if node is None:
        return f"its worker died ({type(err).__name__}: {first})"
    where = f"its worker died on node {node.node_id} at {node.node_ip}"
    if node.state != "DEAD":  # Ray has not marked the node yet (it may be the worker's process alone)
        return f"{where} ({type(err).__name__})"
    return f"{where}, which died" + (f" ({node.state_message})" if node.state_message else "")


if __name__ == "__main__":
    raise SystemExit(main())
