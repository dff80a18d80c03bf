"""How long a planned run trains, and whether that is likely to be enough.

- ``planned_steps``: the optimizer steps the run will take, as the Trainer counts them: ``train:
  max_steps``, else the epochs over the rows the data holds (``datacheck.count_rows``, after
  ``max_samples`` and ``eval_split``), ``micro-batch x processes`` rows a batch, ``accumulation`` batches
  a step. None where the rows cannot be counted before a start (the Hub, a mix, packed rows).
- ``undertrain_warning``: an adapter's SFT run whose learning-rate budget (learning rate x steps) is under
  ``UNDERTRAIN_BELOW``, worded with what runs of nbtrain's tiny model reached at such budgets
  (``MEASURED``; docs/plans.md, "Will it train enough?"). A rule measured on one small model and task:
  a warning, never a refusal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from nbtrain.control.config import trainargs
from nbtrain.control.config.datacheck import count_rows
from nbtrain.control.config.schema import Resolved

# (learning rate, steps, loss at the start, mean loss of the last 5 steps), by learning rate x steps: LoRA
# SFT (r 8) of the tiny-adder (nbtrain.example_model()) on its addition data (nbtrain.example_data(), 400
# rows), batch 8, TRL's linear schedule, on CPU, measured 2026-12-06 (docs/plans.md, "Will it train enough?").
MEASURED: Final = (
    (2e-4, 60, 4.68, 4.23),
    (2e-4, 150, 4.68, 3.60),
    (1e-3, 60, 4.68, 2.82),
    (5e-4, 150, 4.68, 2.03),
    (2e-3, 60, 4.68, 1.67),
    (1e-3, 150, 4.68, 1.32),
    (2e-3, 150, 4.68, 0.76),
)
# Under this learning rate x steps an adapter's SFT run is warned: at 0.075 and below the tiny model's loss
# stayed above 2 (from 4.68); from 0.12 on it fell below 1.7, to 0.76 at 0.3.
UNDERTRAIN_BELOW: Final = 0.1


def train_rows(res: Resolved) -> int | None:
    """The rows the run trains on, where they can be counted before it starts."""
    d = res.config.data
    if len(res.train_sources) > 1:
        return None  # a mix: its weights decide, the worker counts
    rows = count_rows(res.train_data)
    if rows is None:
        return None
    if d.max_samples:
        rows = min(rows, d.max_samples)
    if d.eval is None and isinstance(d.eval_split, int) and not isinstance(d.eval_split, bool):
        rows -= d.eval_split
    elif d.eval is None and isinstance(d.eval_split, float):
        rows -= math.ceil(rows * d.eval_split)
    return max(rows, 0)


def planned_steps(res: Resolved, args: Mapping[str, Any], world: int) -> int | None:
    """The optimizer steps the run takes, as transformers' Trainer counts them (``max_steps`` when set;
    else ``ceil(epochs x ceil(batches an epoch / accumulation))``, a batch being ``micro x processes``
    rows); None where that cannot be known before the start."""
    objective = res.config.objective

    def arg(name: str) -> Any:
        return trainargs.value(args, name, objective)

    steps = arg("max_steps")
    if isinstance(steps, int) and steps > 0:
        return steps
    if args.get("packing") or objective not in ("sft", "dpo", "orpo", "kto", "reward"):
        return None  # packed rows, or online RL's generations: not the rows' count
    rows = train_rows(res)
    micro, accum, epochs = (
        arg("per_device_train_batch_size"),
        arg("gradient_accumulation_steps"),
        arg("num_train_epochs"),
    )
    if not rows or not all(isinstance(x, (int, float)) and x > 0 for x in (micro, accum, epochs)):
        return None
    batches = math.ceil(rows / (int(micro) * max(1, world)))
    per_epoch = max(batches // int(accum) + int(batches % int(accum) > 0), 1)
    return math.ceil(float(epochs) * per_epoch)


def undertrain_warning(objective: str, method: str, learning_rate: Any, steps: int | None) -> str | None:
    """Why an adapter's SFT run of ``steps`` at ``learning_rate`` is likely to stop before it learns much,
    or None (enough budget, another method or objective, or steps unknown)."""
    if objective != "sft" or method not in ("lora", "qlora") or not steps:
        return None
    if not isinstance(learning_rate, (int, float)) or learning_rate <= 0:
        return None
    budget = learning_rate * steps
    if budget >= UNDERTRAIN_BELOW:
        return None
    near = max((m for m in MEASURED if m[0] * m[1] <= budget * 1.0001), key=lambda m: m[0] * m[1],
               default=MEASURED[0])  # fmt: skip
    best = MEASURED[-1]
    lr, n, start, end = near
    return (
        f"likely to under-train: learning rate x steps = {learning_rate:g} x {steps} = {budget:.2g}, under "
        f"{UNDERTRAIN_BELOW:g}. nbtrain's tiny model went from loss {start:.2f} only to {end:.2f} at "
        f'{lr * n:.2g} ({lr:g} x {n}), to {best[3]:.2f} at {best[0] * best[1]:.2g} (docs/plans.md, "Will it '
        f'train enough?"). Raise train: max_steps, num_train_epochs or learning_rate'
    )
