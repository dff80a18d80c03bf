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
    assert any("at most 1 per row, 4 tokens per image" in n for n in prep.resolved.notes)
    est = prep.plan.estimate
    assert est is not None
    loaded = AutoModelForImageTextToText.from_pretrained(vision_workdir / "tiny-llava")
    assert est["total_params"] == sum(p.numel() for p in loaded.parameters())
    assert est["inputs"]["seq_len"] == 512 + 4  # the language model's context and the row's image tokens


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


# A tiny Qwen2-VL's config.json as transformers 5.24 saves it (defaults left out); the counts are those of the
# model built from it, summed from its safetensors (a Qwen2-VL processor needs torchvision, which no CPU
# build of here provides, so the model is not built in this suite).
QWEN2_VL = {
    "model_type": "qwen2_vl", "tie_word_embeddings": True,
    "text_config": {"model_type": "qwen2_vl_text", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "vocab_size": 399},
    "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2, "num_heads": 2,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
}  # fmt: skip


def test_a_qwen2_vl_is_counted_from_its_config_and_its_image_tokens_from_its_processor(
    tmp_path: Path,
) -> None:
    from nbtrain.control.memory import count_parameters, tokens_per_image

    pc = count_parameters(QWEN2_VL)
    assert (pc.total, pc.vision, pc.projector) == (170_848, 46_176, 24_832)
    (tmp_path / "preprocessor_config.json").write_text('{"min_pixels": 784, "max_pixels": 3136}')
    assert tokens_per_image(QWEN2_VL, tmp_path) == 4  # 56x56 px: 4x4 patches of 14, merged 2x2
    assert tokens_per_image(QWEN2_VL) == 16_384  # Qwen2-VL's default max_pixels
