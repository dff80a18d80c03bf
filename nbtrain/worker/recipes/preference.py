"""Learning from preferences: DPO, ORPO, KTO and reward models on TRL's trainers, with any method (full,
LoRA, QLoRA).

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: dpo | orpo | kto |
                                            # reward; data rows {prompt, chosen, rejected} or, for KTO,
                                            # {prompt, completion, label}

setup() is SFT's but for the model and the trainer: the objective's TRL config and trainer class
(nbtrain.contract.objectives), and the base model handed to the trainer with the LoRA config rather than
wrapped here. The trainer then wraps it in the adapter itself and computes reference log-probs with the
adapter disabled (one copy of the weights); with method: full it loads a frozen copy of the model; ORPO
needs none. The run-directory callback writes the trainers' own metrics (rewards/chosen,
rewards/margins, kl, ...) to metrics.jsonl; train() saves RUN_DIR/output complete or not at all.

``objective: reward`` trains a sequence classifier with one output (nbtrain.worker.model.auto_class) to
score the chosen answer above the rejected one (TRL's RewardTrainer, a Bradley-Terry loss); it logs
accuracy and margin, and on the eval rows eval_accuracy: how often it ranks a held-out pair right, which
the log's last line reports. With LoRA the score head trains in full and is saved with the adapter.
"""

from __future__ import annotations

from typing import Any

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.worker.model import load_model, lora_config, trl_class
from nbtrain.worker.recipes.common import Recipe


class PreferenceRecipe(Recipe):
    """DPO, ORPO, KTO or a reward model, as ``objective:`` in resolved.json says."""

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
        if self.run.objective == "reward":
            return "none (a reward model learns scores, not a policy)"
        return super().reference()

    def train(self) -> str:
        outcome = super().train()
        if self.run.objective == "reward" and outcome == "completed":
            report_pairwise_accuracy(self.trainer)
        return outcome


def report_pairwise_accuracy(trainer: Any) -> None:
    """The reward model's accuracy on the held-out pairs (the last evaluation), in the run's log."""
    last = next((h for h in reversed(trainer.state.log_history) if "eval_accuracy" in h), None)
    if last is None:
        print("nbtrain: reward model: no held-out pairs to measure its accuracy on (add data: eval_split: "
              "0.1, or data: eval: FILE)", flush=True)  # fmt: skip
        return
    n = len(trainer.eval_dataset) if hasattr(trainer.eval_dataset, "__len__") else "the"
    print(f"nbtrain: reward model: pairwise accuracy {last['eval_accuracy']:.3f} on {n} held-out pairs "
          f"(the chosen answer scored above the rejected one; 0.5 is chance), margin "
          f"{last.get('eval_margin', float('nan')):.3f}", flush=True)  # fmt: skip
