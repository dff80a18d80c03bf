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

from nbtrain.formats import RowError, detect_format, is_conversational, show_row, to_example
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
    check did (formats.to_example); DataError naming the first bad row. Prompt rows keep their other
    columns: GRPO hands them to the reward functions."""
    from nbtrain.worker.data import DataError

    if len(ds) == 0:
        raise DataError("the dataset has no rows")
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    ds = rename_columns(ds, columns)
    if fmt == "auto":
        detected = detect_format(ds[0], objective)
        if detected is None:
            usable = ", ".join(OBJECTIVES[objective].formats)
            raise DataError(
                f"row 1 is not data objective: {objective} trains on ({usable}): {show_row(ds[0])}"
            )
        fmt = detected
    use = fmt

    def convert(row: dict[str, Any], idx: int) -> dict[str, Any]:
        try:
            return to_example(row, use)
        except RowError as e:
            raise DataError(f"row {idx + 1} is not valid {use} data ({e}): {show_row(row)}") from None

    remove = [] if fmt == "prompt" else ds.column_names
    return ds.map(convert, with_indices=True, remove_columns=remove, desc=None), fmt


class PreferenceRecipe(SFTRecipe):
    """DPO, ORPO or KTO, as ``objective:`` in resolved.json says."""

    @property
    def objective(self) -> str:
        return str(self.cfg.get("objective", "sft"))

    def _config_class(self) -> Any:
        from nbtrain.worker.model import trl_class

        return trl_class(OBJECTIVES[self.objective].config_class)

    def _load_data(self, tok: Any) -> tuple[Any, Any]:
        from nbtrain.worker.data import DataError, load_raw, take_eval_split

        d = self.cfg["data"]
        columns = d.get("columns")
        src = self.data["train"]
        train, fmt = prepare_rows(
            load_raw(src["location"], src["kind"]),
            d["format"],
            self.objective,
            columns=columns,
            max_samples=d.get("max_samples"),
        )
        if is_conversational(train[0]) and not getattr(tok, "chat_template", None):
            raise DataError(
                f"the data is conversational (lists of messages) but the tokenizer of {self.cfg['model']} "
                f"has no chat template; use a chat model, or give plain strings"
            )
        evald = None
        if self.data.get("eval"):
            ev = self.data["eval"]
            evald, _ = prepare_rows(
                load_raw(ev["location"], ev["kind"]), fmt, self.objective, columns=columns
            )
        elif d.get("eval_split"):
            train, evald = take_eval_split(train, d["eval_split"], int(self.args.get("seed", 42)))
        print(
            f"nbtrain: {self.objective}: {len(train)} training rows ({fmt})"
            + (f", {len(evald)} eval rows" if evald is not None else ""),
            flush=True,
        )
        return train, evald

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
