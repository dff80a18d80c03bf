"""GRPO: online RL from reward functions on TRL's GRPOTrainer, with any method (full, LoRA, QLoRA).

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: grpo; the reward
                                            # functions are in RUN_DIR/rewards.pkl

    rewards: [my_reward, format_reward]     # in config.yaml: notebook functions (captured to
                                            # RUN_DIR/rewards.pkl when the run starts) or built-ins
                                            # from nbtrain.contract.rewards

Data rows are prompts (``{prompt, ...}``); their other columns reach the reward functions as keyword
arguments. Per step the trainer samples ``num_generations`` completions per prompt, scores them, and
logs reward, reward_std, rewards/<name>/mean and (with ``beta`` > 0) kl, which the run-directory
callback writes to metrics.jsonl. As for DPO the trainer gets the base model and the LoRA config, so
with LoRA the KL reference is the base with the adapter disabled (one copy of the weights).
"""

from __future__ import annotations

from typing import Any

from nbtrain.contract import rewards
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.contract.rundir import RunPaths
from nbtrain.worker.model import load_model, lora_config, trl_class
from nbtrain.worker.recipes.common import Recipe


def load_rewards(paths: RunPaths) -> list[Any]:
    """The reward functions the kernel captured when it started the run."""
    path = paths.root / rewards.REWARDS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the reward functions are captured there when the run is started "
            f"from a notebook (nbtrain.finetune / %%finetune); start the run again"
        )
    funcs = rewards.load(path)
    names = [getattr(f, "__name__", repr(f)) for f in funcs]
    print(f"nbtrain: grpo rewards: {', '.join(names)}", flush=True)
    return funcs


class GRPORecipe(Recipe):
    def setup(self) -> None:
        run = self.run
        objective = OBJECTIVES["grpo"]
        ready = self.prepare(trl_class(objective.config_class))
        if ready is None:
            return  # a stop came during setup: train() records it
        reward_funcs = load_rewards(run.paths)
        model = load_model(run.cfg, run.plan, run.args, attach_lora=False)  # the trainer attaches it
        self.make_trainer(
            trl_class(objective.trainer_class), model, ready,
            peft_config=lora_config(run.cfg), reward_funcs=reward_funcs,
        )  # fmt: skip
        self.report_reference()

    def reference(self) -> str:
        """What the KL term compares the policy with, for the log."""
        if not self.trainer.args.beta:
            return "none (beta is 0: no KL term; set train: beta to keep the policy near the base)"
        return super().reference()
