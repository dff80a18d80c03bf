"""Vision-language fine-tuning for real: the tiny LLaVA-style model trains LoRA and QLoRA on image+text rows
in worker processes, its adapter and processor load with peft and generate from an image, the server
answers the real openai client's image_url request, eval measures the image rows, and export merges."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.rundir import read_jsonl
from nbtrain.examples.vision import COLOURS, QUESTION, write_image_dataset
from tests.conftest import runs_in

pytestmark = pytest.mark.slow


def vision_config(model: Path, work: Path, method: str = "lora", steps: int = 80) -> str:
    return f"""\
model: {model}
method: {method}
data: {{train: {work / "data" / "colours.jsonl"}, eval_split: 8}}
lora: {{r: 8, alpha: 16, dropout: 0.0}}
train: {{max_steps: {steps}, learning_rate: 2.0e-2, per_device_train_batch_size: 4, logging_steps: 5,
         gradient_checkpointing: false, eval_strategy: "no", assistant_only_loss: true}}
"""


@pytest.fixture(scope="module")
def vision_work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("vision")
    write_image_dataset(work / "data" / "colours.jsonl", n=96)
    with runs_in(work):
        yield work


@pytest.fixture(scope="module")
def lora_run(vision_work: Path, tiny_vlm: Path) -> nbtrain.Run:
    run = nbtrain.finetune(vision_config(tiny_vlm, vision_work), name="colours")
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    return run


def losses(run: nbtrain.Run) -> list[float]:
    return [float(r["loss"]) for r in read_jsonl(run.paths.metrics) if "loss" in r]


def test_lora_on_image_rows_learns_the_colours_and_saves_the_processor(lora_run: nbtrain.Run) -> None:
    got = losses(lora_run)
    assert len(got) == 16 and got[-1] < got[0] / 4, got
    out = lora_run.paths.output
    assert (out / "adapter_model.safetensors").exists() and (out / "processor_config.json").exists()
    log = lora_run.logs(400)
    assert "88 training rows (messages), 8 eval rows" in log
    # the adapter wraps the language model only: 2 layers x (q_proj + v_proj) of the Llama
    assert "lora adapters: 3,584 trainable" in log


def test_the_adapter_and_processor_load_with_peft_and_answer_from_an_image(
    lora_run: nbtrain.Run, vision_work: Path
) -> None:
    import torch
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    cfg = lora_run.config
    base = AutoModelForImageTextToText.from_pretrained(cfg["model"])
    model = PeftModel.from_pretrained(base, str(lora_run.paths.output)).eval()
    processor = AutoProcessor.from_pretrained(str(lora_run.paths.output))
    right = 0
    for name, rgb in COLOURS.items():
        msgs = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (28, 28), rgb)},
                                             {"type": "text", "text": QUESTION}]}]  # fmt: skip
        enc = processor.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=3, do_sample=False)
        right += (
            processor.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip() == name
        )
    assert right >= 4, right  # of 6 colours (chance: 1)
    # the same through the run's own generate process, with images from files
    files = sorted((vision_work / "data" / "colours_img").glob("*.png"))[:8]
    replies = lora_run.generate([QUESTION] * 8, images=files, max_new_tokens=3)
    assert sum(r.strip() == f.stem.split("-")[1] for r, f in zip(replies, files, strict=True)) >= 6, replies


def test_the_server_answers_an_image_url_request_from_the_openai_client(
    lora_run: nbtrain.Run, vision_work: Path
) -> None:
    from openai import OpenAI

    from nbtrain.control.jobs.serve import data_uri

    image = sorted((vision_work / "data" / "colours_img").glob("*-blue.png"))[0]
    handle = lora_run.serve()
    try:
        client = OpenAI(base_url=handle.url, api_key=handle.api_key)
        content = [
            {"type": "image_url", "image_url": {"url": data_uri(image)}},
            {"type": "text", "text": QUESTION},
        ]
        reply = client.chat.completions.create(
            model="tuned", messages=[{"role": "user", "content": content}], max_tokens=3, temperature=0
        )
        assert reply.choices[0].message.content.strip() == "blue"
        file_url = [
            {"type": "image_url", "image_url": {"url": f"file://{image}"}},
            {"type": "text", "text": QUESTION},
        ]
        reply = client.chat.completions.create(
            model="tuned", messages=[{"role": "user", "content": file_url}], max_tokens=3, temperature=0
        )
        assert reply.choices[0].message.content.strip() == "blue"
        from openai import BadRequestError

        bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]
        with pytest.raises(BadRequestError, match="not a readable image"):
            client.chat.completions.create(model="tuned", messages=[{"role": "user", "content": bad}])
    finally:
        lora_run.stop_serving()


def test_eval_measures_the_image_rows_and_export_merges_into_a_model_that_loads(
    lora_run: nbtrain.Run, vision_work: Path
) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    report = nbtrain.evaluate(lora_run, compare_base=True, limit=8)
    assert report.models["tuned"]["loss"] < report.models["base"]["loss"] / 2, report.models
    result = nbtrain.export(lora_run, to=vision_work / "merged")
    merged = AutoModelForImageTextToText.from_pretrained(result.dir)
    assert type(merged).__name__ == "LlavaForConditionalGeneration"
    assert AutoProcessor.from_pretrained(result.dir).image_processor is not None


def test_qlora_trains_the_language_model_in_4_bit_and_leaves_the_encoder_whole(
    vision_work: Path, tiny_vlm: Path
) -> None:
    run = nbtrain.finetune(vision_config(tiny_vlm, vision_work, "qlora", steps=10), name="colours-4bit")
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    got = losses(run)
    assert got[-1] < got[0], got
    assert "base weights loaded in 4-bit" in run.logs(400)


def test_dpo_on_image_preference_pairs_prefers_the_right_colour(vision_work: Path, tiny_vlm: Path) -> None:
    pairs = write_image_dataset(vision_work / "pairs" / "pairs.jsonl", n=48, fmt="preference")
    run = nbtrain.finetune(
        f"""\
model: {tiny_vlm}
method: lora
objective: dpo
data: {{train: {pairs}}}
lora: {{r: 8, alpha: 16, dropout: 0.0}}
train: {{max_steps: 12, learning_rate: 1.0e-2, per_device_train_batch_size: 4, logging_steps: 4,
         gradient_checkpointing: false}}
""",
        name="colours-dpo",
    )
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    rows = [r for r in read_jsonl(run.paths.metrics) if "loss" in r]
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["rewards/accuracies"] > 0.5, rows


def test_preview_shows_each_rows_images_its_image_tokens_and_what_is_trained(
    vision_work: Path, tiny_vlm: Path
) -> None:
    p = nbtrain.preview(vision_config(tiny_vlm, vision_work), n=2, stats_rows=16)
    ex = p.examples[0]
    assert ex["image_tokens"] == 4 and len(ex["images"]) == 1 and ex["images"][0].startswith("data:image/png")
    assert ("[image: 4 tokens]", False) in [tuple(s) for s in ex["segments"]]
    trained = "".join(t for t, tr in ex["segments"] if tr)
    assert trained.strip().removesuffix("</s>") in COLOURS  # assistant_only_loss: the answer alone
    html = p._repr_html_()
    assert "<img src='data:image/png;base64," in html and "image · 4 tokens" in html


def test_a_second_family_idefics3_learns_from_image_rows_mixed_with_text_rows(
    vision_work: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import json

    from transformers import AutoModelForImageTextToText

    from nbtrain.examples.vision import make_tiny_vlm

    model = make_tiny_vlm(tmp_path_factory.mktemp("idefics3") / "tiny-idefics3", "idefics3")
    data = write_image_dataset(vision_work / "mixed" / "colours.jsonl", n=96)
    text_rows = [
        {"messages": [{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "hello"}]}
    ]
    with open(data, "a", encoding="utf-8") as f:  # every fifth row has no image
        f.writelines(json.dumps(r) + "\n" for r in text_rows * 24)
    config = vision_config(model, vision_work, steps=100).replace(
        str(vision_work / "data" / "colours.jsonl"), str(data)
    )
    prep = nbtrain.prepare(config)
    loaded = AutoModelForImageTextToText.from_pretrained(model)
    assert prep.plan.estimate["total_params"] == sum(p.numel() for p in loaded.parameters())
    assert prep.plan.estimate["inputs"]["seq_len"] == 512 + 4
    run = nbtrain.finetune(config, name="colours-idefics3")
    assert run.wait(timeout=600).state == "completed", run.logs(60)
    got = losses(run)
    assert got[-1] < got[0] / 2, got
    files = sorted((data.parent / "colours_img").glob("*.png"))[:8]
    replies = run.generate([QUESTION] * 8, images=files, max_new_tokens=3)
    assert sum(r.strip() == f.stem.split("-")[1] for r, f in zip(replies, files, strict=True)) >= 6, replies
    assert run.generate("Say hello", max_new_tokens=6)[0].strip() == "hello"


def test_finetune_cells_train_lora_and_qlora_on_image_rows_in_a_real_kernel(
    vision_work: Path, tiny_vlm: Path, tmp_path: Path
) -> None:
    from tests.notebook import execute, text_of

    data = write_image_dataset(tmp_path / "data" / "colours.jsonl", n=24)
    body = f"""model: {tiny_vlm}
data: {{train: {data}}}
train: {{max_steps: 4, per_device_train_batch_size: 4, gradient_checkpointing: false}}"""
    nb = execute(
        [
            "%load_ext nbtrain",
            f"%%finetune --name cell-lora\nmethod: lora\n{body}",
            f"%%finetune --name cell-qlora\nmethod: qlora\n{body}",
            "%finetune wait cell-lora\n%finetune wait cell-qlora",
            "import nbtrain\nprint([nbtrain.get_run(n).status().state for n in ('cell-lora', 'cell-qlora')])",
        ],
        tmp_path,
        timeout=600,
    )
    assert text_of(nb.cells[4]).strip() == "['completed', 'completed']", [text_of(c) for c in nb.cells]


def test_a_saved_dataset_with_an_image_feature_trains_as_a_hub_one_would(
    vision_work: Path, tiny_vlm: Path, tmp_path: Path
) -> None:
    import datasets
    from PIL import Image

    ask = [{"type": "image", "text": None}, {"type": "text", "text": QUESTION}]
    rows = [
        {"images": [Image.new("RGB", (28, 28), rgb)],
         "messages": [{"role": "user", "content": ask},
                      {"role": "assistant", "content": [{"type": "text", "text": c}]}]}
        for c, rgb in COLOURS.items()
    ] * 4  # fmt: skip
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image()))
    ds.save_to_disk(str(tmp_path / "colours-ds"))
    jsonl = f"{{train: {vision_work / 'data' / 'colours.jsonl'}, eval_split: 8}}"
    config = vision_config(tiny_vlm, vision_work, steps=2).replace(
        jsonl, f"{{train: {tmp_path / 'colours-ds'}}}"
    )
    prep = nbtrain.prepare(config, name="from-disk")
    assert prep.resolved.config.vision is not None and prep.resolved.train_data.images == 24
    run = nbtrain.start(prep)
    assert run.wait(timeout=600).state == "completed", run.logs(60)


def test_the_chat_widget_sends_an_attached_picture_and_the_model_names_its_colour(
    lora_run: nbtrain.Run, vision_work: Path
) -> None:
    import time

    from nbtrain.control.jobs.serve import data_uri
    from nbtrain.ui.chat import ChatWidget

    image = sorted((vision_work / "data" / "colours_img").glob("*-red.png"))[0]
    chat = ChatWidget(lora_run, max_tokens=3)
    try:
        deadline = time.monotonic() + 120
        while not chat.view.can_send:  # the server is up and the widget ready
            assert time.monotonic() < deadline and chat.error is None, chat.error
            time.sleep(0.05)
        assert chat.view.images  # a vision-language run's chat offers the Image button
        # what the browser does: the picture attached (a data: URI), then Enter

        def frontend(**data: Any) -> None:  # a message from the browser's side, as its comm delivers it
            chat.view._handle_msg({"content": {"data": data}, "buffers": []})

        frontend(method="update", state={"attached": data_uri(image)})
        frontend(method="custom", content={"type": "submit", "text": QUESTION, "image": chat.view.attached})
        while not chat.turns or chat.turns[-1].pending:
            assert time.monotonic() < deadline and chat.error is None, chat.error
            time.sleep(0.05)
        turn = chat.turns[-1]
        assert turn.images and turn.replies["tuned"].strip() == "red" and chat.view.attached == ""
        assert chat.view.turns[-1]["images"] == turn.images  # the transcript shows the picture
    finally:
        chat.close()


def test_vision_freeze_chooses_what_trains_beside_the_adapter_and_a_full_fine_tune_keeps_the_encoder(
    vision_work: Path, tiny_vlm: Path
) -> None:
    import re

    def trainable(freeze: str) -> int:
        config = vision_config(tiny_vlm, vision_work, steps=2) + f"vision: {{freeze: {freeze}}}\n"
        run = nbtrain.finetune(config, name=f"freeze-{freeze.replace('+', '-')}")
        assert run.wait(timeout=600).state == "completed", run.logs(60)
        return int(re.search(r"lora adapters: ([\d,]+) trainable", run.logs(400))[1].replace(",", ""))  # type: ignore[index]

    lora = 3_584  # q_proj + v_proj of the Llama's 2 layers
    projector, encoder = 6_272, 36_224  # the tiny LLaVA's (the estimate's exact counts)
    assert trainable("encoder+projector") == lora
    assert trainable("encoder") == lora + projector  # the projector trains fully (peft's modules_to_save)
    assert trainable("none") == lora + projector + encoder
    full = nbtrain.finetune(vision_config(tiny_vlm, vision_work, "full", steps=2).replace(
        "lora: {r: 8, alpha: 16, dropout: 0.0}\n", ""), name="full-vlm")  # fmt: skip
    assert full.wait(timeout=600).state == "completed", full.logs(60)
