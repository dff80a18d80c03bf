"""One-off worker jobs the kernel waits for (export, evaluate): same rules as training processes.

The job runs as ``sys.executable -m MODULE ...`` in its own session, output to a log file (never a pipe),
and hands its result back through a JSON file. Interrupting the cell (or a timeout) stops exactly the
job's process group, so nothing keeps running behind the user's back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nbtrain.errors import NbtrainError
from nbtrain.launch import worker_env
from nbtrain.rundir import read_json, tail_text


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_job(
    module: str,
    args: list[str],
    *,
    log: Path,
    result: Path,
    cwd: Path,
    what: str,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Run ``python -m module *args`` to the end; returns (exit code, the JSON it wrote to ``result``).

    Raises NbtrainError with the log's tail when the job died without writing its result.
    """
    argv = [sys.executable, "-m", module, *args]
    log.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    # No GPU is hidden from the job (unlike a training worker's plan): it uses what the machine has.
    job_env = {**os.environ, **{k: v for k, v in worker_env([]).items() if k != "CUDA_VISIBLE_DEVICES"}}
    job_env.update(env or {})
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=cwd, env=job_env,
        )  # fmt: skip
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        raise NbtrainError(f"{what} did not finish in {timeout:.0f} s and was stopped; see {log}") from None
    except BaseException:  # KeyboardInterrupt from the notebook's stop button: take the job down too
        _stop_group(proc)
        raise
    try:
        data: dict[str, Any] = read_json(result)
    except (FileNotFoundError, ValueError):
        raise NbtrainError(
            f"{what} failed (exit code {code}) without a result; last lines of {log}:\n{tail_text(log, 30)}"
        ) from None
    return code, data
