"""Entry point of a training process: ``python -m nbtrain.worker RUN_DIR``.

Started by the kernel (or the CLI) in its own session; reads everything from the run directory and
writes everything back to it. It never imports UI code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from nbtrain.contract.rundir import (
    RunPaths,
    holds_inherited_lock,
    lock_run,
    lock_trainer,
    read_json,
    write_status,
)
from nbtrain.contract.tracking import requested, tracking_env
from nbtrain.worker import writer
from nbtrain.worker.control import LogCap, MemoryGuard, StopControl
from nbtrain.worker.download import download_hub_files
from nbtrain.worker.failure import failure_message
from nbtrain.worker.gguf import use_converted
from nbtrain.worker.lean import hidden_import_hint, hide_unused_packages


def recipe_for(resolved: dict[str, Any]) -> Any:
    """The recipe class of the run's ``objective:`` (runs from before objectives existed are SFT)."""
    objective = resolved["config"].get("objective", "sft")
    if objective == "sft":
        from nbtrain.worker.recipes.sft import SFTRecipe

        return SFTRecipe
    if objective in ("dpo", "orpo", "kto", "reward"):
        from nbtrain.worker.recipes.preference import PreferenceRecipe

        return PreferenceRecipe
    if objective in ("grpo", "rloo"):
        from nbtrain.worker.recipes.grpo import OnlineRLRecipe

        return OnlineRLRecipe
    raise ValueError(f"objective {objective!r} has no recipe in this nbtrain")


def use_trackers(paths: RunPaths, resolved: dict[str, Any]) -> None:
    """Point the trackers of ``train: report_to`` into the run directory (before the Trainer exists),
    and name their run after this one unless ``train: run_name`` does."""
    args = resolved.get("train_args") or {}
    if not requested(args.get("report_to")):
        return
    os.environ.update(tracking_env(paths.root, args["report_to"]))
    args.setdefault("run_name", str(resolved.get("id") or paths.root.name))


_LOCK: list[int] = []  # the run's lock, when this process took it itself: held until it exits


def hold_run_lock(paths: RunPaths) -> bool:
    """One writer per run directory. Started by nbtrain, this process (or the launcher above it, for the
    ranks of a multi-process run) was handed the lock; started by hand, it takes the lock itself. Either
    way the process that trains (rank 0) then takes the trainer's lock itself, with a file of its own: a
    handed lock is shared by whoever got the descriptor (a worker started cold beside one the warm process
    forked late, or anyone who opens the lock file and names it), the trainer's lock by one process."""
    rank = "LOCAL_RANK" in os.environ or "RANK" in os.environ  # (a rank: the launcher holds the lock)
    if not holds_inherited_lock(paths) and not rank:
        fd = lock_run(paths)
        if fd is None:
            return False
        _LOCK.append(fd)
    if os.environ.get("RANK", "0") != "0":
        return True  # the other ranks write no run files of their own
    trainer = lock_trainer(paths)
    if trainer is None:
        return False
    _LOCK.append(trainer)
    return True


def main(argv: list[str] | None = None, *, passes: Callable[[BaseException], bool] | None = None) -> int:
    """``passes``: a failure to raise as it is, without writing the run's failed state (Ray Train's workers:
    a rank whose peer was lost fails in a collective, and Ray restarts the workers)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nbtrain.worker RUN_DIR", file=sys.stderr)
        return 2
    paths = RunPaths(Path(argv[0]).resolve())
    stop = StopControl(paths)
    rank = int(os.environ.get("RANK", "0"))
    if not hold_run_lock(paths):
        print(f"nbtrain worker: {paths.root} is being trained by another process (its lock is held); "
              "not starting a second writer", file=sys.stderr, flush=True)  # fmt: skip
        return 3
    if "LOCAL_RANK" in os.environ or "RANK" in os.environ:
        # Under a launcher each rank writes its own log (the launcher's output goes to launcher.log).
        paths.logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(paths.rank_log(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    # Installed before the heavy imports, so a stop during start-up is not lost.
    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        stop.request(signal.Signals(signum).name)

    LogCap(paths.rank_log(rank)).start()
    if threading.current_thread() is threading.main_thread():  # a Ray Train worker runs this in a thread:
        signal.signal(signal.SIGTERM, on_signal)  # Ray stops it, and nbtrain through control/stop
        signal.signal(signal.SIGINT, on_signal)
    if rank == 0:
        write_status(paths, "starting", pid=os.getpid())
    MemoryGuard(paths, rank).start()  # after "starting": a failure it writes is the last word
    hidden: list[str] = []
    try:
        resolved = read_json(paths.resolved)
        hidden = hide_unused_packages(resolved)  # before any library import
        if hidden:
            print(f"nbtrain: not loaded (this run does not use them): {', '.join(hidden)}", flush=True)
        use_trackers(paths, resolved)
        download_hub_files(paths, resolved, report=rank == 0)  # Hub model and data files, bytes in status
        use_converted(resolved, paths if rank == 0 else None)  # a GGUF model: its converted folder
        if isinstance(resolved.get("threads"), int) and resolved["threads"] > 0:
            import torch  # a sweep's trial: the cores shared out among the trials that run at once

            torch.set_num_threads(resolved["threads"])
        recipe = recipe_for(resolved)(paths, resolved, stop)
        recipe.setup()
        outcome = recipe.train()
        recipe.cleanup()
    except BaseException as e:
        if passes is not None and passes(e):
            raise
        tb = traceback.format_exc()
        hint = hidden_import_hint(e, hidden)
        if hint:
            tb += hint + "\n"
        message, file = failure_message(e)  # the cause and the file it happened on, where they can be told
        print(tb, file=sys.stderr, flush=True)
        error = {
            "type": type(e).__name__,
            "message": (f"{message}. {hint}" if hint else message)[:4000],
            "traceback": tb[-8000:],
            "rank": rank,
        }
        if file is not None:
            error["file"] = file
        writer.drain()  # a queued "running" must not land after "failed"
        write_status(paths, "failed", error=error)
        return 1
    print(f"nbtrain worker: {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
