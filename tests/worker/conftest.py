"""Two-rank runs shared by the strategy tests (test_multiprocess) and the estimator-against-measurement test
(test_memory_measured): one notebook starts them all at once, so each strategy's 2 ranks start once for
both (they were 17 runs in two notebooks, 12 now)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nbtrain
from tests.conftest import lora_yaml, runs_in
from tests.notebook import execute

STEPS = 6  # the optimizer state exists from the first step on; six steps show the ranks agree

# name -> (distributed: body, method). Probe runs (their ranks sample the model-state bytes at every
# optimizer step, as nbtrain.probe's do) are what test_memory_measured compares with the estimate.
TWO_RANK_RUNS = {
    "ddp": ("  strategy: ddp\n", "lora"),
    "zero1": ("  strategy: zero1\n", "lora"),
    "zero2": ("  strategy: zero2\n", "lora"),
    "zero3": ("  strategy: zero3\n", "lora"),
    "zero3-offload": ("  strategy: zero3\n  offload: optimizer\n", "lora"),
    "qlora-ddp": ("  strategy: ddp\n", "qlora"),
    "full-ddp": ("  strategy: ddp\n", "full"),
    "full-zero1": ("  strategy: zero1\n", "full"),
    "full-zero2": ("  strategy: zero2\n", "full"),
    "full-zero3": ("  strategy: zero3\n", "full"),
    "zero2-accelerate": ("  strategy: zero2\n  launcher: accelerate\n", "lora"),
    "two-nodes": ("  strategy: ddp\n  num_processes: 1\n  nodes: 2\n  hostfile: hosts.txt\n", "lora"),
}
PROBED = ("ddp", "zero1", "zero2", "zero3", "full-ddp", "full-zero1", "full-zero2", "full-zero3")


def body(distributed: str, method: str) -> str:
    return lora_yaml(STEPS, method=method).replace("3.0e-3", "1.0e-3") + f"distributed:\n{distributed}"


def probe_run_cell(name: str, text: str) -> str:
    """A notebook cell that starts ``text`` as a probe run named ``name`` and returns at once: resolved.json
    says ``"probe": true``, so its ranks sample their model-state bytes at every optimizer step."""
    return (
        "from dataclasses import replace\n"
        "from nbtrain.control.start import prepare, start\n"
        f"start(replace(prepare({text!r}, name={name!r}), probe=True));"
    )


def start_cell(name: str, distributed: str, method: str) -> str:
    if name in PROBED:
        return probe_run_cell(name, body(distributed, method))
    return f"%%finetune --name {name} --no-view\n{body(distributed, method)}"


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Any]:
    """{"runs": name -> Run, "notebook": the executed notebook, "work": its directory}: every run of
    TWO_RANK_RUNS started from cells of one notebook, then waited for with %finetune wait."""
    from nbtrain.examples import write_dataset

    work = tmp_path_factory.mktemp("two-rank")
    (work / "tiny-llama").symlink_to(tiny_model)
    write_dataset(work / "data" / "add.jsonl")
    (work / "hosts.txt").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    cells = ["%load_ext nbtrain"] + [start_cell(n, *spec) for n, spec in TWO_RANK_RUNS.items()]
    cells += [f"%finetune wait {n}" for n in TWO_RANK_RUNS]
    with runs_in(work):
        nb = execute(cells, work, timeout=1200)
        runs = {n: nbtrain.get_run(n) for n in TWO_RANK_RUNS}
    return {"runs": runs, "notebook": nb, "work": work}
