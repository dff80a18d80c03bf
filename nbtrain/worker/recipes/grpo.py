"""Online RL: GRPO and RLOO from rewards, on TRL's GRPOTrainer / RLOOTrainer, with any method (full, LoRA,
QLoRA).

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: grpo | rloo; the rewards
                                            # are in RUN_DIR/rewards.pkl

    rewards: [my_reward, format_reward]     # in config.yaml: notebook functions (captured to
                                            # RUN_DIR/rewards.pkl when the run starts) or built-ins
                                            # from nbtrain.contract.rewards
    rewards: [{model: rm-run}, my_reward]   # a reward model (an objective: reward run, a folder or a Hub
                                            # id), alone or mixed with functions (train: reward_weights)

Data rows are prompts (``{prompt, ...}``); their other columns reach the reward functions as keyword
arguments. Per step the trainer samples ``num_generations`` completions per prompt, scores them (a reward
model scores prompt + completion through its own tokenizer and chat template), and logs reward,
reward_std, rewards/<name>/mean and (with ``beta`` > 0) kl, which the run-directory callback writes to
metrics.jsonl. GRPO normalises each completion's reward within its group; RLOO takes as baseline the mean
of the group's other completions. As for DPO the trainer gets the base model and the LoRA config, so with
LoRA the KL reference is the base with the adapter disabled (one copy of the weights).
"""

from __future__ import annotations

from typing import Any

from nbtrain.contract import rewards
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.contract.rundir import RunPaths
from nbtrain.worker.model import load_model, lora_config, trl_class
from nbtrain.worker.recipes.common import Recipe


def load_rewards(paths: RunPaths, objective: str) -> tuple[list[Any], list[Any]]:
    """The rewards the kernel captured when it started the run, in the order of ``rewards:``: the
    functions, and each reward model loaded as a sequence classifier; with the processing classes TRL
    scores them with (a reward model's own tokenizer, None for a function)."""
    from nbtrain.worker.tuned import load_reward_model

    path = paths.root / rewards.REWARDS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the reward functions are captured there when the run is started "
            f"from a notebook (nbtrain.finetune / %%finetune); start the run again"
        )
    funcs: list[Any] = []
    processors: list[Any] = []
    names: list[str] = []
    for entry in rewards.load(path):
        if isinstance(entry, rewards.RewardModel):
            model, tok = load_reward_model(entry.source)
            funcs.append(model)
            processors.append(tok)
            names.append(f"{model.config.name_or_path} (reward model {entry.source})")
        else:
            funcs.append(entry)
            processors.append(None)
            names.append(getattr(entry, "__name__", repr(entry)))
    print(f"nbtrain: {objective} rewards: {', '.join(names)}", flush=True)
    return funcs, processors


class OnlineRLRecipe(Recipe):
    """GRPO or RLOO, as ``objective:`` in resolved.json says."""

    def setup(self) -> None:
        run = self.run
        objective = OBJECTIVES[run.objective]
        ready = self.prepare(trl_class(objective.config_class))
        if ready is None:
            return  # a stop came during setup: train() records it
        reward_funcs, processors = load_rewards(run.paths, run.objective)
        model = load_model(run.cfg, run.plan, run.args, attach_lora=False)  # the trainer attaches it
        self.make_trainer(
            trl_class(objective.trainer_class), model, ready,
            peft_config=lora_config(run.cfg), reward_funcs=reward_funcs,
            reward_processing_classes=processors,
        )  # fmt: skip
        self.report_reference()

    def reference(self) -> str:
        """What the KL term compares the policy with, for the log."""
        if not self.trainer.args.beta:
            return "none (beta is 0: no KL term; set train: beta to keep the policy near the base)"
        return super().reference()
