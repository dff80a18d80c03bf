"""nbtrain's SFT trainer takes the model's own loss when the logits are small (faster on a CPU than
TRL's chunked LM head) and must give the same loss, gradients and metrics as TRL's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.objectives import PACKED_MODEL_TYPES

torch = pytest.importorskip("torch")


def trainer(cls: type, tiny_model: Path, tmp_path: Path, rows: list[dict[str, Any]] | None = None) -> Any:
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from nbtrain.examples import dataset_rows

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=4, task_type="CAUSAL_LM")
    )
    data = Dataset.from_list(rows or dataset_rows(n=16))
    args = SFTConfig(
        output_dir=str(tmp_path / cls.__name__),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        gradient_accumulation_steps=2,  # the Trainer's loss scaling for accumulation is part of the step
    )
    return cls(
        model=model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(tiny_model)
    )


def step(tr: Any) -> tuple[float, dict[str, float], list[Any]]:
    """Loss, metrics and LoRA gradients of one batch of 8 through tr.training_step (as the Trainer runs it:
    forward, scaling for gradient accumulation, backward)."""
    tr.model.train()
    batch = tr._prepare_inputs(next(iter(tr.get_train_dataloader())))
    n = int((batch["labels"][:, 1:] != -100).sum())
    loss = tr.training_step(tr.model, batch, num_items_in_batch=torch.tensor(2 * n))
    grads = [p.grad.clone() for p in tr.model.parameters() if p.requires_grad]
    return float(loss.detach()), {k: v[-1] for k, v in tr._metrics["train"].items()}, grads


def test_plain_loss_path_matches_trl_loss_gradients_and_metrics(tiny_model: Path, tmp_path: Path) -> None:
    from trl import SFTTrainer

    from nbtrain.examples import dataset_rows
    from nbtrain.worker.recipes.sft import sft_trainer

    rows = dataset_rows(n=16)
    for i, row in enumerate(rows):  # rows of different lengths: padded batches
        row["messages"][0]["content"] += " please" * (i % 4)
    lean = trainer(sft_trainer(), tiny_model, tmp_path, rows)
    batch = next(iter(lean.get_train_dataloader()))
    assert lean._plain_loss(batch)
    assert not bool(batch["attention_mask"].all())  # padded rows: the model gets them without the mask
    ours, trls = step(lean), step(trainer(SFTTrainer, tiny_model, tmp_path, rows))
    assert ours[0] == pytest.approx(trls[0], rel=1e-5)
    assert ours[1] == pytest.approx(trls[1], rel=1e-4)
    assert set(ours[1]) == {"entropy", "mean_token_accuracy", "num_tokens"}
    for a, b in zip(ours[2], trls[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_big_logits_keep_trls_chunked_head(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.contract import objectives
    from nbtrain.worker.recipes import sft

    lean = trainer(sft.sft_trainer(), tiny_model, tmp_path)
    batch = next(iter(lean.get_train_dataloader()))
    full = batch["input_ids"].numel() * lean.model.config.vocab_size * 4
    monkeypatch.setattr(objectives, "SFT_FULL_LOGITS_BYTES", {"cpu": full - 1})
    assert not lean._plain_loss(batch)
    loss, metrics, _ = step(lean)  # TRL's own path still trains and logs
    assert loss > 0 and 0 <= metrics["mean_token_accuracy"] <= 1


def test_only_a_causal_decoders_right_padding_mask_is_left_out() -> None:
    from nbtrain.worker.recipes.sft import without_right_padding_mask

    right = {"input_ids": torch.ones(2, 3), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    assert "attention_mask" not in without_right_padding_mask(right, "llama")
    left = {**right, "attention_mask": torch.tensor([[1, 1, 1], [0, 1, 1]])}
    holed = {**right, "attention_mask": torch.tensor([[1, 0, 1], [1, 1, 1]])}
    positions = {**right, "position_ids": torch.zeros(2, 3)}
    for kept, model_type in ((left, "llama"), (holed, "llama"), (positions, "llama"), (right, "qwen2_vl")):
        assert without_right_padding_mask(kept, model_type) is kept


@pytest.mark.parametrize("model_type", PACKED_MODEL_TYPES)
def test_the_head_at_labelled_positions_only_gives_the_models_own_loss_and_gradients(model_type: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from nbtrain.worker.recipes.sft import labelled_positions_loss

    tiny = {
        "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "pad_token_id": 0,
    }  # fmt: skip
    gpt2 = {"vocab_size": 300, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}
    config = AutoConfig.for_model(model_type, **(gpt2 if model_type == "gpt2" else tiny))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()  # (no dropout: both forwards see the same)
    ids = torch.randint(3, 300, (3, 12))
    labels = ids.clone()
    labels[0, :5] = labels[1, :8] = labels[2, 10:] = -100  # prompts and padding: no label
    batch = {"input_ids": ids, "attention_mask": (labels[:, :] != -100) | (torch.arange(12) < 10)}

    def grads() -> list[Any]:
        out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        return out

    for items in (None, torch.tensor(30)):  # a mean, or a sum over an accumulated batch's 30 labels
        kwargs = {} if items is None else {"num_items_in_batch": items}
        want = model(**batch, labels=labels, use_cache=False, **kwargs).loss
        want.backward()
        want_grads = grads()
        got, logp, targets = labelled_positions_loss(model, {**batch, "labels": labels}, items)
        got.backward()
        assert logp.shape == (int((labels[:, 1:] != -100).sum()), 300)  # only where a label is
        torch.testing.assert_close(logp.exp().sum(-1), torch.ones(len(logp)))  # log-probabilities
        assert targets.tolist() == labels[:, 1:][labels[:, 1:] != -100].tolist()
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
        for a, b in zip(grads(), want_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_entropy_and_argmax_from_log_probabilities_match_the_logits() -> None:
    from nbtrain.worker.recipes.sft import _entropy, entropy_and_argmax

    torch.manual_seed(0)
    logits = torch.randn(37, 1000) * 3  # not a whole number of chunks
    entropy, top = entropy_and_argmax(logits.log_softmax(-1))
    torch.testing.assert_close(entropy, _entropy(logits), rtol=1e-5, atol=1e-5)
    assert top.tolist() == logits.argmax(-1).tolist()
