"""Inside a SLURM job that trains a run: what its sbatch script asks, beside and after the training
(``python -m nbtrain.control.slurmjob VERB RUN_DIR ...``; the script is written by
nbtrain.control.plan.distributed). The kernel's side of a SLURM run is nbtrain.control.launch.slurm."""

from __future__ import annotations

import time
from pathlib import Path

from nbtrain.contract.rundir import ACTIVE_STATES, RunPaths, read_json, write_status
from nbtrain.control.launch.slurm import SlurmUnavailable, query, seconds_left


def watch(paths: RunPaths, job_id: str, before: float) -> int:
    """Inside the job, beside the training: ``before`` seconds before SLURM's end of the job, ask the run
    to stop at a checkpoint (stop_reason ``slurm-time-limit``). SLURM's own warning signal is not used:
    slurmctld sends it again at once to a requeued job (22.05), which would stop every restart as it
    starts. The end is read again every 30 s (``scontrol update TimeLimit`` moves it)."""
    from nbtrain.contract.rundir import TERMINAL_STATES, request_control

    while True:
        try:
            job = query(job_id, fresh=True)
        except SlurmUnavailable:
            job = None
        left = seconds_left(job) if job is not None else None
        if left is not None and left <= before:
            request_control(paths, "stop", by="slurm-time-limit")
            print(
                f"nbtrain: SLURM job {job_id} ends in {left:.0f} s: the run stops at a checkpoint", flush=True
            )
            return 0
        try:
            if read_json(paths.status).get("state") in TERMINAL_STATES:
                return 0
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(30.0 if left is None else min(30.0, max(1.0, left - before)))


def should_requeue(paths: RunPaths, restarts: int, most: int) -> bool:
    """After the training step of a job: did the run stop for the time limit, with requeues left?"""
    try:
        raw = read_json(paths.status)
    except (FileNotFoundError, ValueError):
        return False
    limited = raw.get("state") == "stopped" and raw.get("stop_reason") == "slurm-time-limit"
    if limited and restarts >= most:
        print(f"nbtrain: the run hit its time limit and was requeued {restarts} times already "
              f"(max_requeues: {most}): resume it to go on", flush=True)  # fmt: skip
    return limited and restarts < most


def _in_job(argv: list[str]) -> int:
    """What the sbatch script asks (``python -m nbtrain.control.slurmjob VERB RUN_DIR ...``):

    watch RUN SECONDS: stop the run at a checkpoint SECONDS before the job's time limit.
    should-requeue RUN RESTARTS MOST: exit 0 if the run stopped for the time limit and may go on.
    resume-in-job RUN: a requeued job starts again: resume the run from its last complete checkpoint
    (exit 0: train; 10: the run already completed, nothing to do)."""
    import os

    verb, run_dir, *rest = argv
    paths = RunPaths(Path(run_dir))
    job = os.environ.get("SLURM_JOB_ID", "")
    if verb == "watch":
        return watch(paths, job, float(rest[0]))
    if verb == "should-requeue":
        return 0 if should_requeue(paths, int(rest[0]), int(rest[1])) else 1
    if verb != "resume-in-job":
        raise SystemExit(f"unknown verb {verb!r}")
    from nbtrain.control.runs.run import Run
    from nbtrain.control.start import prepare_resume, writer_lock

    run = Run(paths.root)
    raw = read_json(paths.status)
    if raw.get("state") == "completed":
        print("nbtrain: the run has completed; nothing to resume", flush=True)
        return 10
    if raw.get("state") in ACTIVE_STATES:  # this job's previous start died with it (requeued by SLURM)
        write_status(paths, "stopped", note=f"SLURM requeued job {job}", stop_reason="slurm-requeued")
    elif raw.get("state") not in ("stopped", "failed"):
        raise SystemExit(f"nbtrain: run {paths.root} is {raw.get('state')}: not resumed")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    with writer_lock(run):
        prepare_resume(run, job=job, restarts=restarts)
    print(f"nbtrain: SLURM job {job} restart {restarts}: resuming", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_in_job(sys.argv[1:]))
