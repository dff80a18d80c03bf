"""One source of meaning per config key: the fields' descriptions, read by the completer's schema,
``%finetune help KEY`` and docs/config.md (generated; stale fails here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nbtrain.contract.errors import NbtrainError
from nbtrain.control.config import reference


def test_schema_keys_follow_refs_and_optional_objects() -> None:
    schema = {
        "properties": {"q": {"anyOf": [{"$ref": "#/$defs/Q"}, {"type": "null"}], "default": None}},
        "$defs": {"Q": {"type": "object", "properties": {"bits": {"enum": [4, 8], "default": 4}}}},
    }
    keys = reference.schema_keys(schema)
    assert keys["q"]["type"] == ["null", "object"]
    assert keys["q.bits"] == {"type": [], "enum": [4, 8], "default": 4, "required": False}


def test_every_nbtrain_key_has_a_description() -> None:
    keys = reference.keys()
    assert {"model", "lora.r", "data.train", "distributed.slurm.time", "hooks.callbacks"} <= set(keys)
    missing = sorted(k for k, v in keys.items() if not v.get("description"))
    assert missing == [], f"keys without Field(description=...): {missing}"


def test_help_says_a_keys_meaning_type_default_and_examples() -> None:
    text = reference.describe("lora.r")
    assert text.startswith("lora.r: The rank of the adapter matrices")
    assert "type: integer; default: 8" in text and "e.g. 8; 16; 64" in text
    slurm = reference.describe("distributed.slurm:")
    assert "keys: partition, account" in slurm
    assert "learning rate" in reference.describe("train.learning_rate").lower()  # TRL's own words
    assert "beta" in reference.describe("train.beta", objective="dpo")


def test_help_for_an_unknown_key_names_close_ones() -> None:
    with pytest.raises(NbtrainError, match=r"'lora.rank' is not an nbtrain config key; did you mean lora.r"):
        reference.describe("lora.rank")
    with pytest.raises(
        NbtrainError, match=r"train: learning_rat is not a field .* did you mean train.learning_rate"
    ):
        reference.describe("train.learning_rat")


def test_docs_config_md_is_generated_from_the_fields_and_not_stale() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nbtrain.control.config.reference", "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    text = reference.DOC.read_text()
    assert "| `lora.r` | integer | `8` | The rank of the adapter matrices" in text
    assert "## distributed:" in text and "`distributed.slurm.signal_before`" in text
