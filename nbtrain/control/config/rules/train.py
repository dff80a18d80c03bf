"""train: keys and values against the objective's TRL config."""

from __future__ import annotations

from typing import Any

from nbtrain.contract.tracking import report_to_problem
from nbtrain.control.config import trainargs
from nbtrain.control.config.problems import Problems, elsewhere_message, home_of


def check_train(train: dict[str, Any], precision: Any, probs: Problems, objective: str = "sft") -> None:
    for key, value in train.items():
        key = str(key)
        if key in ("bf16", "fp16"):
            if not isinstance(value, bool):
                probs.add(("train", key), f"{value!r} is not valid for {key}: expected true/false")
            elif value and precision not in ("auto", key):
                probs.add(("train", key), f"conflicts with precision: {precision}; set only precision: {key}")
            continue
        if key in ("per_device_train_batch_size", "gradient_checkpointing") and value == "auto":
            continue  # the planner picks the largest micro-batch that fits / checkpointing when needed
        msg = trainargs.check_key(key, objective)
        home = home_of(key, ("train",), objective) if msg and key not in trainargs.RENAMED else None
        if home is not None:
            msg = elsewhere_message(key, ("train",), home)
        elif msg is None:
            msg = trainargs.check_value(key, value, objective)
        if msg is None and key == "report_to":
            msg = report_to_problem(value)
        if msg:
            probs.add(("train", key), msg)
        elif isinstance(value, dict | list):  # lr_scheduler_kwargs: {eta_min: .nan}, ...
            for where, bad in trainargs.non_finite(value):
                probs.add(
                    ("train", key, *where), f"{bad!r} is not a number a trainer can use: give a finite number"
                )
