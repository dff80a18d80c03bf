from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

from nbtrain.control.config import trainargs


def test_shipped_snapshot_matches_installed_trl(tmp_path: Path) -> None:
    """The kernel validates train: keys from a snapshot; it must equal what the installed TRL says."""
    out = tmp_path / "fields.json"
    subprocess.run([sys.executable, "-m", "nbtrain.worker.introspect", str(out)], check=True, timeout=300)
    fresh = json.loads(out.read_text())
    shipped = json.loads(resources.files("nbtrain").joinpath("assets/sft_fields.json").read_text())
    assert shipped["versions"] == fresh["versions"], "regenerate: python -m nbtrain.worker.introspect"
    assert shipped["fields"] == fresh["fields"]


def test_key_checks() -> None:
    assert trainargs.check_key("learning_rate") is None
    assert "did you mean 'max_length'" in (trainargs.check_key("max_seq_length") or "")
    assert "nbtrain writes checkpoints" in (trainargs.check_key("output_dir") or "")


def test_value_checks_follow_field_types() -> None:
    assert trainargs.check_value("learning_rate", 2) is None  # an int is a fine float
    assert trainargs.check_value("max_steps", 2.5) is not None
    assert trainargs.check_value("max_steps", True) is not None  # bool is not an int here
    assert trainargs.check_value("gradient_checkpointing", "yes") is not None
    assert trainargs.check_value("report_to", ["tensorboard"]) is None
    assert "cosine" in (trainargs.check_value("lr_scheduler_type", "cosin") or "")
    assert trainargs.check_value("eval_steps", None) is None
    assert trainargs.check_value("max_steps", None) is not None
