"""Rules over the planned batch (after the plan: the world size is known)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrain.contract.objectives import OBJECTIVES, rewards_objectives
from nbtrain.control.config import trainargs
from nbtrain.control.config.schema.run import Resolved, RunConfig


def planned_problems(
    res: Resolved, args: dict[str, Any], world_size: int
) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks that need the plan: the number of processes and the batch sizes (the planner may choose
    them). Returns (key path, message) items; prepare() raises them with the plan's other refusals."""
    cfg = res.config
    if cfg.objective not in OBJECTIVES:
        return []
    defaults = trainargs.fields_for(cfg.objective)

    def value(key: str) -> Any:
        """As the TRL config will see it: the planned args, else the config's default."""
        return args[key] if key in args else (defaults[key].default if key in defaults else None)

    items: list[tuple[tuple[str | int, ...], str]] = []
    bs = value("per_device_train_batch_size")
    if cfg.objective == "kto" and value("loss_type") == "kto" and isinstance(bs, int) and bs <= 1:
        items.append(
            (
                ("train", "per_device_train_batch_size"),
                "KTO estimates its KL term from the other completions in a batch, so it needs "
                "per_device_train_batch_size of 2 or more",
            )
        )
    if cfg.objective in rewards_objectives():  # GRPO and RLOO sample groups of completions alike
        items += grpo_batch_problems(cfg, value, world_size)
    return items


def grpo_batch_problems(
    cfg: RunConfig, value: Callable[[str], Any], world_size: int
) -> list[tuple[tuple[str | int, ...], str]]:
    # GRPO samples num_generations completions per prompt, and each generation batch holds whole groups.
    gens, bs = value("num_generations"), value("per_device_train_batch_size")
    steps = value("steps_per_generation") or value("gradient_accumulation_steps")
    items: list[tuple[tuple[str | int, ...], str]] = []
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (gens, bs, steps)) or gens < 2:
        return items  # reported by load_config, or by TRL's own check at start
    given = value("generation_batch_size")
    batch = given if isinstance(given, int) else bs * world_size * steps
    if batch % gens:
        how = (
            "generation_batch_size"
            if isinstance(given, int)
            else f"per_device_train_batch_size {bs} x {world_size} process(es) x steps_per_generation {steps}"
        )
        where = "num_generations" if "num_generations" in cfg.train else "per_device_train_batch_size"
        items.append(
            (
                ("train", where),
                f"the generation batch ({batch} = {how}) must be a multiple of num_generations ({gens}): "
                f"each prompt's {gens} completions are compared with each other",
            )
        )
    eval_bs, eval_gens = value("per_device_eval_batch_size"), value("num_generations_eval") or gens
    if (
        value("eval_strategy") not in (None, "no")
        and isinstance(eval_bs, int)
        and (eval_bs * world_size) % eval_gens
    ):
        where = (
            "per_device_eval_batch_size" if "per_device_eval_batch_size" in cfg.train else "num_generations"
        )
        items.append(
            (
                ("train", where),
                f"evaluation samples {eval_gens} completions per prompt: per_device_eval_batch_size x "
                f"processes ({eval_bs * world_size}) must be a multiple of {eval_gens}",
            )
        )
    return items
