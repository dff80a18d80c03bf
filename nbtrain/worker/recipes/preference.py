"""Preference optimisation: DPO, ORPO and KTO on TRL's trainers, with any method (full, LoRA, QLoRA).

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: dpo | orpo | kto;
                                            # data rows {prompt, chosen, rejected} or, for KTO,
                                            # {prompt, completion, label}

setup() is SFT's but for the model and the trainer: the objective's TRL config and trainer class
(nbtrain.contract.objectives), and the base model handed to the trainer with the LoRA config rather than
wrapped here. The trainer then wraps it in the adapter itself and computes reference log-probs with the
adapter disabled (one copy of the weights); with method: full it loads a frozen copy of the model; ORPO
needs none. The run-directory callback writes the trainers' own metrics (rewards/chosen,
rewards/margins, kl, ...) to metrics.jsonl; train() saves RUN_DIR/output complete or not at all.
"""

from __future__ import annotations

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.worker.model import load_model, lora_config, trl_class
from nbtrain.worker.recipes.common import Recipe


class PreferenceRecipe(Recipe):
    """DPO, ORPO or KTO, as ``objective:`` in resolved.json says."""

    def setup(self) -> None:
        run = self.run
        objective = OBJECTIVES[run.objective]
        ready = self.prepare(trl_class(objective.config_class))
        if ready is None:
            return  # a stop came during setup: train() records it
        model = load_model(run.cfg, run.plan, run.args, attach_lora=False)  # the trainer attaches it
        peft = lora_config(run.cfg, model)  # a vision-language model's: its language model's layers
        self.make_trainer(trl_class(objective.trainer_class), model, ready, peft_config=peft)
        self.report_reference()

    def reference(self) -> str:
        """What the trainer compares the policy with, for the log."""
        if self.run.objective == "orpo":
            return "none (ORPO is reference-free)"
        return super().reference()
