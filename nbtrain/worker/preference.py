"""Preference recipes: DPO, ORPO and KTO on TRL's trainers, with any method (full, LoRA, QLoRA).

    objective: dpo | orpo | kto        # in config.yaml; data rows {prompt, chosen, rejected} or, for
                                       # KTO, {prompt, completion, label}

Everything but the data and the trainer is the SFT recipe's: the run-directory callback (so the
trainers' own metrics, rewards/chosen, rewards/margins, kl, ..., land in metrics.jsonl), stop and
checkpoint control, and output/ written complete or not at all.

The reference model is TRL's: with LoRA the trainer gets the base model and the LoRA config, wraps it,
and computes reference log-probs with the adapter disabled (one copy of the weights); with method:
full it loads a frozen copy of the model; ORPO needs none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbtrain.objectives import OBJECTIVES
from nbtrain.worker.sft import SFTRecipe, rename_columns


def prepare_rows(
    ds: Any,
    fmt: str,
    objective: str,
    *,
    columns: Mapping[str, str] | None = None,
    max_samples: int | None = None,
) -> tuple[Any, str]:
    """Rename ``columns``, detect the format for ``objective`` and normalise every row as the kernel's
    check did (formats.to_example); DataError naming the first bad row."""
    from nbtrain.worker.data import convert

    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    return convert(rename_columns(ds, columns), fmt, objective)


class PreferenceRecipe(SFTRecipe):
    """DPO, ORPO or KTO, as ``objective:`` in resolved.json says."""

    @property
    def objective(self) -> str:
        return str(self.cfg.get("objective", "sft"))

    def _config_class(self) -> Any:
        from nbtrain.worker.model import trl_class

        return trl_class(OBJECTIVES[self.objective].config_class)

    def _trainer_kwargs(self) -> dict[str, Any]:
        """What the objective's trainer takes besides model, args, data, tokenizer and callbacks."""
        return {}

    def _make_trainer(self, tok: Any, train: Any, evald: Any) -> Any:
        from nbtrain.worker.model import load_model, lora_config, report_trainable, trl_class

        # The trainer wraps the base in the adapter itself: then it knows the adapter-disabled base is
        # the reference model, and loads no second copy.
        model = load_model(self.cfg, self.plan, self.args, attach_lora=False)
        trainer_class = trl_class(OBJECTIVES[self.objective].trainer_class)
        trainer = trainer_class(
            model=model,
            args=self.sft_args,
            train_dataset=train,
            eval_dataset=evald,
            processing_class=tok,
            callbacks=[self._new_callback()],
            peft_config=lora_config(self.cfg),
            **self._trainer_kwargs(),
        )
        report_trainable(trainer.model, self.cfg["method"])
        print(f"nbtrain: {self.objective} reference model: {self._reference_note(trainer)}", flush=True)
        return trainer

    def _reference_note(self, trainer: Any) -> str:
        if self.objective == "orpo":
            return "none (ORPO is reference-free)"
        if getattr(trainer, "ref_model", None) is not None:
            return "a frozen copy of the model"
        if self.cfg["method"] in ("lora", "qlora"):
            return "the base model with the adapter disabled"
        return "log-probs precomputed before training"
