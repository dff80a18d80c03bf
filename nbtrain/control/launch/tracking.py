"""Experiment trackers (``train: report_to: [tensorboard, wandb, mlflow]``) and TensorBoard from a notebook.

``report_to`` goes to the Trainer as written; nbtrain only makes each tracker keep its files in the run
directory, so a run is complete on its own and nothing needs a network or an account:

- tensorboard: event files in ``<run>/logs/tensorboard`` (TENSORBOARD_LOGGING_DIR);
- wandb: ``WANDB_MODE=offline`` when no API key is set (``wandb sync <run>/wandb/offline-run-*``
  uploads later), its files in ``<run>/wandb``;
- mlflow: a file store in ``<run>/mlruns`` unless MLFLOW_TRACKING_URI names a server.

Anything the user sets in the environment wins. The kernel side checks names against what is installed
(importlib.util.find_spec: nothing is imported); the worker calls ``tracking_env`` before the Trainer
exists. ``tensorboard()`` starts TensorBoard on a run's event files in its own session and returns a
typed result (Launched / Reused / Failed / TimedOut), after TensorBoard's own notebook launcher.
"""

from __future__ import annotations

import contextlib
import html
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_json, tail_text

# The report_to names and the environment that points trackers into the run directory are shared with
# the training process, which must not import this layer: they live in the contract.
from nbtrain.contract.tracking import (  # noqa: F401 - re-exported for the config check and its tests
    _module_present,
    installed_integrations,
    report_to_problem,
    tensorboard_dir,
    tracking_env,
)
from nbtrain.control.launch import process

# ------------------------------------------------------------------------------------- TensorBoard


@dataclass(frozen=True)
class TensorBoardLaunched:
    url: str
    pid: int
    logdir: str
    reused: bool = False

    def _repr_html_(self) -> str:
        how = "already running" if self.reused else "started"
        u = html.escape(self.url)
        return (
            f"TensorBoard {how} on <code>{html.escape(self.logdir)}</code>: "
            f'<a href="{u}" target="_blank">{u}</a> (pid {self.pid})'
        )

    def __repr__(self) -> str:
        return f"TensorBoard {'already running' if self.reused else 'started'} at {self.url} (pid {self.pid})"


_INFO = "tensorboard.json"  # in the run directory: pid, create_time, port of the TensorBoard it started


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _trusted_info(paths: RunPaths) -> Path:
    """The run's tensorboard.json, once it and the run directory are this user's (``RunPaths.not_yours``):
    the process group it names is what a stop signals, its URL what a reuse returns."""
    info_path = paths.root / _INFO
    if why := paths.not_yours(info_path):
        raise NbtrainError(f"not using the TensorBoard of run {paths.root.name}: {why}")
    return info_path


def tensorboard(run_dir: str | Path, *, timeout: float = 60.0) -> TensorBoardLaunched:
    """Start TensorBoard on the run's event files (or find the one this run started before)."""
    paths = RunPaths(Path(run_dir))
    logdir = tensorboard_dir(paths.root)
    info_path = _trusted_info(paths)
    with contextlib.suppress(FileNotFoundError, ValueError):
        info = read_json(info_path)
        if process.leader_alive(info):
            return TensorBoardLaunched(info["url"], int(info["pid"]), str(logdir), reused=True)
    if not _module_present("tensorboard"):
        raise NbtrainError("TensorBoard is not installed in this environment: pip install tensorboard")
    if not logdir.is_dir():
        raise NbtrainError(
            f"run {paths.root.name} has no TensorBoard logs ({logdir} does not exist): train with "
            f"train: {{report_to: [tensorboard]}} to write them"
        )
    port = _free_port()
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    log = paths.logs / "tensorboard.log"
    proc = process.start_process(argv, log=log, cwd=paths.root)
    if isinstance(proc, process.LaunchFailed):
        raise NbtrainError(f"TensorBoard could not start: {proc.reason}")
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while not _listening(port):
        code = proc.exit_code()
        if code is not None:
            raise NbtrainError(f"TensorBoard exited at start (code {code}):\n{tail_text(log, 20)}")
        if time.monotonic() > deadline:
            proc.stop(grace=5)
            raise NbtrainError(f"TensorBoard did not listen on {url} within {timeout:.0f} s; see {log}")
        time.sleep(0.2)
    atomic_write_json(info_path, {**proc.record, "port": port, "url": url, "argv": argv,
                                  "started": time.time()})  # fmt: skip
    return TensorBoardLaunched(url, proc.pid, str(logdir))


def stop_tensorboard(run_dir: str | Path, timeout: float = 10.0) -> bool:
    """Stop the TensorBoard this run started (its own process group only); False if none runs."""
    info_path = _trusted_info(RunPaths(Path(run_dir)))
    try:
        info = read_json(info_path)
    except (FileNotFoundError, ValueError):
        return False
    info_path.unlink(missing_ok=True)
    if not process.leader_alive(info):
        return False
    process.terminate_group(info, grace=timeout)
    return True
