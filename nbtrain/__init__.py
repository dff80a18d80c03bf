"""nbtrain: fine-tune LLMs from a notebook.

    %load_ext nbtrain          # then a %%finetune cell with a YAML body
    import nbtrain; run = nbtrain.finetune("config.yaml"); run.wait()

The package is laid out in layers (docs/architecture.md): ``ui`` (magics, CLI, views, server extension)
over ``control`` (config, plan, runs, processes) over ``contract`` (the run directory) and ``hardware``;
``worker`` runs inside training processes and imports only contract and hardware.

This module is only the facade, and it is lazy (PEP 562): ``import nbtrain`` loads nothing else, a name
is imported on first use, so a training rank or the Jupyter server that imports ``nbtrain.worker`` or
``nbtrain.ui.server`` does not pay for pydantic, YAML or the registry, and no import here ever loads
torch, transformers or bitsandbytes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nbtrain.contract import __version__

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # run-returning functions hand back the notebook handle (nbtrain.ui.run.Run)
    "Run": "nbtrain.ui.run",
    "finetune": "nbtrain.ui.run",
    "start": "nbtrain.ui.run",
    "resume": "nbtrain.ui.run",
    "get_run": "nbtrain.ui.run",
    "runs": "nbtrain.ui.run",
    "last_run": "nbtrain.ui.run",
    "launch_function": "nbtrain.ui.run",
    "Sweep": "nbtrain.ui.sweeps",
    "sweep": "nbtrain.ui.sweeps",
    "get_sweep": "nbtrain.ui.sweeps",
    "sweeps": "nbtrain.ui.sweeps",
    "RunStatus": "nbtrain.control.runs.run",
    "Prepared": "nbtrain.control.start",
    "prepare": "nbtrain.control.start",
    "estimate": "nbtrain.ui.estimate_chart",
    "probe": "nbtrain.control.start",
    "example_data": "nbtrain.control.start",
    "example_model": "nbtrain.control.start",
    "make_tiny_model": "nbtrain.control.start",
    "make_tiny_vlm": "nbtrain.control.start",
    "example_images": "nbtrain.control.start",
    "DataPreview": "nbtrain.ui.preview",
    "preview": "nbtrain.ui.preview",
    "EvalReport": "nbtrain.control.jobs.evaluate",
    "evaluate": "nbtrain.control.jobs.evaluate",
    "latest_eval": "nbtrain.control.jobs.evaluate",
    "AccuracyReport": "nbtrain.control.jobs.evaluate",
    "accuracy": "nbtrain.control.jobs.evaluate",
    "latest_accuracy": "nbtrain.control.jobs.evaluate",
    "ToolCallReport": "nbtrain.control.jobs.tool_eval",
    "tool_accuracy": "nbtrain.control.jobs.tool_eval",
    "latest_tool_accuracy": "nbtrain.control.jobs.tool_eval",
    "ExportResult": "nbtrain.control.jobs.export",
    "export": "nbtrain.control.jobs.export",
    "CheckReport": "nbtrain.control.jobs.grading",
    "check": "nbtrain.control.jobs.grading",
    "record": "nbtrain.control.jobs.grading",
    "records": "nbtrain.control.jobs.grading",
    "preference_scores": "nbtrain.control.jobs.scoring",
    "ConfigError": "nbtrain.contract.errors",
    "NbtrainError": "nbtrain.contract.errors",
    "RunFailed": "nbtrain.contract.errors",
    "RunNotFound": "nbtrain.contract.errors",
    # inside a training function started with launch_function (runs in the ranks)
    "log": "nbtrain.worker.runlog",
    "should_stop": "nbtrain.worker.runlog",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nbtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


def panel(config: Any = None) -> Any:
    """A widget form that builds (and launches) a run config; ``config`` pre-fills it (YAML, dict, path
    or Run)."""
    from nbtrain.ui.panel import panel as make_panel

    return make_panel(config)


def load_ipython_extension(ipython: Any) -> None:
    from nbtrain.ui.magics import load_ipython_extension as load

    load(ipython)


if TYPE_CHECKING:  # what static checkers and editors see; at run time __getattr__ imports on first use
    from nbtrain.contract.errors import ConfigError, NbtrainError, RunFailed, RunNotFound
    from nbtrain.control.jobs.evaluate import (
        AccuracyReport,
        EvalReport,
        accuracy,
        evaluate,
        latest_accuracy,
        latest_eval,
    )
    from nbtrain.control.jobs.export import ExportResult, export
    from nbtrain.control.jobs.grading import CheckReport, check, record, records
    from nbtrain.control.jobs.scoring import preference_scores
    from nbtrain.control.jobs.tool_eval import ToolCallReport, latest_tool_accuracy, tool_accuracy
    from nbtrain.control.runs.run import RunStatus
    from nbtrain.control.start import (
        Prepared,
        example_data,
        example_images,
        example_model,
        make_tiny_model,
        make_tiny_vlm,
        prepare,
        probe,
    )
    from nbtrain.ui.estimate_chart import estimate
    from nbtrain.ui.preview import DataPreview, preview
    from nbtrain.ui.run import Run, finetune, get_run, last_run, launch_function, resume, runs, start
    from nbtrain.ui.sweeps import Sweep, get_sweep, sweep, sweeps
    from nbtrain.worker.runlog import log, should_stop

__all__ = [
    "AccuracyReport",
    "CheckReport",
    "ConfigError",
    "DataPreview",
    "EvalReport",
    "ExportResult",
    "NbtrainError",
    "Prepared",
    "Run",
    "RunFailed",
    "RunNotFound",
    "RunStatus",
    "Sweep",
    "ToolCallReport",
    "__version__",
    "accuracy",
    "check",
    "estimate",
    "evaluate",
    "example_data",
    "example_images",
    "example_model",
    "export",
    "finetune",
    "get_run",
    "get_sweep",
    "last_run",
    "latest_accuracy",
    "latest_eval",
    "latest_tool_accuracy",
    "launch_function",
    "load_ipython_extension",
    "log",
    "make_tiny_model",
    "make_tiny_vlm",
    "panel",
    "preference_scores",
    "prepare",
    "preview",
    "probe",
    "record",
    "records",
    "resume",
    "runs",
    "should_stop",
    "start",
    "sweep",
    "sweeps",
    "tool_accuracy",
]
