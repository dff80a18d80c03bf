"""Which experiment trackers a run asked for (``train: report_to``) and where their files go: the part
both sides share (standard library only). The kernel checks the names against what is installed when it
validates a config; the training process calls ``tracking_env`` before the Trainer exists, so each
tracker keeps its files in the run directory:

- tensorboard: event files in ``<run>/logs/tensorboard`` (TENSORBOARD_LOGGING_DIR);
- wandb: ``WANDB_MODE=offline`` when no API key is set (``wandb sync <run>/wandb/offline-run-*``
  uploads later), its files in ``<run>/wandb``;
- mlflow: a file store in ``<run>/mlruns`` unless MLFLOW_TRACKING_URI names a server.

Anything the user sets in the environment wins. Installed means found by ``importlib.util.find_spec``:
nothing is imported.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
