"""GRPO recipe: online RL from reward functions on TRL's GRPOTrainer, with any method.

    objective: grpo
    rewards: [my_reward, format_reward]     # notebook functions (captured to RUN_DIR/rewards.pkl) or
                                            # built-ins from nbtrain.rewards

Data rows are prompts (``{prompt, ...}``); their other columns reach the reward functions as keyword
arguments. Per step the trainer samples ``num_generations`` completions per prompt, scores them, and
logs reward, reward_std, rewards/<name>/mean and (with ``beta`` > 0) kl, which the run-directory
callback writes to metrics.jsonl. With LoRA the KL reference is the base with the adapter disabled.
"""

from __future__ import annotations

from typing import Any

from nbtrain.rewards import REWARDS_FILE
from nbtrain.worker.preference import PreferenceRecipe


class GRPORecipe(PreferenceRecipe):
    def _trainer_kwargs(self) -> dict[str, Any]:
        from nbtrain import rewards

        path = self.paths.root / REWARDS_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: the reward functions are captured there when the run is started "
                f"from a notebook (nbtrain.finetune / %%finetune); start the run again"
            )
        funcs = rewards.load(path)
        names = [getattr(f, "__name__", repr(f)) for f in funcs]
        print(f"nbtrain: grpo rewards: {', '.join(names)}", flush=True)
        return {"reward_funcs": funcs}

    def _reference_note(self, trainer: Any) -> str:
        if not self.sft_args.beta:
            return "none (beta is 0: no KL term; set train: beta to keep the policy near the base)"
        return super()._reference_note(trainer)
