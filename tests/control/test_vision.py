"""A vision-language model in the kernel's checks: found from its config, its images opened before
anything starts, its parameters counted exactly, and text models kept from image data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError


def vision_yaml(data: str = "data/colours.jsonl", extra: str = "") -> str:
    return f"""\
model: ./tiny-llava
method: lora
data: {{train: {data}}}
train: {{max_steps: 2, per_device_train_batch_size: 4}}
{extra}"""


def test_a_vision_language_model_is_found_and_its_parameters_counted_exactly(vision_workdir: Path) -> None:
    from transformers import AutoModelForImageTextToText

    os.chdir(vision_workdir)
    prep = nbtrain.prepare(vision_yaml())
    assert (
        prep.resolved.config.vision is not None and prep.resolved.config.vision.freeze == "encoder+projector"
    )
    assert prep.train_args["max_length"] is None  # no truncation inside a row's image tokens
    assert any("vision-language (llava" in n and "48 image(s)" in n for n in prep.resolved.notes)
    est = prep.plan.estimate
    assert est is not None
    loaded = AutoModelForImageTextToText.from_pretrained(vision_workdir / "tiny-llava")
    assert est["total_params"] == sum(p.numel() for p in loaded.parameters())


def test_a_corrupt_image_in_row_3_is_refused_by_row_and_file_before_a_run_dir_exists(
    vision_workdir: Path,
) -> None:
    os.chdir(vision_workdir)
    third = sorted((vision_workdir / "data" / "colours_img").glob("2-*.png"))[0]
    third.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(vision_yaml(), name="corrupt")
    text = str(e.value)
    assert "row 3" in text and f"colours_img/{third.name}" in text and "not a readable image" in text
    third.unlink()
    with pytest.raises(ConfigError, match=rf"row 3: the image colours_img/{third.name} is not there"):
        nbtrain.prepare(vision_yaml())
    assert not (vision_workdir / "nbtrain_runs").exists() or not any(
        (vision_workdir / "nbtrain_runs").iterdir()
    )


def test_images_for_a_text_model_and_vision_settings_for_one_are_refused(
    vision_workdir: Path, tiny_model: Path
) -> None:
    os.chdir(vision_workdir)
    text_model = vision_yaml().replace("./tiny-llava", str(tiny_model))
    with pytest.raises(ConfigError, match=r"the data names images .* is a text model"):
        nbtrain.prepare(text_model)
    (vision_workdir / "plain.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    )
    with pytest.raises(ConfigError, match="vision: applies to a vision-language model"):
        nbtrain.prepare(
            vision_yaml("plain.jsonl", "vision: {freeze: encoder}\n").replace("./tiny-llava", str(tiny_model))
        )
    (vision_workdir / "pairs.jsonl").write_text('{"prompt": "hi", "chosen": "yo", "rejected": "no"}\n')
    with pytest.raises(
        ConfigError, match=r"objective: orpo on a vision-language model .* objective: dpo on image"
    ):
        nbtrain.prepare(vision_yaml("pairs.jsonl").replace("method: lora", "method: lora\nobjective: orpo"))
