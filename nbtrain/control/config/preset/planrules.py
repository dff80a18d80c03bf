"""A course preset's rules that only the plan, the train args or the cluster show: what ``auto`` chose
(method, strategy, processes), the memory cap against the estimate, the compute cap against the train args
the run will use, and the runs a student has on the cluster at once. Rules of the one shape (collect.py),
over plain values the pipeline hands down (``Planned``, ``Queued``): the preset sits below the planner
and the runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nbtrain.control.config import trainargs
from nbtrain.control.config.datacheck import count_rows
from nbtrain.control.config.preset.collect import Item, Items, Planned, Queued, collect, not_allowed

if TYPE_CHECKING:
    from nbtrain.control.config.preset.model import Preset
    from nbtrain.control.config.schema import Resolved


def plan_problems(preset: Preset, planned: Planned) -> Items:
    """The plan stage of every preset in force: the rules over the plan, then over the train args."""
    return collect(preset.chain(), PLAN, planned) + train_args_problems(preset, planned)


def train_args_problems(preset: Preset, planned: Planned) -> Items:
    """The rules over the train args alone (a resume checks its ``resolved.json``'s with these)."""
    return collect(preset.chain(), TRAIN_ARGS, planned)


def start_refusal(preset: Preset, queued: Queued) -> str | None:
    """Why ``start`` refuses a SLURM run under the presets in force, or None: the tightest cap speaks."""
    tightest_first = sorted(preset.chain(), key=lambda p: p.max_runs_at_once or math.inf)
    items = collect(tightest_first, START, queued)
    return items[0][1] if items else None


# ----------------------------------------------------------------------------------- the plan


def max_processes_chosen(p: Preset, c: Planned) -> Iterator[Item]:
    procs = p.max_processes
    if procs is not None and c.config.distributed.num_processes == "auto" and c.world_size > procs:
        yield (
            ("distributed", "num_processes"),
            f"{c.world_size} training processes (chosen by num_processes: auto) are over the cap of "
            f"{p.where} (rule 'max_processes'); allowed: 1 to {procs} in all: set distributed: "
            f"num_processes",
        )


def max_gpus_chosen(p: Preset, c: Planned) -> Iterator[Item]:
    """GPUs per run where the plan chose them: a SLURM config that leaves gpus_per_node out is planned on
    every GPU of its partition's nodes, which the rule on the config as written cannot count."""
    slurm = c.config.distributed.slurm
    if p.max_gpus is None or slurm is None or slurm.gpus_per_node is not None or c.device != "cuda":
        return
    if c.world_size > p.max_gpus:
        yield (
            ("distributed", "slurm", "gpus_per_node"),
            f"{c.world_size} GPUs (gpus_per_node left out: every GPU of the partition's nodes, chosen by the "
            f"plan) are over the cap of {p.where} (rule 'max_gpus'); allowed: 1 to {p.max_gpus}: set "
            f"gpus_per_node",
        )


def methods_chosen(p: Preset, c: Planned) -> Iterator[Item]:
    if p.methods is not None and c.config.method == "auto" and c.method not in p.methods:
        what = "method (chosen by method: auto)"
        yield (("method",), not_allowed(p, "methods", what, c.method, p.methods))


def strategies_chosen(p: Preset, c: Planned) -> Iterator[Item]:
    chosen = c.config.distributed.strategy == "auto"
    if p.strategies is not None and chosen and c.strategy not in p.strategies:
        what = "strategy (chosen by strategy: auto)"
        yield (("distributed", "strategy"), not_allowed(p, "strategies", what, c.strategy, p.strategies))


def max_memory_gb(p: Preset, c: Planned) -> Iterator[Item]:
    """The memory cap, against the estimate's bytes per device."""
    if p.max_memory_gb is None:
        return
    if c.per_device_bytes is None:
        yield (
            ("model",),
            f"{p.where} caps memory at {p.max_memory_gb:g} GiB per device (rule 'max_memory_gb'), but no "
            f"memory estimate could be made for {c.config.model} (its config.json is not on this machine); "
            f"use a model whose files are here",
        )
    elif c.per_device_bytes > p.max_memory_gb * 2**30:
        yield (
            (),
            f"this run needs about {c.per_device_bytes / 2**30:.2f} GiB per device (estimate), over the "
            f"{p.max_memory_gb:g} GiB cap of {p.where} (rule 'max_memory_gb'); lower "
            f"per_device_train_batch_size or max_length, or use method: lora or qlora "
            f"(nbtrain.estimate(config) shows what each costs)",
        )


def max_train_examples(p: Preset, c: Planned) -> Iterator[Item]:
    """The compute cap, against the train args the run will use: the rows it reads = max_steps x
    effective batch (per-device batch x gradient accumulation x processes), plus each evaluation's rows.
    Packing puts an unknown number of rows in each sequence, and an eval set whose size cannot be counted
    before the start cannot be capped: both are refused under the cap."""
    cap = p.max_train_examples
    if cap is None:
        return
    value = _arg(c)
    micro, accum, steps = (
        value("per_device_train_batch_size"),
        value("gradient_accumulation_steps"),
        value("max_steps"),
    )
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (micro, accum, steps)):
        return  # refused by the field checks
    rule = f"{p.where} caps training at {cap} rows (rule 'max_train_examples')"
    if value("packing") is True:
        yield (("train", "packing"), (
            f"packing: true lays several rows into each sequence of the batch, so how many rows this "
            f"run reads is not known before it starts, and {rule}: leave packing out"
        ))  # fmt: skip
        return
    batch = micro * accum * c.world_size
    how = (
        f"effective batch {batch} = per_device_train_batch_size {micro} x gradient_accumulation_steps "
        f"{accum} x {c.world_size} process(es)"
    )
    evals = evaluation_rows(c.resolved, value, steps, batch)
    if evals is None:
        yield (("data", "eval" if c.resolved.config.data.eval else "eval_split"), (
            f"this run evaluates on rows nbtrain cannot count before it starts, and {rule}, which "
            f"counts evaluation too: give data: eval_split as a number of rows (e.g. 50), or an eval "
            f"file in JSON Lines, CSV or JSON"
        ))  # fmt: skip
        return
    n_evals, eval_rows = evals
    reading = steps * batch + n_evals * eval_rows
    also = f" + {n_evals} evaluation(s) x {eval_rows} rows" if n_evals * eval_rows else ""
    room = cap - n_evals * eval_rows
    fix = (
        f"set train: max_steps to at most {room // batch}"
        if room >= batch
        else f"lower the batch to at most {max(room, 0)} rows a step"
    )
    if n_evals * eval_rows and room < cap // 2:
        fix += ", or evaluate less often (train: eval_steps) on fewer rows (data: eval_split)"
    if steps < 1:
        yield (
            ("train", "max_steps"),
            f"max_steps {steps} trains for num_train_epochs, uncapped, but {rule}; {how}: {fix}",
        )
    elif reading > cap:
        yield (
            ("train", "max_steps"),
            f"this run reads {reading} rows (max_steps {steps} x {how}{also}), over the cap of "
            f"{p.where} (rule 'max_train_examples'); allowed: at most {cap}: {fix}",
        )


def _arg(c: Planned) -> Callable[[str], Any]:
    """A train arg as the run will have it: given, else the TRL config's default, else None."""
    fields = trainargs.fields_for(c.resolved.config.objective)

    def value(key: str) -> Any:
        return c.train_args[key] if key in c.train_args else (fields[key].default if key in fields else None)

    return value


def evaluation_rows(
    res: Resolved, value: Callable[[str], Any], steps: int, batch: int
) -> tuple[int, int] | None:
    """(evaluations in the run, rows each reads) as the Trainer will run them; None when the eval rows
    cannot be counted before the start."""
    strategy = value("eval_strategy")
    if strategy in (None, "no") or steps < 1:
        return (0, 0)
    d = res.config.data
    train_rows = None if len(res.train_sources) > 1 else count_rows(res.train_data)  # a mix: its weights
    if train_rows is not None and d.max_samples:
        train_rows = min(train_rows, d.max_samples)
    if d.eval is not None:
        rows = count_rows(res.eval_data) if res.eval_data is not None else None
    elif isinstance(d.eval_split, int):
        rows = d.eval_split
    elif isinstance(d.eval_split, float) and train_rows is not None:
        rows = math.ceil(train_rows * d.eval_split)
        train_rows -= rows
    else:
        return None if d.eval_split else (0, 0)
    if rows is None:
        return None
    if strategy == "epoch":  # once per pass over the rows: as many passes as max_steps makes
        if not train_rows:
            return None
        return (math.ceil(steps * batch / train_rows), rows)
    every = value("eval_steps") or value("logging_steps") or 500
    interval = math.ceil(steps * every) if every < 1 else int(every)  # below 1: a fraction of the run
    return (steps // max(1, interval), rows)


# ----------------------------------------------------------------------------------- the cluster


def max_runs_at_once(p: Preset, c: Queued) -> Iterator[Item]:
    """This student's runs queued or running on the cluster (checked by ``start``: a dry run starts none)."""
    if p.max_runs_at_once is not None and len(c.runs) >= p.max_runs_at_once:
        yield (
            (),
            f"not started: {p.where} allows {p.max_runs_at_once} run(s) on the cluster at once (rule "
            f"'max_runs_at_once'), and these are queued or running: {', '.join(c.runs)}; stop one (or let it "
            "finish) first",
        )


# the stages, each in the order its problems are said
PLAN = (max_processes_chosen, max_gpus_chosen, methods_chosen, strategies_chosen, max_memory_gb)
TRAIN_ARGS = (max_train_examples,)
START = (max_runs_at_once,)
