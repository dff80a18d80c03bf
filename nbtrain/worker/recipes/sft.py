"""Supervised fine-tuning (full, LoRA, QLoRA) on TRL's SFTTrainer.

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: sft (or none: older
                                            # runs) and method: full | lora | qlora

setup() seeds, builds the SFTConfig from ``train:``, joins the process group, loads tokenizer, data and
model (with a freshly initialised LoRA adapter for lora/qlora) as resolved.json says, and builds the
trainer; train() runs it with the run-directory callback, resuming from the checkpoint resolved.json
names, and saves the result to RUN_DIR/output (complete or absent); cleanup() closes the metric files.

The trainer is SFTTrainer with one change, measured (bench/bench_llamafactory.py, bench/bench_real.py):
when a batch's full logits are small enough (contract/objectives.sft_full_logits: on a CPU up to 1 GiB,
elsewhere 64 MiB; the memory estimate counts the same rule), the loss is the
model's own (the Trainer's compute_loss) and the entropy / token-accuracy metrics come from those logits,
instead of TRL's chunked LM-head kernel, which on a CPU scores every position through a custom autograd
function and costs ~3 ms a step more on the tiny model (12 vs 9 ms) and ~10% of a SmolLM2-135M step.
Bigger batches (the kernel's reason to exist: it never builds the logits) and everything TRL's own
path handles specially (a notebook loss, label smoothing, DFT, MoE aux loss, sequence/context
parallelism) keep TRL's path. In training, a causal text decoder (PACKED_MODEL_TYPES) runs its LM head
only at the positions that have a label (labelled_positions_loss): a prompt's and padding's logits are
never built. The loss and gradients are the model's own (tests/worker/test_sft_loss.py); on SmolLM2-135M,
where the head is a fifth of a token's work, it is what puts nbtrain ahead of a bare PyTorch + peft loop
on the same job (bench/bench_real.py).
"""

from __future__ import annotations

import functools
from typing import Any

from nbtrain.contract.objectives import PACKED_MODEL_TYPES, sft_full_logits
from nbtrain.worker.masks import own_masks, tools_template_problem, with_assistant_masks
from nbtrain.worker.model import load_model, loraplus_optimizer, save_initial_adapter
from nbtrain.worker.recipes.common import Recipe


class SFTRecipe(Recipe):
    def setup(self) -> None:
        from trl import SFTConfig

        run = self.run
        ready = self.prepare(SFTConfig)
        if ready is None:
            return  # a stop came during setup: train() records it
        train_cfg = run.cfg.get("train") or {}
        why = own_masks(ready.args.assistant_only_loss, train_cfg, ready.tokenizer, ready.train)
        if why:
            # a template without {% generation %} blocks that TRL does not know, or rows with per-message
            # loss flags: the masks come from the template's own rendering (worker/masks.py), and TRL builds
            # the labels from them
            ready.train = with_assistant_masks(ready.train, ready.tokenizer)
            ready.eval = with_assistant_masks(ready.eval, ready.tokenizer)
            ready.args.assistant_only_loss = False
            print(f"nbtrain: {why}", flush=True)
        model = load_model(run.cfg, run.plan, run.args)  # wrapped in its LoRA adapter for lora/qlora
        save_initial_adapter(model, run.cfg, run.paths.root)  # PiSSA/OLoRA: kept to convert the result
        optimizer = loraplus_optimizer(model, run.cfg, ready.args)
        self.make_trainer(
            sft_trainer(), model, ready, **({"optimizers": (optimizer, None)} if optimizer else {})
        )
        why = tools_template_problem(self.trainer.processing_class, ready.train)  # its template now: TRL's
        if why:
            raise ValueError(why)
        padding_free(self.trainer, run.plan)


def padding_free(trainer: Any, plan: dict[str, Any]) -> None:
    """The plan's padding-free batches (plan: padding_free, planner._plan_padding_free): TRL's padded
    collator wrapped so each batch is laid end to end where that is cheaper (worker/data.py). Left as it
    is where TRL already flattens (train: padding_free, BFD packing) or the collator is not TRL's text one
    (a notebook's own, a vision run's)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from nbtrain.worker.data import PaddingFreeWhereCheaper

    collator = trainer.data_collator
    if not plan.get("padding_free") or trainer.padding_free:
        return
    if type(collator) is not DataCollatorForLanguageModeling:
        return
    trainer.model.config.use_cache = False  # with a cache, transformers does not look for packed rows
    trainer.data_collator = PaddingFreeWhereCheaper(
        collator, trainer.model, collator.pad_token_id, collator.pad_to_multiple_of
    )


MASK_FREE_KEYS = frozenset({"input_ids", "attention_mask", "labels", "use_cache"})


def without_right_padding_mask(inputs: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The batch as the model gets it: without its attention mask where the mask says only that the
    rows are padded at the end, for a causal text decoder (PACKED_MODEL_TYPES: positions from 0 whatever
    the mask). A real token then attends to the tokens before it only, as the mask would have it, and the
    padding after it is never seen; the padding's own outputs have no labels. The loss and gradients are
    the same (tests/worker/test_sft_loss.py), and SDPA takes its causal kernel instead of a masked one:
    measured on SmolLM2-135M (8 rows of 51-53 tokens, 2 cores), ~40 ms of a ~1 s forward. Anything else
    in the batch (position_ids, images, left padding) keeps the mask."""
    mask = inputs.get("attention_mask")
    if (
        mask is None
        or model_type not in PACKED_MODEL_TYPES
        or not MASK_FREE_KEYS.issuperset(inputs)
        or mask.dim() != 2
        or not bool((mask[:, 1:] <= mask[:, :-1]).all())
    ):
        return inputs
    return {k: v for k, v in inputs.items() if k != "attention_mask"}


ENTROPY_ROWS = 16  # positions a chunk: its probabilities stay in the CPU's cache
LOGP_ROWS = 8  # the same, from log-probabilities (measured: 8 rows 22 ms, 16 29 ms, 32 39 ms)


def _entropy(logits: Any) -> Any:
    """The entropy of each position's next-token distribution (TRL's metric), chunk by chunk: logsumexp
    minus the probability-weighted logits. Measured (416 positions x 49,152 words, 2 cores): 35-48 ms
    against 105 ms for log_softmax over the whole batch, then exp, multiply and sum."""
    import torch

    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    rows = ENTROPY_ROWS if flat.device.type == "cpu" else max(1, flat.shape[0])  # one pass on an accelerator
    for i in range(0, flat.shape[0], rows):
        chunk = flat[i : i + rows].float()
        out[i : i + rows] = torch.logsumexp(chunk, -1) - (torch.softmax(chunk, -1) * chunk).sum(-1)
    return out.reshape(logits.shape[:-1])


def labelled_positions_loss(
    model: Any, inputs: dict[str, Any], num_items_in_batch: Any
) -> tuple[Any, Any, Any]:
    """A causal decoder's loss with its LM head run only at the positions that have a label (transformers'
    boolean ``logits_to_keep``: the hidden states there, flattened), not at the prompt and padding whose
    logits the loss throws away. Returns the loss as the model's own ForCausalLMLoss gives it (a sum over
    the labels divided by ``num_items_in_batch``, or their mean without it), the kept positions' log
    probabilities (labels x vocabulary: the loss's own log-softmax, which the metrics read too) and their
    target tokens. On SmolLM2-135M the head is a fifth of each token's work."""
    import torch.nn.functional as F

    labels = inputs["labels"]
    targets_at = labels[:, 1:] != -100  # position t predicts token t + 1
    keep = torch_pad_last(targets_at)
    batch = {k: v for k, v in inputs.items() if k != "labels"}
    logits = model(**batch, logits_to_keep=keep).logits
    targets = labels[:, 1:][targets_at].to(logits.device)
    # cross_entropy is log_softmax then nll_loss: the same loss and gradients, with the log-probabilities
    # kept for the metrics
    logp = logits.float().log_softmax(-1)
    if num_items_in_batch is None:
        loss = F.nll_loss(logp, targets)
    else:
        items = (
            num_items_in_batch.to(logp.device) if hasattr(num_items_in_batch, "to") else num_items_in_batch
        )
        loss = F.nll_loss(logp, targets, reduction="sum") / items
    return loss, logp, targets


def entropy_and_argmax(logp: Any) -> tuple[Any, Any]:
    """Each row's entropy and most likely token from its log-probabilities (rows x vocabulary), a few rows
    at a time so each chunk is read once while it sits in the CPU's cache. Measured (416 positions x 49,152
    words, 2 cores): 22 ms, against 79 ms for the entropy from the logits then their argmax."""
    import torch

    out = torch.empty(logp.shape[0], dtype=torch.float32, device=logp.device)
    top = torch.empty(logp.shape[0], dtype=torch.long, device=logp.device)
    rows = LOGP_ROWS if logp.device.type == "cpu" else max(1, logp.shape[0])
    for i in range(0, logp.shape[0], rows):
        chunk = logp[i : i + rows]
        out[i : i + rows] = -(chunk.exp() * chunk).sum(-1)
        top[i : i + rows] = chunk.argmax(-1)
    return out, top


def torch_pad_last(mask: Any) -> Any:
    """A (rows, positions - 1) mask with a False column appended: the last position predicts nothing."""
    import torch

    return torch.cat([mask, mask.new_zeros(mask.shape[0], 1)], dim=1)


@functools.cache
def sft_trainer() -> type:
    """SFTTrainer whose compute_loss takes the model's own loss when the logits are small (module doc)."""
    import torch
    from transformers import Trainer
    from trl import SFTTrainer

    class LeanSFTTrainer(SFTTrainer):
        def _plain_loss(self, inputs: dict[str, Any]) -> bool:
            pc = getattr(self.accelerator, "parallelism_config", None)
            args: Any = self.args
            model: Any = self.model
            ids = inputs.get("input_ids")
            if (
                self.compute_loss_func is not None
                or self.label_smoother is not None
                or args.loss_type != "nll"
                or self.aux_loss_enabled
                or (pc is not None and (pc.sp_enabled or pc.cp_enabled))
                or "shift_labels" in inputs
                or "labels" not in inputs
                or ids is None
            ):
                return False
            vocab = model.config.get_text_config().vocab_size  # (ZeRO-3 weights are empty here)
            return sft_full_logits(ids.numel(), vocab, ids.device.type)

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if not self._plain_loss(inputs):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mode = "train" if getattr(self.model, "training", False) else "eval"
            inputs["use_cache"] = False
            batch = without_right_padding_mask(inputs, self._model_type())
            args: Any = self.args
            if (
                mode == "train"
                and not return_outputs
                and self._model_type() in PACKED_MODEL_TYPES
                and args.n_gpu <= 1  # (not torch's DataParallel)
            ):
                # the LM head only where a label is (module doc): the same loss and gradients
                items = num_items_in_batch if self.model_accepts_loss_kwargs else None
                loss, logp, targets = labelled_positions_loss(model, batch, items)
                if (
                    args.average_tokens_across_devices and items is not None
                ):  # as Trainer.compute_loss scales its own
                    loss = loss * (self.accelerator.num_processes // self.get_tp_size())
                outputs = None
            else:
                loss, outputs = Trainer.compute_loss(
                    self, model, batch, return_outputs=True, num_items_in_batch=num_items_in_batch
                )
                # every position of the (contiguous) logits, the last dropped after: slicing the logits first
                # would copy them all (~37 ms of a 2 s SmolLM2 step on 2 cores)
                keep = inputs["labels"][:, 1:] != -100
                targets = inputs["labels"][:, 1:][keep]
                logits = outputs.logits
            with torch.no_grad():  # TRL's metrics, from the logits the loss already built
                if outputs is None:
                    entropy, predicted = entropy_and_argmax(logp.detach())
                else:
                    entropy = _entropy(logits)[:, :-1][keep]
                    predicted = logits.argmax(-1)[:, :-1][keep]
                sums = torch.stack(
                    [
                        torch.tensor(targets.numel(), device=targets.device),
                        entropy.sum(),
                        (predicted == targets).sum(),
                        inputs["attention_mask"].sum()
                        if "attention_mask" in inputs
                        else torch.tensor(inputs["input_ids"].numel(), device=targets.device),
                    ]
                ).double()
                if self.accelerator.num_processes > 1:  # one collective for the four numbers
                    sums = self.accelerator.gather(sums[None]).sum(0)
                valid, entropy_sum, correct, tokens = sums.tolist()
            self._metrics[mode]["entropy"].append(entropy_sum / valid if valid else 0.0)
            self._metrics[mode]["mean_token_accuracy"].append(correct / valid if valid else 0.0)
            if mode == "train":
                self._total_train_tokens += int(tokens) // self._tp_size
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return (loss, outputs) if return_outputs else loss

        def _model_type(self) -> str:
            model: Any = self.model
            return str(getattr(model.config, "model_type", ""))

        def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
            """A padding-free batch (position_ids, no attention mask) has no padding to leave out, and its
            rows' own end-of-turn tokens may be the pad token, which the Trainer's non-padding count would
            drop: every position is counted."""
            args: Any = self.args
            flat = "attention_mask" not in inputs and "position_ids" in inputs and "input_ids" in inputs
            if args.include_num_input_tokens_seen == "non_padding" and flat:
                n = torch.as_tensor(inputs["input_ids"].numel(), device=args.device, dtype=torch.int64)
                self.state.num_input_tokens_seen += int(self.accelerator.gather(n).sum().item())
                return
            super()._track_num_input_tokens(inputs)

    return LeanSFTTrainer
