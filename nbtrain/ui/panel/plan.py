"""What Launch would start, shown under the form before it is pressed: the plan ``%%finetune`` would make
for the same config (the one ``prepare``), its memory estimate against the hardware it is planned for (this
machine, a SLURM partition's nodes, or named hardware: the panel's "Plan for", ``planfor.py``), and the
values the plan chose for the fields left empty (shown in those fields as "planned")."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import trainargs
from nbtrain.control.plan.planner import planned_learning_rate
from nbtrain.control.runs import eta, history

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared


def _number(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def plan_lines(prep: Prepared) -> list[str]:
    """Three lines: what trains where, the batch and length of the run, and its memory; first, for a plan
    made for other hardware than this machine (named, or a SLURM partition's nodes), what it was made for
    (the plan's first reason)."""
    plan, args = prep.plan, prep.train_args
    cfg = prep.resolved.config

    def arg(field: str) -> Any:
        return trainargs.value(args, field, cfg.objective)

    micro = arg("per_device_train_batch_size")
    accum = arg("gradient_accumulation_steps")
    steps = arg("max_steps")
    epochs = f"{_number(arg('num_train_epochs'))} epochs"
    if isinstance(steps, int) and steps > 0:
        length = f"{steps} steps"
    else:  # the epochs, and the steps they make over the data where it can be counted (plan/length.py)
        length = f"{plan.steps} steps ({epochs})" if plan.steps else epochs
    swept = cfg.sweep.space if cfg.sweep is not None else {}
    lr = "swept" if "train.learning_rate" in swept else _number(arg("learning_rate"))
    where = f"{_count(plan.nodes, 'node')} x " if plan.nodes > 1 else ""
    procs = _count(plan.num_processes, "process")
    strategy = f", {plan.strategy}" if plan.strategy != "none" else ""
    first = plan.reasons[0] if plan.reasons else ""
    made_for = [first[0].upper() + first[1:]] if first.startswith("planned for ") else []
    warnings = plan.warnings
    if cfg.sweep is not None:
        from nbtrain.control.sweep.sweep import trials_plan

        line, warnings = trials_plan(prep)
        made_for.append(line)
    head = "Each trial" if cfg.sweep is not None else "Plan"
    lines = [
        *made_for,
        f"{head}: {plan.method} {cfg.objective} on {plan.device}, {where}{procs}, {plan.precision}{strategy}",
        f"Batch {micro} x {accum} accumulation x {_count(plan.world_size, 'process')}, {length}, "
        f"learning rate {lr}",
    ]
    lines.append(_time_line(prep, steps if isinstance(steps, int) and steps > 0 else plan.steps))
    est = plan.estimate
    if est is not None:
        need, cap = est["per_device_bytes"] / 2**30, (est.get("capacity_bytes") or 0) / 2**30
        device = {"cuda": "GPU", "npu": "NPU"}.get(est.get("device", ""))
        if device is None:  # a CPU run (or Apple's unified memory): the machine's RAM
            used = f"~{need:.2f} GiB of {cap:.1f} GiB RAM" if cap else f"~{need:.2f} GiB of RAM"
        else:
            used = f"~{need:.2f} GiB per {device}" + (f" of {cap:.1f} GiB" if cap else "")
        lines.append(f"Memory: {used}: {'fits' if plan.fits else plan.fit_advice}")
    else:
        lines.append("Memory: no estimate (the model's config.json is not on this machine yet)")
    return lines + [f"Warning: {w}" for w in warnings]


def placeholders(keys: list[str], prep: Prepared | None, cfg: Mapping[str, Any]) -> dict[str, str]:
    """What each empty training field (``train.KEY``) shows: the value the run would use, "(planned)".
    From the plan once there is one; before it (no model yet), what that plan will use whatever the model
    is: the method's learning rate (an adapter's 2e-4), the epochs and the steps they make over the data.
    Keys for which the plan decides nothing are left out (the field keeps its default's words)."""
    given = cfg.get("train")
    train: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    objective = cfg.get("objective", "sft")
    objective = objective if isinstance(objective, str) and objective in OBJECTIVES else "sft"
    if prep is not None:
        planned: dict[str, Any] = dict(prep.train_args)
        steps = prep.plan.steps
    else:
        lr = planned_learning_rate(objective, str(cfg.get("method", "lora")), train)
        planned = {} if lr is None else {"learning_rate": lr}
        steps = None
    out = {k: f"{_number(planned[k])} (planned)" for k in keys if k in planned}
    if "max_steps" in train:  # the steps are the user's: the epochs do not count
        out["num_train_epochs"] = "not used: Max steps is set"
    else:
        epochs = _number(planned.get("num_train_epochs", trainargs.default(objective, "num_train_epochs")))
        out["num_train_epochs"] = f"{epochs} (planned)"
        out["max_steps"] = (
            f"{steps} (planned: {epochs} epochs over the data)"
            if steps
            else f"planned: {epochs} epochs over the data"
        )
    return {k: v for k, v in out.items() if k in keys}


def _time_line(prep: Prepared, steps: int | None) -> str:
    """How long the run will take: its steps at the step time of the newest completed run like it here
    (``control/runs/history.py``: measured, there is no throughput model), said to be an estimate."""
    timed = history.step_time(history.kind(prep.to_dict())) if steps else None
    if timed is None or not steps:
        return "Time: not estimated yet (no run of this model and batch has finished here)"
    took = eta.about(steps * timed.seconds_per_step).removeprefix("in ")
    return f"Time: {took}, an estimate ({timed.seconds_per_step:.2g} s a step, as run {timed.name} went here)"


def _line_html(line: str) -> str:
    """A line of the plan; what it was planned for has its head ("Planned for ...: 8 x A100-40GB") bold, a
    warning stands apart (amber, its own block)."""
    if line.startswith("Warning: "):
        body = html.escape(line.removeprefix("Warning: "))
        return f"<div class='nbtrain-plan-warning'><b>Warning</b>: {body}</div>"
    if not line.startswith("Planned for "):
        return html.escape(line)
    head, paren, rest = line.partition(" (")
    return f"<span class='nbtrain-plan-for'>{html.escape(head)}</span>{html.escape(paren + rest)}"


def plan_html(lines: list[str]) -> str:
    body = "<br>".join(_line_html(line) for line in lines).replace("<br><div", "<div")
    return f"<div class='nbtrain-plan'>{body}</div>"


__all__ = ["placeholders", "plan_html", "plan_lines"]
