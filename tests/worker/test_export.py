"""The export worker (nbtrain.worker.jobs.export), run in this process on the shared trained runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from nbtrain.worker.jobs import export as worker
from nbtrain.worker.tuned import load_tuned, trained_weights_dir
from tests.conftest import TUNED_ANSWERS

pytestmark = pytest.mark.slow


def greedy(model: Any, tok: Any, n: int = 10) -> list[list[int]]:
    """Greedy continuations of the trained questions (token ids, prompt included)."""
    import torch

    out = []
    for q in TUNED_ANSWERS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)  # fmt: skip
        with torch.no_grad():
            out.append(model.generate(**ids, max_new_tokens=n, do_sample=False)[0].tolist())
    return out


def logits(model: Any, tok: Any) -> Any:
    import torch

    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)  # fmt: skip
    with torch.no_grad():
        return model(**ids).logits


def test_qlora_merge_goes_into_the_dequantised_base_and_reloads_as_a_plain_model(
    qlora_run: Path, tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    target = tmp_path / "merged"
    assert worker.main([str(qlora_run), "--to", str(target), "--dtype", "fp32"]) == 0
    names = {p.name for p in target.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "nbtrain_export.json"} <= names  # fmt: skip
    assert not any(n.startswith("adapter") for n in names)
    record = json.loads((target / "nbtrain_export.json").read_text())
    assert record["kind"] == "merged" and record["method"] == "qlora" and record["dtype"] == "float32"
    assert record["merged_into"] == "the de-quantised training base" and record["step"] == 30
    assert not list(tmp_path.glob(".merged.partial-*"))

    merged = AutoModelForCausalLM.from_pretrained(target)
    cfg = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in cfg  # a plain model: no bitsandbytes needed to load it
    assert all(
        type(m).__module__.startswith("torch.nn") for m in merged.modules() if "Linear" in type(m).__name__
    )

    # The reference: the 4-bit base as trained, de-quantised to fp32, with the adapter on top (unmerged).
    base, tok = load_tuned(qlora_run, base=True)
    reference = PeftModel.from_pretrained(
        base.dequantize().to(torch.float32), str(trained_weights_dir(qlora_run))
    )
    assert torch.allclose(logits(merged, tok), logits(reference, tok), atol=1e-4)
    assert greedy(merged, tok) == greedy(reference, tok)


def test_bf16_merge_saves_bf16_weights_that_answer_like_base_plus_adapter(
    tuned_run: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    target = tmp_path / "bf16"
    assert worker.main([str(tuned_run), "--to", str(target), "--dtype", "bf16"]) == 0
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 - not a dict
    merged = AutoModelForCausalLM.from_pretrained(target)
    tuned, tok = load_tuned(tuned_run, dtype="bf16")
    got, want = logits(merged, tok).float(), logits(tuned, tok).float()
    with tuned.disable_adapter():
        base = logits(tuned, tok).float()
    # bf16 rounds W + BA once instead of W and BA apart: close to base + adapter, far from the base.
    assert (got - want).abs().max() < 0.1 * (want - base).abs().max()


def test_adapter_only_export_copies_the_adapter_and_loads_with_peft(tuned_run: Path, tmp_path: Path) -> None:
    import torch
    from peft import AutoPeftModelForCausalLM

    target = tmp_path / "adapter"
    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge"]) == 0
    names = {p.name for p in target.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert "model.safetensors" not in names
    assert json.loads((target / "nbtrain_export.json").read_text())["kind"] == "adapter"
    loaded = AutoPeftModelForCausalLM.from_pretrained(target)
    tuned, tok = load_tuned(tuned_run)
    assert torch.allclose(logits(loaded, tok), logits(tuned, tok), atol=1e-5)


def test_overwrite_replaces_an_earlier_export_and_a_failed_export_leaves_the_target_as_it_was(
    tuned_run: Path, tmp_path: Path
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    result = tmp_path / "result.json"
    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge", "--result", str(result)]) == 2
    assert "not empty" in json.loads(result.read_text())["error"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]

    # Overwrite replaces only what an earlier export wrote: the user's file stays, and so does the folder.
    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge", "--overwrite", "--result",
                        str(result)]) == 2  # fmt: skip
    assert "nothing was deleted" in json.loads(result.read_text())["error"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (target / "keep.txt").unlink()
    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge"]) == 0
    exported = {p.name: p.read_bytes() for p in target.iterdir()}

    # A run without trained weights fails inside the worker: the earlier export is untouched, no partial dir.
    empty = tmp_path / "runs" / "run-without-weights"
    shutil.copytree(tuned_run, empty, ignore=shutil.ignore_patterns("output", "checkpoints"))
    assert worker.main([str(empty), "--to", str(target), "--overwrite", "--result", str(result)]) == 1
    assert "no trained weights" in json.loads(result.read_text())["error"]
    assert {p.name: p.read_bytes() for p in target.iterdir()} == exported
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge", "--overwrite"]) == 0
    assert (target / "adapter_model.safetensors").exists()


def test_leftovers_of_killed_exports_are_cleared_and_a_target_moved_aside_is_put_back(
    tuned_run: Path, tmp_path: Path
) -> None:
    dead = 2**22 + 12345  # above pid_max's default: no such process
    target = tmp_path / "out"
    partial = tmp_path / f".out.partial-{dead}"  # killed while writing
    (partial / "sub").mkdir(parents=True)
    old = tmp_path / f".out.old-{dead}"  # killed between moving the old target aside and the rename
    old.mkdir()
    (old / "keep.txt").write_text("mine")
    mine = tmp_path / f".out.partial-{os.getpid()}"  # a live export's: not touched
    mine.mkdir()
    result = tmp_path / "result.json"
    assert worker.main([str(tuned_run), "--to", str(target), "--no-merge", "--result", str(result)]) == 2
    assert "not empty" in json.loads(result.read_text())["error"]  # the old target is back, and kept
    assert (target / "keep.txt").read_text() == "mine"
    assert not partial.exists() and not old.exists() and mine.exists()
