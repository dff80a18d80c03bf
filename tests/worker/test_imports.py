"""A training process imports only the worker, the contract and the hardware layer: no control or UI
module, and none of what they need (pydantic, YAML, the registry's sqlite3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORKER_MODULES = [
    "nbtrain.worker.__main__",
    "nbtrain.worker.recipes.common",
    "nbtrain.worker.recipes.sft",
    "nbtrain.worker.recipes.preference",
    "nbtrain.worker.recipes.grpo",
    "nbtrain.worker.function",
    "nbtrain.worker.runlog",
    "nbtrain.worker.tuned",
    "nbtrain.worker.data",
    "nbtrain.worker.model",
    "nbtrain.worker.lean",
    "nbtrain.worker.control",
    "nbtrain.worker.introspect",
    "nbtrain.worker.jobs.evaluate",
    "nbtrain.worker.jobs.export",
    "nbtrain.worker.jobs.preview",
    "nbtrain.worker.jobs.score",
]
FORBIDDEN_PACKAGES = ("pydantic", "yaml", "sqlite3")


def test_the_worker_imports_no_control_or_ui_module_and_no_pydantic_yaml_or_sqlite() -> None:
    # A fresh interpreter, with the worker's own lean-import rule for a LoRA run (bitsandbytes and scipy
    # hidden), as ``python -m nbtrain.worker`` has it before anything else is imported.
    script = (
        "import json, sys\n"
        "from nbtrain.worker.lean import hide_unused_packages\n"
        "hide_unused_packages({'config': {'method': 'lora'}, 'train_args': {}})\n"
        f"import {', '.join(WORKER_MODULES)}\n"
        "print(json.dumps(sorted(name for name, m in sys.modules.items() if m is not None)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    upper = [m for m in loaded if m.startswith(("nbtrain.control", "nbtrain.ui"))]
    assert upper == [], f"the worker imported the layers above it: {upper}"
    heavy = [m for m in loaded if m.split(".")[0] in FORBIDDEN_PACKAGES]
    assert heavy == [], f"the worker imported what only the kernel needs: {heavy}"
    assert "torch" not in loaded, "importing the worker's modules loads no library: that waits for a run"


def test_the_worker_entry_point_up_to_the_recipe_imports_no_control_or_ui_module(tmp_path: Path) -> None:
    """``python -m nbtrain.worker RUN_DIR`` as a run starts it, through reading resolved.json, hiding
    packages and pointing the trackers into the run directory, until the recipe (here none: the objective
    is unknown, so the run fails right there) would import the libraries."""
    from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_json

    paths = RunPaths(tmp_path / "run")
    paths.make()
    resolved = {"config": {"objective": "no-such-objective", "method": "lora"},
                "train_args": {"report_to": ["tensorboard"]}, "plan": {}, "data": {}}  # fmt: skip
    atomic_write_json(paths.resolved, resolved)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "nbtrain.worker", str(paths.root)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "no-such-objective" in read_json(paths.status)["error"]["message"]
    # -X importtime writes "import time: self | cumulative | <indent>module" for each import
    loaded = [
        line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    ]
    assert "nbtrain.contract.tracking" in loaded  # the trackers were set up on the way
    upper = [m for m in loaded if m.startswith(("nbtrain.control", "nbtrain.ui"))]
    assert upper == [], f"the worker imported the layers above it: {upper}"
    heavy = [m for m in loaded if m.split(".")[0] in FORBIDDEN_PACKAGES]
    assert heavy == [], f"the worker imported what only the kernel needs: {heavy}"
