"""Loading what a run trained (nbtrain.worker.tuned) from the shared tuned run (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.rundir import COMPLETE_MARKER
from nbtrain.worker.tuned import NoTrainedWeights, load_tuned, trained_weights_dir
from tests.conftest import TUNED_ANSWERS

pytestmark = pytest.mark.slow  # the shared tuned run is a real training process


def test_load_tuned_gives_the_runs_adapter_and_base_gives_the_plain_base_model(tuned_run: Path) -> None:
    import torch
    from peft import PeftModel

    model, tok = load_tuned(tuned_run)
    assert isinstance(model, PeftModel) and not model.training
    assert tok.chat_template and tok.pad_token_id is not None
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )  # fmt: skip
    with torch.no_grad():
        tuned = model(**ids).logits
        with model.disable_adapter():
            off = model(**ids).logits
    base, _ = load_tuned(tuned_run, base=True)
    assert not isinstance(base, PeftModel)
    with torch.no_grad():
        plain = base(**ids).logits
    assert torch.allclose(off, plain, atol=1e-5)  # the adapter switched off is exactly the base
    assert not torch.allclose(tuned, plain, atol=1e-3)  # and the adapter changes the answer


def answer_nll(model: Any, tok: Any, question: str, answer: str) -> float:
    """Mean negative log-likelihood of ``answer``'s tokens as the reply to ``question``."""
    import torch

    user = [{"role": "user", "content": question}]
    prompt = tok.apply_chat_template(user, add_generation_prompt=True, return_dict=True)["input_ids"]
    full = tok.apply_chat_template([*user, {"role": "assistant", "content": answer}], return_dict=True)
    ids = torch.tensor([full["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    targets = ids[0, 1:]
    picked = logp[torch.arange(len(targets)), targets][len(prompt) - 1 :]
    return float(-picked.mean())


def test_the_adapter_makes_the_trained_replies_more_likely_than_the_base_does(tuned_run: Path) -> None:
    model, tok = load_tuned(tuned_run)
    for q, a in TUNED_ANSWERS.items():
        tuned = answer_nll(model, tok, q, a)
        with model.disable_adapter():
            base = answer_nll(model, tok, q, a)
        assert tuned < base - 0.3, (q, tuned, base)


def test_a_run_without_output_loads_its_last_complete_checkpoint(tuned_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("output", "serve.json"))
    ckpts = sorted(run.glob("checkpoints/checkpoint-*"))
    assert ckpts and all((c / COMPLETE_MARKER).exists() for c in ckpts)
    newest = max(ckpts, key=lambda c: int(c.name.split("-")[1]))
    # a newer checkpoint the worker never marked complete is not trusted
    unfinished = newest.with_name("checkpoint-999")
    shutil.copytree(newest, unfinished, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
    assert trained_weights_dir(run) == newest
    assert trained_weights_dir(tuned_run) == tuned_run / "output"
    model, _ = load_tuned(run, dtype="bf16")
    assert next(model.base_model.parameters()).dtype.__repr__() == "torch.bfloat16"


def test_a_run_with_no_weights_names_the_fix(tuned_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("output", "checkpoints", "serve.json"))
    with pytest.raises(NoTrainedWeights, match=r"no trained weights yet.*%finetune checkpoint"):
        load_tuned(run)
    with pytest.raises(ValueError, match="dtype 'f8' is not one of"):
        load_tuned(tuned_run, dtype="f8")
