"""The one-off jobs the kernel runs in a process of their own, in one table and one shape.

Every job is ``python -m MODULE ARGS... --result FILE``: it does one thing (evaluate a run, export it,
convert a GGUF file, tokenise a preview, score preference pairs) and writes one JSON object to FILE,
atomically, before it exits; a job that fails before it can answer writes nothing and its log says why.
The kernel runs them with ``nbtrain.control.launch.process.run_job(NAME, ARGS, ...)``, which adds the
``--result`` argument, waits, stops the job's process group past its timeout and reads the file; the
job parses its arguments with ``result_argument`` on its parser. Long-lived processes (training workers,
servers) are not jobs: they have run directories and are started by the spawner itself.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    module: str  # run as python -m MODULE
    what: str  # how an error names it: "<what> failed ..."


JOBS: dict[str, Job] = {
    "evaluate": Job("nbtrain.worker.jobs.evaluate", "the evaluation"),
    "export": Job("nbtrain.worker.jobs.export", "the export"),
    "convert-gguf": Job("nbtrain.worker.gguf", "converting the GGUF file"),
    "preview": Job("nbtrain.worker.jobs.preview", "the preview"),
    "score": Job("nbtrain.worker.jobs.score", "scoring"),
}


def result_argument(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The ``--result FILE`` every job takes (optional where the job also runs by hand and prints)."""
    parser.add_argument(
        "--result", required=required, default=None, help="write the job's JSON result here (atomically)"
    )


__all__ = ["JOBS", "Job", "result_argument"]
