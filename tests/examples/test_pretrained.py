"""The pretrained tiny model that ships with nbtrain (nbtrain/assets/tiny-adder): it is what the build
script makes, it knows the held-out sums as text but was never asked one in a chat, and the held-out
questions are none of the labs' training rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.examples import addition_items
from nbtrain.examples.pretrained import (
    ASSET,
    build_tokenizer,
    check,
    held_out_addition,
    held_out_pairs,
    model_config,
)

SHIPPED = Path(nbtrain.__file__).parent / ASSET


def test_the_shipped_model_has_the_config_and_tokenizer_the_build_script_makes(tmp_path: Path) -> None:
    tok = build_tokenizer()
    model_config(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    made, shipped = (json.loads((d / "config.json").read_text()) for d in (tmp_path, SHIPPED))
    # what saving the model (not only its config) adds
    assert shipped.pop("architectures") == ["LlamaForCausalLM"] and shipped.pop("dtype") == "float32"
    for cfg in (made, shipped):
        cfg.pop("transformers_version", None)
    assert made == shipped
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == json.loads(
        (SHIPPED / "tokenizer.json").read_text()
    )
    # what the build recorded about itself: the same seed and steps the script takes by default
    report = json.loads((SHIPPED / "pretraining.json").read_text())
    assert report["seed"] == 0 and report["steps"] == 3000
    assert (SHIPPED / "model.safetensors").stat().st_size < 4 * 2**20  # a few MB at most


def test_the_shipped_model_knows_the_held_out_sums_as_text_and_was_never_asked_one_in_a_chat() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(SHIPPED)
    result = check(model, AutoTokenizer.from_pretrained(SHIPPED), n=32)
    assert result["plain_text_accuracy"] >= 0.9, result  # "12 + 7 =" -> "19"
    assert result["chat_accuracy"] <= 0.1, result  # "What is 12 + 7?" -> not "12 + 7 = 19"


def test_held_out_questions_are_none_of_the_labs_training_rows_and_always_the_same() -> None:
    asked = {q for q, _ in addition_items(400, seed=0)}  # nbtrain/assets/add.jsonl
    held = held_out_addition(64)
    assert len({q for q, _ in held}) == 64 and not asked & {q for q, _ in held}
    assert held_out_addition(8) == held[:8]
    a, b = held_out_pairs(1)[0]
    assert held[0] == (f"What is {a} + {b}?", f"{a} + {b} = {a + b}")
    with pytest.raises(ValueError, match="there are 64 held-out sums; ask for 1 to 64, not 65"):
        held_out_addition(65)


def test_example_model_copies_the_shipped_model_whole_and_keeps_a_copy_already_there(tmp_path: Path) -> None:
    out = nbtrain.example_model(tmp_path / "tiny-adder")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in SHIPPED.iterdir())
    assert (out / "model.safetensors").read_bytes() == (SHIPPED / "model.safetensors").read_bytes()
    (out / "marker").write_text("mine")
    assert nbtrain.example_model(out) == out and (out / "marker").exists()
    assert not list(tmp_path.glob(".*partial"))
