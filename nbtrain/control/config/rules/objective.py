"""objective: its sections, reward functions and models, and hooks."""

from __future__ import annotations

from nbtrain.contract.formats import SFT_FORMATS
from nbtrain.contract.objectives import OBJECTIVES, UNAVAILABLE, rewards_objectives
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.schema.run import RunConfig
from nbtrain.control.config.schema.sections import RewardModelRef


def unavailable_objective(name: str, facts: Facts) -> str:
    """Why ``objective: name`` cannot run with the installed TRL."""
    return f"objective: {name} is not available in TRL {facts.version('trl') or '1.x'}: {UNAVAILABLE[name]}"


def objective_sections(cfg: RunConfig, probs: Problems) -> None:
    """Combinations of objective, data format, rewards and train: keys that TRL would reject later."""
    obj = cfg.objective
    if obj not in OBJECTIVES:
        return  # reported as unavailable already
    fmt = cfg.data.format
    if fmt != "auto" and fmt not in OBJECTIVES[obj].formats:
        kind = "SFT data" if fmt in SFT_FORMATS else f"{fmt} data"
        usable = ", ".join(OBJECTIVES[obj].formats)
        probs.add(
            ("data", "format"),
            f"format: {fmt} is {kind}, which objective: {obj} does not train on; use format: auto or "
            f"{usable}",
        )
    online = rewards_objectives()
    if obj in online and not cfg.rewards:
        probs.add(
            ("objective",),
            f"objective: {obj} learns from rewards: add rewards: [my_reward] naming a function defined in "
            "the notebook (def my_reward(completions, **kwargs) -> list[float]), a built-in "
            "(format_reward, length_reward), or a reward model: rewards: [{model: <an objective: reward "
            "run's id or folder>}]",
        )
    if obj not in online and cfg.rewards:
        if obj == "reward":
            why = (
                "a reward model learns from the chosen/rejected pairs themselves; once it is trained, "
                "name its run in a grpo or rloo run: rewards: [{model: <this run's id>}]"
            )
        else:
            why = f"objective is {obj}"
        probs.add(("rewards",), f"rewards: applies to objective: {' or '.join(online)} only ({why})")
    if obj in online and cfg.rewards:
        weights = cfg.train.get("reward_weights")
        if isinstance(weights, list) and len(weights) != len(cfg.rewards):
            probs.add(
                ("train", "reward_weights"),
                f"{len(weights)} reward_weights for {len(cfg.rewards)} rewards; give one weight per reward",
            )
        gens = cfg.train.get("num_generations")
        if isinstance(gens, int) and not isinstance(gens, bool) and gens < 2:
            probs.add(
                ("train", "num_generations"),
                f"{obj.upper()} compares completions of a prompt: num_generations >= 2",
            )


def reward_models(cfg: RunConfig, facts: Facts, probs: Problems) -> list[str | RewardModelRef] | None:
    """``rewards:`` with each ``{model: ...}`` resolved to what the worker loads (a run's or a folder's
    absolute directory, or a Hub id); a reference that cannot be used is a problem naming the fix."""
    if not cfg.rewards or cfg.objective not in rewards_objectives():
        return cfg.rewards
    out: list[str | RewardModelRef] = []
    for i, entry in enumerate(cfg.rewards):
        if isinstance(entry, RewardModelRef):
            source, problem = facts.reward_model(entry.model)
            if problem is not None:
                probs.add(("rewards", i, "model"), problem)
            entry = RewardModelRef(model=source or entry.model)
        out.append(entry)
    return out


def hooks_sections(cfg: RunConfig, probs: Problems) -> None:
    """``hooks:`` against the objective, the data and the launcher (the names themselves are looked up in
    the notebook by prepare, nbtrain.contract.hooks)."""
    h = cfg.hooks
    if h is None:
        return
    obj = cfg.objective
    if h.loss is not None and obj != "sft":
        probs.add(
            ("hooks", "loss"),
            f"hooks: loss applies to objective: sft (TRL's {obj} trainer computes its objective's own loss); "
            f"remove it, or use objective: sft",
        )
    if h.loss is not None and cfg.train.get("loss_type") == "dft":
        probs.add(("hooks", "loss"), "hooks: loss replaces the loss, as train: loss_type: dft does; give one")
    if h.compute_metrics is not None:
        if obj == "grpo":
            probs.add(
                ("hooks", "compute_metrics"),
                "hooks: compute_metrics runs in the trainer's evaluation, which TRL's GRPO trainer does not "
                "have; score completions with rewards: instead",
            )
        elif cfg.data.eval is None and cfg.data.eval_split is None:
            probs.add(
                ("hooks", "compute_metrics"),
                "hooks: compute_metrics runs when the model is evaluated, and this run has no eval data: add "
                "data: eval_split: 0.1 (a share of the training rows) or data: eval: FILE",
            )
    if h.preprocess_logits_for_metrics is not None and h.compute_metrics is None:
        probs.add(
            ("hooks", "preprocess_logits_for_metrics"),
            "hooks: preprocess_logits_for_metrics prepares the logits for compute_metrics; add "
            "compute_metrics, or remove it",
        )
    if cfg.distributed.launcher == "notebook" and any(v is not None for v in h.model_dump().values()):
        probs.add(
            ("hooks",),
            "hooks: run inside nbtrain's training worker, and launcher: notebook runs a training function "
            "of yours instead (nbtrain.launch_function): call your functions from that function, or remove "
            "launcher: notebook",
        )
