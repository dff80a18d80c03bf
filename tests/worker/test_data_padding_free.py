"""SFT's padding-free batches (worker/data.PaddingFreeWhereCheaper): every decoder type nbtrain flattens
(PACKED_MODEL_TYPES) gives a flattened batch the loss it gives the same batch padded, and nbtrain's SFT
trainer steps through one with the same loss, gradients and token count."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.objectives import PACKED_MODEL_TYPES

torch = pytest.importorskip("torch")

TINY = {
    "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "pad_token_id": 0,
}  # fmt: skip
GPT2 = {"vocab_size": 300, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256}


def rows(n: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(3, 300) for _ in range(rng.randint(5, 40))]} for _ in range(n)]


def flattening(padded: Any, model: Any) -> Any:
    """nbtrain's collator with the cost rule told the weights dominate, so every batch is flattened."""
    from nbtrain.worker.data import PaddingFreeWhereCheaper

    collate = PaddingFreeWhereCheaper(padded, model, pad_token_id=0, pad_to_multiple_of=None)
    collate.facts["layer_params"] = 10**12
    return collate


@pytest.mark.parametrize("model_type", PACKED_MODEL_TYPES)
def test_a_flattened_batch_has_the_padded_batchs_loss(model_type: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    config = AutoConfig.for_model(model_type, **(GPT2 if model_type == "gpt2" else TINY))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    padded = DataCollatorForLanguageModeling(pad_token_id=0)
    batch = rows()
    flat = flattening(padded, model)(batch)
    assert "attention_mask" not in flat and flat["input_ids"].shape[0] == 1
    assert "cu_seq_lens_q" not in flat  # SDPA: only flash-attention reads the boundaries
    with torch.no_grad():
        want = model(**padded(batch), use_cache=False).loss
        got = model(**flat, use_cache=False).loss
    assert float(got) == pytest.approx(float(want), abs=1e-5)


def test_rows_laid_end_to_end_in_several_sequences_have_the_padded_loss_and_gradients() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from nbtrain.worker.data import PaddingFreeWhereCheaper

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **TINY))
    padded = DataCollatorForLanguageModeling(pad_token_id=0)
    rng = random.Random(1)
    batch = [
        {"input_ids": [rng.randrange(3, 300) for _ in range(n)]} for n in (20, 35, 52, 60, 44, 90, 71, 30)
    ]
    collate = PaddingFreeWhereCheaper(padded, model, pad_token_id=0, pad_to_multiple_of=None)
    collate.facts.update(layer_params=3_981_312, attention_width=576, heads=9, layers=30)  # SmolLM2's
    flat = collate(batch)
    assert flat["input_ids"].shape[0] == 2 and "attention_mask" not in flat  # two sequences of four rows
    assert int((flat["labels"] != -100).sum()) == sum(
        len(r["input_ids"]) - 1 for r in batch
    )  # each row's first

    def loss_and_grads(inputs: dict[str, Any]) -> tuple[float, list[Any]]:
        model.zero_grad()
        out = model(**inputs, use_cache=False)
        out.loss.backward()
        return float(out.loss), [p.grad.clone() for p in model.parameters()]

    want, want_grads = loss_and_grads(padded(batch))
    got, got_grads = loss_and_grads(flat)
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_the_sft_trainer_steps_through_a_flattened_batch_as_through_a_padded_one(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbtrain.worker.recipes.sft import padding_free, sft_trainer
    from tests.worker.test_sft_loss import step, trainer

    # rows of different lengths (the addition rows all tokenise to the same length)
    texts = [{"text": " ".join(["7 + 5 = 12"] * (1 + i % 5))} for i in range(16)]
    lean = trainer(sft_trainer(), tiny_model, tmp_path / "flat", texts)
    padding_free(lean, {"padding_free": True})
    assert lean.model.config.use_cache is False  # with a cache, transformers does not look for packed rows
    lean.data_collator.facts["layer_params"] = 10**12
    batch = next(iter(lean.get_train_dataloader()))
    assert "attention_mask" not in batch and "position_ids" in batch
    assert "laid end to end (padding-free)" in capsys.readouterr().out
    flat = step(lean)
    padded = step(trainer(sft_trainer(), tiny_model, tmp_path / "padded", texts))
    assert flat[0] == pytest.approx(padded[0], rel=1e-5)
    for a, b in zip(flat[2], padded[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert flat[1]["mean_token_accuracy"] == pytest.approx(padded[1]["mean_token_accuracy"])
    lean.state.num_input_tokens_seen = 0
    lean.args.include_num_input_tokens_seen = "non_padding"  # as nbtrain's plan sets it
    lean._track_num_input_tokens(batch)
    assert lean.state.num_input_tokens_seen == batch["input_ids"].numel()  # every position, none dropped


def test_the_collator_stays_padded_where_the_plan_or_trl_already_decided(
    tiny_model: Path, tmp_path: Path
) -> None:
    from nbtrain.worker.data import PaddingFreeWhereCheaper
    from nbtrain.worker.recipes.sft import padding_free, sft_trainer
    from tests.worker.test_sft_loss import trainer

    lean = trainer(sft_trainer(), tiny_model, tmp_path)
    padding_free(lean, {"padding_free": None})
    assert not isinstance(lean.data_collator, PaddingFreeWhereCheaper)
    lean.padding_free = True  # TRL flattens every batch itself (train: padding_free, BFD packing)
    padding_free(lean, {"padding_free": True})
    assert not isinstance(lean.data_collator, PaddingFreeWhereCheaper)
