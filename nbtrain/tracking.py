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
import difflib
import html
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nbtrain.errors import NbtrainError
from nbtrain.rundir import RunPaths, atomic_write_json, read_json, tail_text

# transformers 5's INTEGRATION_TO_CALLBACK names, each with the modules that make it available there.
INTEGRATIONS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard|tensorboardX",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "comet_ml": ("comet_ml",),
    "neptune": ("neptune",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
    "codecarbon": ("codecarbon",),
    "azure_ml": ("azureml.core.run",),
    "dagshub": ("dagshub", "mlflow"),
    "flyte": ("flytekit",),
    "swanlab": ("swanlab",),
    "trackio": ("trackio",),
}
PIP_NAMES = {"azure_ml": "azureml-core", "flyte": "flytekit", "comet_ml": "comet-ml"}


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken leftover
        return False


def installed_integrations() -> list[str]:
    """The report_to names whose packages are installed here (found, not imported)."""
    return [
        name
        for name, needs in INTEGRATIONS.items()
        if all(any(_module_present(m) for m in need.split("|")) for need in needs)
    ]


def requested(report_to: Any) -> list[str]:
    """report_to as a list of integration names ("all" expands to the installed ones, "none" to none)."""
    if report_to is None:
        return []
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    if items in (["none"], []):
        return []
    if items == ["all"]:
        return installed_integrations()
    return [str(x) for x in items]


def report_to_problem(report_to: Any) -> str | None:
    """Why ``train: report_to`` cannot work here (unknown or not installed integrations), or None."""
    items = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if items in (["none"], ["all"], []):
        return None
    have = installed_integrations()
    have_text = ", ".join(have) if have else "none"
    problems = []
    for item in items:
        name = str(item)
        if name in ("none", "all"):
            problems.append(f"'{name}' stands alone (report_to: {name}), not in a list with others")
        elif name not in INTEGRATIONS:
            close = difflib.get_close_matches(name, list(INTEGRATIONS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(f"unknown integration '{name}'{hint} (known: {', '.join(INTEGRATIONS)})")
        elif name not in have:
            problems.append(f"{name} is not installed (pip install {PIP_NAMES.get(name, name)})")
    if not problems:
        return None
    return "; ".join(problems) + f". Installed here: {have_text}; or use report_to: none"


def tracking_env(run_dir: Path, report_to: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables that keep each requested tracker's files in ``run_dir``; variables already
    in ``environ`` (default: os.environ) are left as the user set them."""
    env = os.environ if environ is None else environ
    names = requested(report_to)
    out: dict[str, str] = {}

    def default(key: str, value: str) -> None:
        if not env.get(key):
            out[key] = value

    if "tensorboard" in names:
        default("TENSORBOARD_LOGGING_DIR", str(tensorboard_dir(run_dir)))
    if "wandb" in names:
        if not env.get("WANDB_API_KEY") and not env.get("WANDB_MODE"):
            out["WANDB_MODE"] = "offline"  # no account needed; `wandb sync` uploads the run later
        default("WANDB_DIR", str(run_dir))
        default("WANDB_PROJECT", "nbtrain")
    if "mlflow" in names or "dagshub" in names:
        default("MLFLOW_TRACKING_URI", (run_dir / "mlruns").as_uri())
        default("MLFLOW_EXPERIMENT_NAME", "nbtrain")
    return out


def tensorboard_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "logs" / "tensorboard"


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


def _info_alive(info: dict[str, Any]) -> bool:
    try:
        p = psutil.Process(int(info["pid"]))
        same = abs(p.create_time() - float(info["create_time"])) < 0.01
        return bool(same and p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tensorboard(run_dir: str | Path, *, timeout: float = 60.0) -> TensorBoardLaunched:
    """Start TensorBoard on the run's event files (or find the one this run started before)."""
    paths = RunPaths(Path(run_dir))
    logdir = tensorboard_dir(paths.root)
    info_path = paths.root / _INFO
    with contextlib.suppress(FileNotFoundError, ValueError):
        info = read_json(info_path)
        if _info_alive(info):
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
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=paths.root,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if proc.poll() is not None:
            raise NbtrainError(f"TensorBoard exited at start (code {proc.returncode}):\n{tail_text(log, 20)}")
        if time.monotonic() > deadline:
            _stop_group(proc.pid)
            raise NbtrainError(f"TensorBoard did not listen on {url} within {timeout:.0f} s; see {log}")
        time.sleep(0.2)
    create_time = psutil.Process(proc.pid).create_time()
    atomic_write_json(info_path, {"pid": proc.pid, "create_time": create_time, "port": port, "url": url,
                                  "argv": argv, "started": time.time()})  # fmt: skip
    return TensorBoardLaunched(url, proc.pid, str(logdir))


def _stop_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)


def stop_tensorboard(run_dir: str | Path, timeout: float = 10.0) -> bool:
    """Stop the TensorBoard this run started (its own process group only); False if none runs."""
    info_path = Path(run_dir) / _INFO
    try:
        info = read_json(info_path)
    except (FileNotFoundError, ValueError):
        return False
    info_path.unlink(missing_ok=True)
    if not _info_alive(info):
        return False
    pid = int(info["pid"])
    _stop_group(pid)
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    except psutil.Error:
        pass
    return True
