"""Run a training function written in the notebook, through accelerate's ``notebook_launcher``.

    run = nbtrain.launch_function(train, num_processes=2)   # returns at once; training goes on

notebook_launcher forks the kernel, so nothing may have initialised a device in it. Before forking
this module checks for what breaks that (CUDA initialised, bitsandbytes imported, an Accelerator
made) and refuses with the cause and the fix, or, with ``fallback="detached"``, pickles the function
with cloudpickle and runs it in a detached process instead, saying which happened.

The launcher runs in a background thread so the cell returns at once. The forked ranks write the
same run directory as any run (logs per rank, metrics through ``nbtrain.log``), ask the kernel's death
to take them along (PR_SET_PDEATHSIG), and are stopped by pid, never by process group: they share
the kernel's group.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.pickles import write_private
from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_jsonl, tail_text, write_status
from nbtrain.control.config.schema import NAME_RE
from nbtrain.control.launch import process
from nbtrain.control.plan.distributed import free_port
from nbtrain.control.runs.run import Run, create_run_dir


def contamination() -> list[str]:
    """What in this kernel would break a forked launch, each with its fix (empty when safe)."""
    problems = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)():
        problems.append(
            "CUDA is already initialised in this kernel (a cell used torch.cuda or put a tensor on the GPU), "
            "and forked processes cannot use it. Fix: restart the kernel and keep every CUDA call inside the "
            "training function"
        )
    for lib in ("bitsandbytes",):
        if lib in sys.modules:
            problems.append(
                f"{lib} is imported in this kernel (importing peft, trl or transformers' Trainer imports "
                f"it), and it initialises the GPU on import. Fix: restart the kernel and import those only "
                f"inside the training function"
            )
    state = sys.modules.get("accelerate.state")
    if state is not None and (state.AcceleratorState._shared_state or state.PartialState._shared_state):
        problems.append(
            "an Accelerator (or accelerate's PartialState) was already created in this kernel. Fix: restart "
            "the kernel and create the Accelerator inside the training function"
        )
    return problems


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the thread that forked it (the kernel's) goes away.

    SIGKILL, not SIGTERM: with its supervisor gone no rank can finish in step with the others, and a
    rank left waiting in a collective would hang forever.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the kernel's shutdown still signals its process group


def _child(fn: Callable[..., Any], run_dir: str, *args: Any) -> Any:
    """Runs in each forked rank: own log file, pid recorded for stop, then the user's function."""
    from nbtrain.worker import runlog

    _die_with_parent()
    paths = RunPaths(Path(run_dir))
    rank = int(os.environ.get("RANK", "0"))
    fd = os.open(paths.rank_log(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The kernel's stream objects, shell and sockets came along with the fork. Nothing in a rank may use
    # them (a progress bar would draw notebook widgets through the kernel's copied iopub socket): write to
    # this rank's log, and make get_ipython() return None here.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    shell = sys.modules.get("IPython.core.interactiveshell")
    if shell is not None:
        shell.InteractiveShell.clear_instance()
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["NBTRAIN_RUN_DIR"] = run_dir
    from nbtrain.worker.control import LogCap

    LogCap(paths.rank_log(rank)).start()
    paths.rank_pid_file(rank).write_text(str(os.getpid()), encoding="utf-8")
    signal.signal(signal.SIGTERM, lambda s, f: runlog.mark_signalled())
    if rank == 0:
        write_status(paths, "running")
    return fn(*args)


class _NoSignalHandlerWarning(logging.Filter):
    """torch elastic warns that it cannot install signal handlers from a thread. The ranks here die
    with the kernel through PR_SET_PDEATHSIG instead, so the warning only misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to register signal handlers" not in record.getMessage()


def _supervise(run: Run, fn: Callable[..., Any], args: tuple[Any, ...], n: int, port: int) -> None:
    paths = run.paths
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NoSignalHandlerWarning())
    try:
        from accelerate import notebook_launcher

        notebook_launcher(_child, (fn, str(paths.root), *args), num_processes=n, use_port=str(port))
    except BaseException as e:  # noqa: BLE001 - recorded in status.json: the thread has no cell to fail
        stopped = paths.control_file("stop").exists()
        if stopped:
            write_status(paths, "stopped", note="stopped while the function ran")
        else:
            write_status(paths, "failed", error={
                "type": type(e).__name__, "message": str(e)[:4000],
                "traceback": traceback.format_exc()[-8000:], "log_tail": tail_text(paths.rank_log(0), 30),
            })  # fmt: skip
    else:
        state = "stopped" if paths.control_file("stop").exists() else "completed"
        logged = read_jsonl(paths.metrics)
        last_step = next((int(r["step"]) for r in reversed(logged) if "step" in r), None)
        write_status(paths, state, step=last_step)


def _new_run(name: str, fn: Callable[..., Any], n: int, launcher_kind: str, notes: list[str]) -> Run:
    if not NAME_RE.match(name):
        raise NbtrainError(f"invalid run name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    qual = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    resolved = {
        "kind": "function",
        "config": {"function": qual, "num_processes": n},
        "plan": {"launcher": launcher_kind, "num_processes": n, "nodes": 1, "device": "cpu-or-gpu",
                 "strategy": "ddp" if n > 1 else "none", "reasons": notes},
    }  # fmt: skip
    return create_run_dir(name, f"# training function {qual}, {n} process(es)\n", resolved)


def launch_function(
    fn: Callable[..., Any],
    *args: Any,
    num_processes: int = 1,
    name: str | None = None,
    fallback: str = "refuse",
) -> Run:
    """Start ``fn(*args)`` on ``num_processes`` ranks; returns the run at once.

    ``fallback``: "refuse" (default) raises when the kernel is not safe to fork; "detached" then runs
    the function in a detached process (it must pickle with cloudpickle) and says so.
    """
    if not callable(fn):
        raise NbtrainError(f"launch_function needs a function, got {type(fn).__name__}")
    if fallback not in ("refuse", "detached"):
        raise NbtrainError(f"fallback is 'refuse' or 'detached', not {fallback!r}")
    if num_processes < 1:
        raise NbtrainError("num_processes must be at least 1")
    name = name or getattr(fn, "__name__", "function").strip("<>") or "function"
    problems = contamination()
    if problems and fallback == "refuse":
        raise NbtrainError(
            "notebook_launcher cannot fork this kernel safely:\n- "
            + "\n- ".join(problems)
            + "\nOr pass fallback='detached' to run the function in a detached process instead."
        )
    if problems:
        return _launch_detached(fn, args, num_processes, name, problems)
    run = _new_run(name, fn, num_processes, "notebook", ["notebook_launcher in a background thread"])
    port = free_port()
    atomic_write_json(run.paths.launch, {
        "notebook": True, "kernel_pid": os.getpid(), "host": socket.gethostname(), "port": port,
        "start_time": time.time(), "procs": [],
    })  # fmt: skip
    write_status(run.paths, "starting")
    t = threading.Thread(target=_supervise, args=(run, fn, args, num_processes, port),
                         name=f"nbtrain-launch-{run.id}", daemon=True)  # fmt: skip
    t.start()
    return run


def _launch_detached(
    fn: Callable[..., Any], args: tuple[Any, ...], n: int, name: str, problems: list[str]
) -> Run:
    import cloudpickle

    try:
        payload = cloudpickle.dumps((fn, args))
    except Exception as e:  # noqa: BLE001 - any pickling failure gets the same advice
        raise NbtrainError(
            f"the kernel is not safe to fork ({problems[0]}), and the function cannot be serialised for a "
            f"detached process: {type(e).__name__}: {e}. Restart the kernel instead, or make the function "
            f"self-contained (imports inside it, no open files or locks captured)"
        ) from None
    notes = ["detached process instead of notebook_launcher, because: " + "; ".join(problems)]
    run = _new_run(name, fn, n, "torchrun" if n > 1 else "direct", notes)
    run.dir.chmod(run.dir.stat().st_mode & ~0o002)  # the worker loads a pickle only others cannot write
    write_private(run.dir / "function.pkl", payload)
    target = ["-m", "nbtrain.worker.function", str(run.dir)]
    if n > 1:
        port = free_port()
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", "--nnodes=1",
                "--master-addr=127.0.0.1", f"--master-port={port}", *target]  # fmt: skip
        result = process.spawn(run.paths, [("launcher.log", argv)], process.worker_env([]), port=port)
    else:
        result = process.spawn(run.paths, [(run.paths.rank_log(0).name, [sys.executable, *target])],
                              process.worker_env([]))  # fmt: skip
    if isinstance(result, process.LaunchFailed):
        write_status(run.paths, "failed", error={"type": "launch", "message": result.reason})
        raise NbtrainError(f"run {run.id} could not start: {result.reason}")
    print(f"nbtrain: ran {name} in a detached process, not with notebook_launcher, because: {problems[0]}")
    return run
