"""nbtrain: fine-tune LLMs from a notebook.

    %load_ext nbtrain          # then a %%finetune cell with a YAML body
    import nbtrain; run = nbtrain.finetune("config.yaml"); run.wait()

Importing nbtrain (and loading the extension) imports no torch, transformers or bitsandbytes: training
happens in separate processes that read and write a run directory.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from nbtrain.api import (
    Prepared,
    estimate,
    example_data,
    finetune,
    last_run,
    make_tiny_model,
    prepare,
    probe,
    resume,
    runs,
    start,
)
from nbtrain.datapreview import DataPreview, preview
from nbtrain.errors import ConfigError, NbtrainError, RunFailed, RunNotFound
from nbtrain.evaluate import EvalReport, evaluate, latest_eval
from nbtrain.export import ExportResult, export
from nbtrain.grading import CheckReport, check, record, records
from nbtrain.notebook_launch import launch_function
from nbtrain.runlog import log, should_stop
from nbtrain.runs import Run, RunStatus, get_run
from nbtrain.scoring import preference_scores


def panel(config: Any = None) -> Any:
    """A widget form that builds (and launches) a run config; ``config`` pre-fills it (YAML, dict, path
    or Run)."""
    from nbtrain.ui.panel import panel as make_panel

    return make_panel(config)


def load_ipython_extension(ipython: Any) -> None:
    from nbtrain.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
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
    "__version__",
    "check",
    "estimate",
    "evaluate",
    "example_data",
    "export",
    "finetune",
    "get_run",
    "last_run",
    "latest_eval",
    "launch_function",
    "load_ipython_extension",
    "log",
    "make_tiny_model",
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
]
