"""Tiny vision-language models and an image dataset, for the vision lab on CPU and the tests.

No model hub is needed: each model is built from configs with random weights (a CLIP-style encoder and a
2-layer Llama for the LLaVA family; a SigLIP-style encoder and a Llama for the Idefics3/SmolVLM family),
with a processor whose tokenizer is a byte-level BPE trained here and whose chat template renders image
parts. Neither needs torchvision (their image processors are the Pillow ones).

    python -m nbtrain.examples.vision model DIR [--family llava|idefics3]
    python -m nbtrain.examples.vision data FILE [-n N] [--format messages|trl|alpaca]

The task: a 28x28 picture of one colour, "What colour is this?", answered with the colour's name.
``make_tiny_vlm`` imports transformers (call it from a worker or a test); the kernel-safe wrappers are
``nbtrain.make_tiny_vlm`` and ``nbtrain.example_images``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from nbtrain.examples import train_bpe

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (40, 60, 220),
    "yellow": (240, 220, 40),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
}
QUESTION = "What colour is this?"
IMAGE_SIZE = 28
FAMILIES = ("llava", "idefics3")

# Content parts: an image part renders as the family's image token, text parts as their text; the
# assistant's text is marked as the generation (TRL's assistant_only_loss needs it).
_RENDER = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}IMAGE"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)
LLAVA_TEMPLATE = (
    _RENDER.replace("IMAGE", "<image>{{ '\\n' }}") + "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}ASSISTANT:{{ '\\n' }}{% generation %}{{ render(m['content']) }}</s>"
    "{% endgeneration %}{{ '\\n' }}"
    "{%- else -%}{{ m['role'] | upper }}: {{ render(m['content']) }}{{ '\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}ASSISTANT:{{ '\\n' }}{%- endif -%}"
)


def _corpus() -> list[str]:
    words = [*COLOURS, "what", "colour", "is", "this", "the", "a", "picture", "of", "it", "user", "assistant"]
    rng = random.Random(0)
    lines = [f"USER: {QUESTION}\nASSISTANT:\n{c}" for c in COLOURS for _ in range(20)]
    lines += [" ".join(rng.choice(words) for _ in range(8)) for _ in range(400)]
    return lines


def make_tiny_vlm(path: str | Path, family: str = "llava", *, seed: int = 0) -> Path:
    """Build and save a tiny vision-language model of ``family`` and its processor at ``path``."""
    if family not in FAMILIES:
        raise ValueError(f"family is one of {', '.join(FAMILIES)}, not {family!r}")
    import torch

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model, processor = _llava() if family == "llava" else _idefics3()
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def _llava() -> tuple[Any, Any]:
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    specials = ["<pad>", "<s>", "</s>", "<image>"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(specials, 400, _corpus()), pad_token="<pad>", bos_token="<s>",
        eos_token="</s>", unk_token=None, extra_special_tokens={"image_token": "<image>"},
        model_max_length=512,
    )  # fmt: skip
    patch = 14
    images = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE, image_token="<image>",
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=IMAGE_SIZE, patch_size=patch, projection_dim=32,
    )  # fmt: skip
    ids: dict[str, int] = {t: int(tok.convert_tokens_to_ids(t)) for t in specials}  # type: ignore[arg-type]
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"],
        initializer_range=0.3,  # logits large enough for a few LoRA steps to move (0.02: stuck near uniform)
    )  # fmt: skip
    cfg = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=ids["<image>"],  # type: ignore[call-arg]
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )  # fmt: skip
    model = LlavaForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = ids["</s>"]
    model.generation_config.pad_token_id = ids["<pad>"]
    return model, processor


# SmolVLM's turns: "User:<image>What colour is this?<end_of_utterance>\nAssistant: red<end_of_utterance>\n"
IDEFICS3_TEMPLATE = (
    _RENDER.replace("IMAGE", "<image>") + "{%- for m in messages -%}"
    "{%- if loop.first -%}<|im_start|>{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "Assistant:{% generation %} {{ render(m['content']) }}<end_of_utterance>{% endgeneration %}{{ '\\n' }}"
    "{%- else -%}{{ m['role'] | capitalize }}:{{ render(m['content']) }}<end_of_utterance>{{ '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)


def _idefics3() -> tuple[Any, Any]:
    """A SigLIP-style encoder (patch 7: 16 patches of a 28x28 picture), pixel shuffle by 2 into 4 image
    tokens, a linear connector and a 2-layer Llama: the Idefics3 / SmolVLM layout."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    specials = ["<pad>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>"]  # fmt: skip
    lines = [f"User:{QUESTION} Assistant: {c}" for c in COLOURS for _ in range(20)] + _corpus()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(specials, 400, lines), bos_token="<|im_start|>",
        eos_token="<end_of_utterance>", pad_token="<pad>", unk_token=None, model_max_length=512,
        extra_special_tokens={"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                              "global_image_token": "<global-img>"},
    )  # fmt: skip
    patch, scale = 7, 2
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=False,
    )
    # image tokens per picture: (28 / 7)^2 patches, merged scale^2 at a time by the pixel shuffle
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=(IMAGE_SIZE // patch) ** 2 // scale**2,
        chat_template=IDEFICS3_TEMPLATE,
    )  # fmt: skip
    ids: dict[str, int] = {t: int(tok.convert_tokens_to_ids(t)) for t in specials}  # type: ignore[arg-type]
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": IMAGE_SIZE, "patch_size": patch}  # fmt: skip
    text = {"model_type": "llama", "vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "pad_token_id": ids["<pad>"], "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<end_of_utterance>"], "tie_word_embeddings": False,
            "initializer_range": 0.3}  # fmt: skip
    cfg = Idefics3Config(
        vision_config=vision, text_config=text, scale_factor=scale, image_token_id=ids["<image>"],
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Idefics3ForConditionalGeneration(cfg)
    model.generation_config.pad_token_id = ids["<pad>"]
    model.generation_config.bos_token_id = ids["<|im_start|>"]
    model.generation_config.eos_token_id = ids["<end_of_utterance>"]
    return model, processor


def image_rows(
    n: int = 120, seed: int = 0, *, fmt: str = "messages", folder: str = "img"
) -> list[dict[str, Any]]:
    """Rows of the colour task naming images ``folder/<i>-<colour>.png`` (relative paths), in one of the
    layouts nbtrain reads: ``messages`` (image parts with a path), ``trl`` (an images column and
    ``{"type": "image"}`` parts), ``alpaca`` (an image column) or ``preference`` (DPO pairs: the colour
    chosen over another)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        colour = rng.choice(list(COLOURS))
        image = f"{folder}/{i}-{colour}.png"
        if fmt == "messages":
            user: list[dict[str, Any]] = [
                {"type": "image", "path": image},
                {"type": "text", "text": QUESTION},
            ]
            rows.append(
                {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": colour}]}
            )
        elif fmt == "trl":
            user = [{"type": "image"}, {"type": "text", "text": QUESTION}]
            answer = [{"type": "text", "text": colour}]
            turns = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            rows.append({"images": [image], "messages": turns})
        elif fmt == "alpaca":
            rows.append({"image": image, "instruction": QUESTION, "output": colour})
        elif fmt == "preference":  # DPO: the right colour over another one
            wrong = rng.choice([c for c in COLOURS if c != colour])
            prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
            chosen = [{"role": "assistant", "content": colour}]
            rows.append({"images": [image], "prompt": prompt, "chosen": chosen,
                         "rejected": [{"role": "assistant", "content": wrong}]})  # fmt: skip
        else:
            raise ValueError(f"format is messages, trl, alpaca or preference, not {fmt!r}")
    return rows


def write_image_dataset(path: str | Path, n: int = 120, seed: int = 0, *, fmt: str = "messages") -> Path:
    """Write the colour task as JSON lines at ``path`` and its pictures beside it (``<stem>_img/``)."""
    from PIL import Image

    p = Path(path)
    folder = f"{p.stem}_img"  # beside the file, one per file: a second dataset does not overwrite them
    rows = image_rows(n, seed, fmt=fmt, folder=folder)
    (p.parent / folder).mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    for i, row in enumerate(rows):
        colour = _answer(row)
        shade = tuple(max(0, min(255, c + rng.randint(-15, 15))) for c in COLOURS[colour])
        Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), shade).save(p.parent / folder / f"{i}-{colour}.png")
    with open(p, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return p


def _answer(row: dict[str, Any]) -> str:
    if "output" in row:
        return str(row["output"])
    if "chosen" in row:
        return str(row["chosen"][0]["content"])
    content = row["messages"][-1]["content"]
    return str(content if isinstance(content, str) else content[0]["text"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.examples.vision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model", help="build a tiny vision-language model")
    m.add_argument("dir")
    m.add_argument("--family", default="llava", choices=FAMILIES)
    d = sub.add_parser("data", help="write the colour dataset and its images")
    d.add_argument("file")
    d.add_argument("-n", type=int, default=120)
    d.add_argument("--format", default="messages", choices=["messages", "trl", "alpaca", "preference"])
    args = ap.parse_args(argv)
    if args.what == "model":
        print(make_tiny_vlm(args.dir, args.family))
    else:
        print(write_image_dataset(args.file, args.n, fmt=args.format))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
