"""What Launch would start, shown under the form before it is pressed: the plan ``%%finetune`` would make
for the same config (the one ``prepare``), its memory estimate against this machine, and the values the
plan chose for the fields left empty (shown in those fields as "planned")."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared


def _number(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def plan_lines(prep: Prepared) -> list[str]:
    """Two or three lines: what trains where, the batch and length of the run, and its memory."""
    plan, args = prep.plan, prep.train_args
    cfg = prep.resolved.config
    micro = args.get("per_device_train_batch_size", 8)
    accum = args.get("gradient_accumulation_steps", 1)
    steps = args.get("max_steps", -1)
    length = (
        f"{steps} steps"
        if isinstance(steps, int) and steps > 0
        else f"{_number(args.get('num_train_epochs', 3))} epoch(s)"
    )
    lr = args.get("learning_rate", 2e-5)
    where = f"{plan.nodes} node(s) x " if plan.nodes > 1 else ""
    lines = [
        f"Plan: {plan.method} {cfg.objective} on {plan.device}, {where}{plan.num_processes} process(es), "
        f"{plan.precision}" + (f", {plan.strategy}" if plan.strategy != "none" else ""),
        f"Batch {micro} x {accum} accumulation x {plan.world_size} process(es), {length}, "
        f"learning rate {_number(lr)}",
    ]
    est = plan.estimate
    if est is not None:
        need, cap = est["per_device_bytes"] / 2**30, est.get("capacity_bytes") or 0
        where = {"cuda": "per GPU", "npu": "per NPU"}.get(est.get("device", ""), "of RAM")
        of = f" of {cap / 2**30:.1f} GiB" if cap else ""
        lines.append(f"Memory: ~{need:.2f} GiB {where}{of}: {'fits' if plan.fits else plan.fit_advice}")
    else:
        lines.append("Memory: no estimate (the model's config.json is not on this machine yet)")
    return lines


def plan_html(lines: list[str]) -> str:
    body = "<br>".join(html.escape(line) for line in lines)
    return f"<div class='nbtrain-plan'>{body}</div>"


__all__ = ["plan_html", "plan_lines"]
