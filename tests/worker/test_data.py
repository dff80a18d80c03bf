"""The worker's data loading (several sources mixed, streaming, row-numbered errors) and what the SFT
trainer really trains on: the labels of the collated batch, with assistant_only_loss and packing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.examples import variable_length_rows
from nbtrain.worker.data import DataError, is_streaming, load_train, take_eval_split


def resolved(text: str) -> dict[str, Any]:
    """resolved.json as the worker reads it (through JSON, as it is written to the run directory)."""
    return json.loads(json.dumps(nbtrain.prepare(text).to_dict()))


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def two_sources(workdir: Path) -> Path:
    """add.jsonl (messages) and other.jsonl (alpaca, answers starting with 'B:'), told apart by content."""
    write_rows(
        workdir / "data" / "other.jsonl",
        [{"instruction": f"Say {i}", "output": f"B: {i}"} for i in range(60)],
    )
    return workdir


MIXED = """\
model: ./tiny-llama
data:
  train:
    - {path: data/add.jsonl, weight: 3}
    - {path: data/other.jsonl, weight: 1}
  stopping_strategy: first_exhausted
  streaming: %s
train: {max_steps: 5}
"""


def answers(rows: Any) -> list[str]:
    return [r["messages"][-1]["content"] for r in rows]


def test_weighted_sources_interleave_in_proportion_and_in_a_seeded_order(two_sources: Path) -> None:
    r = resolved(MIXED % "false")
    ds, fmt, described = load_train(r["config"], r["data"], "sft", seed=0)
    assert fmt == "messages" and described == [
        "data/add.jsonl (messages, weight 3)",
        "data/other.jsonl (alpaca, weight 1)",
    ]
    got = answers(ds)
    from_b = sum(a.startswith("B:") for a in got)
    # first_exhausted: it stops when the 60 rows of other.jsonl run out, after ~180 of add.jsonl's
    assert from_b == 60 and 0.18 < from_b / len(got) < 0.33, (from_b, len(got))
    again, _, _ = load_train(r["config"], r["data"], "sft", seed=0)
    assert answers(again) == got
    other, _, _ = load_train(r["config"], r["data"], "sft", seed=1)
    assert answers(other) != got


def test_unweighted_sources_are_concatenated(two_sources: Path) -> None:
    r = resolved(MIXED.replace(", weight: 3", "").replace(", weight: 1", "") % "false")
    ds, _, _ = load_train(r["config"], r["data"], "sft", seed=0)
    got = answers(ds)
    assert len(got) == 460 and all(a.startswith("B:") for a in got[400:]) and not got[0].startswith("B:")


def test_streaming_mixes_lazily_and_holds_out_the_first_rows_for_eval(two_sources: Path) -> None:
    r = resolved(MIXED % "true")
    ds, fmt, _ = load_train(r["config"], r["data"], "sft", seed=0)
    assert is_streaming(ds) and fmt == "messages"
    eager, _, _ = load_train(
        {**r["config"], "data": {**r["config"]["data"], "streaming": False}}, r["data"], "sft", 0
    )
    first = answers(ds.take(40))
    assert len(first) == 40 and Counter(a.startswith("B:") for a in first)[True] > 0
    train, evald = take_eval_split(ds, 8, seed=0)
    assert is_streaming(evald) and answers(evald) == first[:8]
    assert answers(train.take(4)) == first[8:12]
    with pytest.raises(DataError, match="number of rows"):
        take_eval_split(ds, 0.1, seed=0)
    assert len(answers(eager)) > 40


def test_a_bad_row_deep_in_a_stream_is_named_by_its_row_and_source(two_sources: Path) -> None:
    r = resolved(MIXED % "true")
    rows = [{"instruction": f"Say {i}", "output": f"B: {i}"} for i in range(30)]
    del rows[24]["output"]  # row 25: the kernel samples the file too, so break it after resolving
    write_rows(two_sources / "data" / "other.jsonl", rows)
    ds, _, _ = load_train(r["config"], r["data"], "sft", seed=0)
    with pytest.raises(DataError) as ei:
        list(ds)
    assert "row 25 of data/other.jsonl" in str(ei.value) and "field 'output' is missing" in str(ei.value)


# ------------------------------------------------------------------ what the trainer trains on (TRL)


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    d = tmp_path_factory.mktemp("var")
    (d / "tiny-llama").symlink_to(tiny_model)
    write_rows(d / "data" / "var.jsonl", variable_length_rows(64, seed=3))
    return d


def sft_trainer(d: Path, monkeypatch: pytest.MonkeyPatch, train: str) -> Any:
    """A real SFTTrainer built from nbtrain's resolved config and data loading (no training)."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from nbtrain.worker.model import load_tokenizer

    monkeypatch.chdir(d)
    r = resolved(f"model: ./tiny-llama\nmethod: full\ndata:\n  train: data/var.jsonl\ntrain:\n{train}")
    tok = load_tokenizer(r["config"])
    ds, _, _ = load_train(r["config"], r["data"], "sft", seed=0)
    args = SFTConfig(output_dir=str(d / "out"), **r["train_args"])
    model = AutoModelForCausalLM.from_pretrained(r["config"]["model"])
    return SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok), r


ONLY_ANSWERS = (
    "  max_steps: 2\n  per_device_train_batch_size: 8\n  assistant_only_loss: true\n  max_length: 512\n"
)


def test_assistant_only_loss_trains_on_the_answers_and_the_preview_shows_the_same_mask(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.worker.jobs.preview import preview

    trainer, r = sft_trainer(var_dir, monkeypatch, ONLY_ANSWERS)
    tok = trainer.processing_class
    rows = [json.loads(x) for x in (var_dir / "data" / "var.jsonl").read_text().splitlines()[:8]]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    ids, labels = batch["input_ids"], batch["labels"]
    for i, row in enumerate(rows):
        trained = ids[i][labels[i] != -100].tolist()
        assert tok.decode(trained) == row["messages"][1]["content"] + "<|end|>"
        prompt = tok.apply_chat_template(row["messages"][:1], tokenize=False)
        assert row["messages"][0]["content"] in prompt
        first_trained = int((labels[i] != -100).nonzero()[0])
        assert tok.decode(ids[i][:first_trained]) == prompt + "<|assistant|>\n"  # every prompt token masked

    shown = preview(r, n=8, stats_rows=64)
    for i, ex in enumerate(shown["examples"]):
        seq = [x for x in ids[i].tolist() if x != tok.pad_token_id]
        assert "".join(t for t, _ in ex["segments"]) == tok.decode(seq)
        assert "".join(t for t, on in ex["segments"] if on) == tok.decode(ids[i][labels[i] != -100])
        assert ex["trained"] == int((labels[i] != -100).sum())
    lengths = [len(trainer.train_dataset[i]["input_ids"]) for i in range(64)]
    assert shown["lengths"] == lengths and shown["stats"]["max"] == max(lengths)


def test_packing_removes_the_padding_and_keeps_the_answer_only_mask(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, _ = sft_trainer(var_dir, monkeypatch, ONLY_ANSWERS)
    packed, _ = sft_trainer(var_dir, monkeypatch, ONLY_ANSWERS.replace("512", "256") + "  packing: true\n")
    real = sum(len(plain.train_dataset[i]["input_ids"]) for i in range(len(plain.train_dataset)))

    def padding(trainer: Any) -> tuple[int, int]:
        pads = tokens = 0
        for batch in trainer.get_train_dataloader():
            mask = batch.get("attention_mask")
            n = batch["input_ids"].numel()
            tokens += n
            pads += 0 if mask is None else int((mask == 0).sum())
        return pads, tokens

    pads_plain, tokens_plain = padding(plain)
    pads_packed, tokens_packed = padding(packed)
    assert tokens_plain == real + pads_plain and pads_plain > 0.3 * real  # variable lengths: much padding
    assert pads_packed == 0 and tokens_packed == real  # padding-free: every row once, nothing added
    assert len(packed.train_dataset) < len(plain.train_dataset) / 3  # several rows per packed sequence
    batch = next(iter(packed.get_train_dataloader()))
    assert "attention_mask" not in batch and "position_ids" in batch
    trained = batch["labels"] != -100
    assert 0 < int(trained.sum()) < batch["input_ids"].numel() / 2  # the prompts stay masked when packed


def test_an_image_row_names_its_row_when_the_image_is_missing_corrupt_or_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import http.server
    import threading

    from PIL import Image

    from nbtrain.worker.data import DataError, image_entry

    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "ok.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    assert image_entry("ok.png", str(tmp_path), "row 1") == {"path": str(tmp_path / "ok.png"), "bytes": None}
    with pytest.raises(DataError, match=r"row 2: the image missing.png is not there"):
        image_entry("missing.png", str(tmp_path), "row 2")
    with pytest.raises(DataError, match=r"row 3: the image bad.png is not a readable image"):
        image_entry("bad.png", str(tmp_path), "row 3")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", "127.0.0.1")  # the test's server, on loopback: trusted here
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        fetched = image_entry(f"{url}/ok.png", None, "row 4")
        assert fetched["path"] is None and fetched["bytes"] == (tmp_path / "ok.png").read_bytes()
        with pytest.raises(DataError, match=r"row 5: the image .*/nope.png could not be fetched"):
            image_entry(f"{url}/nope.png", None, "row 5")
    finally:
        server.shutdown()
