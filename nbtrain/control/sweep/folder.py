"""A sweep's folder, the one format every reader and the driver share: ``<runs root>/sweeps/<id>/``.

- ``sweep.json`` (start_sweep): id, name, created, the config as written, the base config each trial
  varies (no ``sweep:``, ``name:`` or ``resume:``), the settings, the budget, ``at_once`` and why, torch
  threads a trial, the working directory and runs root the trials resolve their paths from.
- ``study.sqlite3`` (driver): Optuna's study (RDB storage): trials, parameters, evaluations, values.
- ``trials.json`` (driver): what views read, with no Optuna import: the sweep's state, budget, every trial
  (number, params, state, run, value, reason, evaluations) and the best; replaced atomically.
- ``driver.json`` (start_sweep, resume): the driver's process record, identity-checked before use.
- ``requests/`` (kernel, CLI): ``stop``, ``extend-*.json`` ({"add": N}), ``clone-*.json`` ({"trial": N,
  "set": {KEY: VALUE}}), carried out and removed by the driver.
- ``hooks.pkl``, ``rewards.pkl`` (start_sweep): the notebook's objects the config names, captured once
  for every trial (mode 0600).
- ``driver.log``: what the driver did, a line an event; ``.lock``: one driver per sweep (flock).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.paths import runs_root
from nbtrain.contract.rundir import MAX_JSON_BYTES, atomic_write_json, read_json

SWEEPS = "sweeps"  # under the runs root
# A trial's run stopped with this stop_reason was stopped by its sweep's stop: it goes on when the sweep
# resumes (any other stop ends the trial as stopped).
STOPPED_BY_SWEEP = "sweep stopped"
PRUNED = "pruned"  # the stop_reason of a pruned trial's run, and the trial's state


@dataclass(frozen=True)
class SweepPaths:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "sweep.json"

    @property
    def study(self) -> Path:
        return self.root / "study.sqlite3"

    @property
    def trials(self) -> Path:
        return self.root / "trials.json"

    @property
    def driver(self) -> Path:
        return self.root / "driver.json"

    @property
    def requests(self) -> Path:
        return self.root / "requests"

    @property
    def log(self) -> Path:
        return self.root / "driver.log"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def storage_url(self) -> str:
        return f"sqlite:///{self.study}"

    def read_spec(self) -> dict[str, Any]:
        return _object(self.spec, "the sweep's settings")

    def read_driver(self) -> dict[str, Any]:
        return _object(self.driver, "the sweep driver's process record")

    def read_trials(self) -> dict[str, Any]:
        """trials.json, or the empty picture of a sweep whose driver has not written it yet."""
        if not self.trials.exists():
            return {"state": "running", "trials": [], "best": None}
        return _object(self.trials, "the sweep's trials")

    def request(self, kind: str, body: dict[str, Any] | None = None) -> Path:
        """Leave a request for the driver (``stop``, ``extend``, ``clone``); it removes it once done."""
        self.requests.mkdir(exist_ok=True)
        path = self.requests / (
            kind if kind == "stop" else f"{kind}-{time.time_ns()}-{uuid.uuid4().hex[:6]}.json"
        )
        atomic_write_json(path, {"t": time.time(), **(body or {})})
        return path

    def pending(self) -> list[tuple[str, Path, dict[str, Any]]]:
        """The requests not carried out yet, oldest first: (kind, file, body)."""
        if not self.requests.is_dir():
            return []
        out = []
        for p in sorted(self.requests.iterdir(), key=lambda p: p.name):
            kind = p.name.split("-")[0].removesuffix(".json")
            try:
                body = read_json(p, max_bytes=1 << 16, below=self.root)
            except (OSError, ValueError):
                body = None
            out.append((kind, p, body if isinstance(body, dict) else {}))
        return out


def _object(path: Path, what: str) -> dict[str, Any]:
    try:
        data = read_json(path, max_bytes=MAX_JSON_BYTES, below=path.parent)
    except FileNotFoundError:
        raise NbtrainError(f"{what} ({path}) is missing: {path.parent} is not a whole sweep folder") from None
    except (OSError, ValueError) as e:
        raise NbtrainError(f"{what} ({path}) cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise NbtrainError(f"{what} ({path}) is not a JSON object")
    return data


def sweeps_root() -> Path:
    return runs_root() / SWEEPS


def write_json(path: Path, obj: Any) -> None:
    atomic_write_json(path, json.loads(json.dumps(obj, default=str)))


def is_sweep_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / "sweep.json").is_file() and _owned(path)


def _owned(path: Path) -> bool:
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False
