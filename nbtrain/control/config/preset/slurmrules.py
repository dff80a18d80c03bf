"""A course preset's SLURM rules (config stage): the partition, account and QOS it fixes, its caps on GPUs
and time per run, read from what sbatch will see -- the ``slurm:`` keys and every option of ``slurm:
extra:`` as sbatch reads it (control/launch/sbatch.py) -- and max_time held over a run's requeued jobs too;
and the requeues a run gets under max_time (``fill_requeues``). Rules of the one shape (collect.py) that
touch nothing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from nbtrain.control.config.preset.collect import Item, Items, Written
from nbtrain.control.launch import sbatch
from nbtrain.control.launch.sbatch import slurm_seconds

if TYPE_CHECKING:
    from nbtrain.control.config.preset.model import Preset

_DEFAULT_TIME = "04:00:00"  # slurm: time when a config gives none (SlurmSettings)
_NO_LIMIT = ("-1", "infinite", "unlimited")


def _default_requeues() -> int:
    from nbtrain.control.config.schema import SlurmSettings

    return int(SlurmSettings.model_fields["max_requeues"].default)


def _effective_time(slurm: Mapping[Any, Any]) -> str:
    """The time limit sbatch takes: the last --time in extra (written after slurm: time), else slurm: time."""
    extra = slurm.get("extra")
    times: list[str] = []
    if isinstance(extra, list) and all(isinstance(x, str) for x in extra):
        times = [d.value or "" for d in sbatch.directives(extra) if d.name == "time"]
    return times[-1] if times else str(slurm.get("time", _DEFAULT_TIME))


def _time_line(extra: list[str]) -> int:
    return [d.line for d in sbatch.directives(extra) if d.name == "time"][-1]


def _clock(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def fill_requeues(preset: Preset, raw: dict[Any, Any]) -> dict[Any, Any]:
    """Under max_time, a SLURM run with requeue: auto that leaves max_requeues out gets as many
    requeues as fit the smallest cap in force (time x (1 + max_requeues)), at most the usual 10."""
    caps = [slurm_seconds(p.max_time) for p in preset.chain() if p.max_time is not None]
    dist = raw.get("distributed")
    slurm = dist.get("slurm") if isinstance(dist, dict) else None
    if not caps or not isinstance(dist, dict) or not isinstance(slurm, dict) or "max_requeues" in slurm:
        return raw
    limit = slurm_seconds(_effective_time(slurm))
    if slurm.get("requeue", "auto") != "auto" or not limit:
        return raw
    cap = min(c for c in caps if c is not None)
    fits = max(0, min(_default_requeues(), cap // limit - 1))
    return {**raw, "distributed": {**dist, "slurm": {**slurm, "max_requeues": fits}}}


def hostfile(p: Preset, c: Written) -> Iterator[Item]:
    """slurm: sends every run to SLURM, so no hostfile of the student's own (rule 'slurm')."""
    if p.slurm is not None and c.dist.get("hostfile") is not None:
        msg = f"{p.where} runs every run on SLURM (rule 'slurm'); leave hostfile out"
        yield (("distributed", "hostfile"), msg)


def fixed_place(p: Preset, c: Written) -> Iterator[Item]:
    """The course's cluster: the partition, account and QOS slurm: gives (rule 'slurm')."""
    for key in ("partition", "account", "qos"):
        fixed = (p.slurm or {}).get(key)
        if fixed is not None and c.slurm.get(key, fixed) != fixed:
            msg = (
                f"slurm {key} {c.slurm[key]!r} differs from the one {p.where} fixes (rule 'slurm'); "
                f"allowed: {fixed!r} (or leave it out)"
            )
            yield (("distributed", "slurm", key), msg)


def max_gpus(p: Preset, c: Written) -> Iterator[Item]:
    """GPUs per run: gpus_per_node x nodes."""
    nodes, gpus = c.dist.get("nodes", 1), c.slurm.get("gpus_per_node")
    counted = isinstance(gpus, int) and isinstance(nodes, int)
    if p.max_gpus is not None and counted and gpus * nodes > p.max_gpus:
        msg = (
            f"{gpus * nodes} GPUs (gpus_per_node {gpus} x {nodes} node(s)) are over the cap of "
            f"{p.where} (rule 'max_gpus'); allowed: 1 to {p.max_gpus}"
        )
        yield (("distributed", "slurm", "gpus_per_node"), msg)


def exclusive(p: Preset, c: Written) -> Iterator[Item]:
    """exclusive: true under max_gpus: a whole node's GPUs, unless the preset sets it or allows it."""
    own = p.slurm or {}
    asked = c.slurm.get("exclusive") is True and not own.get("exclusive")
    if p.max_gpus is not None and asked and "exclusive" not in p.sbatch_allowed:
        msg = (
            f"exclusive: true takes whole nodes, and SLURM gives an exclusive job every GPU of its "
            f"nodes, past the cap of {p.where} (rule 'max_gpus': {p.max_gpus}); leave exclusive "
            f"out (the instructor can allow it with sbatch_allowed: [exclusive] in the preset)"
        )
        yield (("distributed", "slurm", "exclusive"), msg)


def sbatch_extra(p: Preset, c: Written) -> Items:
    """slurm: extra under any SLURM rule: nothing the preset fixes or caps set again there."""
    return _extra_problems(p, c.slurm) if c.slurm and _governs_slurm(p) else []


def max_time(p: Preset, c: Written) -> Items:
    """A run's time on the cluster: its time limit, and that limit x (1 + requeues)."""
    return _time_problems(p, c.slurm) if c.slurm and p.max_time is not None else []


# the config stage's SLURM rules, in the order their problems are said
SLURM = (hostfile, fixed_place, max_gpus, exclusive, sbatch_extra, max_time)


def _governs_slurm(p: Preset) -> bool:
    return p.slurm is not None or any(
        x is not None for x in (p.max_gpus, p.max_time, p.max_runs_at_once, p.max_nodes)
    )


def _time_problems(p: Preset, slurm: Mapping[Any, Any]) -> Items:
    """max_time: the job's time limit as sbatch sees it (slurm: time, or a later --time in extra) within
    the cap, and the run's whole time on the cluster too: with requeue: auto each requeue for the time
    limit is one more job of that time."""
    where, cap = p.where, slurm_seconds(str(p.max_time))
    time_ = _effective_time(slurm)
    limit = slurm_seconds(time_)
    at: tuple[str | int, ...] = ("distributed", "slurm", "time")
    extra = slurm.get("extra")
    said = f"time {time_}"
    if time_ != str(slurm.get("time", _DEFAULT_TIME)) and isinstance(extra, list):
        at = ("distributed", "slurm", "extra", _time_line(extra))
        item = extra[_time_line(extra)]
        said = f"extra item {item!r} sets sbatch --time, which sbatch takes over slurm: time: {said}"
    if cap is None:
        return []
    if limit is None or limit == 0:
        why = "no time limit at all to SLURM" if limit == 0 or time_.lower() in _NO_LIMIT else (
            "not a time nbtrain can read (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)"
        )  # fmt: skip
        return [(at, f"{said} is {why}, so it cannot be held to the cap of {where} (rule "
                     f"'max_time'); allowed: up to {p.max_time}")]  # fmt: skip
    if limit > cap:
        return [(at, f"{said} is over the cap of {where} (rule 'max_time'); allowed: up to "
                     f"{p.max_time}")]  # fmt: skip
    requeues = slurm.get("max_requeues", _default_requeues())
    if slurm.get("requeue", "auto") != "auto" or not isinstance(requeues, int) or requeues < 1:
        return []
    if limit * (1 + requeues) <= cap:
        return []
    fits = cap // limit - 1
    fix = (f"max_requeues: {fits} or fewer with time {time_}, " if fits > 0 else "") + (
        "requeue: never (the run stops at its time limit; resume goes on from its checkpoint), or a "
        "shorter time"
    )
    msg = (
        f"time {time_} x (1 + max_requeues {requeues}) = {_clock(limit * (1 + requeues))} on the "
        f"cluster is over the cap of {where} (rule 'max_time', a run's whole time on the cluster: with "
        f"requeue: auto each requeue at the time limit is one more job of that time); allowed: up to "
        f"{p.max_time} in all: {fix}"
    )
    return [(("distributed", "slurm", "max_requeues"), msg)]


def _governed(p: Preset) -> dict[str, tuple[str, str]]:
    """The sbatch options slurm: extra may not set under this preset: name -> (rule, why)."""
    out: dict[str, tuple[str, str]] = {}
    own = p.slurm or {}
    for name in ("cluster", "clusters"):
        out[name] = ("slurm", "sends the job to another cluster, where none of the course's SLURM rules hold")
    for key in ("partition", "account", "qos"):
        if own.get(key) is not None:
            out[key] = ("slurm", f"sets the {key} the preset fixes ({own[key]!r})")
    if p.max_time is not None:
        out["time"] = ("max_time", f"sets the job's time limit, capped at {p.max_time}")
    if p.max_gpus is not None:
        gpus = ("max_gpus", f"bears on the GPUs a run gets, capped at {p.max_gpus} (ask for GPUs "
                "with slurm: gpus_per_node, which the cap counts)")  # fmt: skip
        for name in ("gres", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "tres-per-task",
                     "ntasks", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-core", "ntasks-per-gpu",
                     "ntasks-per-tres", "sockets-per-node"):  # fmt: skip
            out[name] = gpus
        out["exclusive"] = ("max_gpus", f"takes whole nodes, and SLURM gives an exclusive job every GPU "
                            f"of its nodes, past the cap of {p.max_gpus}")  # fmt: skip
    if p.max_gpus is not None or p.max_nodes is not None:
        rule = "max_gpus" if p.max_gpus is not None else "max_nodes"
        for name in ("nodes", "nodelist", "nodefile"):
            out[name] = (rule, "sets the nodes the job holds (ask for them with distributed: nodes, "
                         "which the caps count)")  # fmt: skip
    for rule in ("max_runs_at_once", "max_time", "max_gpus"):
        if getattr(p, rule) is not None:
            out["array"] = (rule, "makes the job an array of many jobs, each one a whole run")
            break
    return {k: v for k, v in out.items() if k not in p.sbatch_allowed}


def _extra_problems(p: Preset, slurm: Mapping[Any, Any]) -> Items:
    """slurm: extra read as sbatch reads it: an option it sets that this preset fixes or caps is
    refused (sbatch takes an extra line's value over the preset's), unless sbatch_allowed lists it or
    its value is the fixed one (a time within the cap is checked with the time)."""
    extra = slurm.get("extra")
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        return []  # not a list of lines: the schema says so
    mine = set((p.slurm or {}).get("extra") or [])  # the instructor's own lines
    governed, where, own = _governed(p), p.where, p.slurm or {}
    items: Items = []
    for d in sbatch.directives(extra):
        item = extra[d.line]
        if item in mine:
            continue
        at: tuple[str | int, ...] = ("distributed", "slurm", "extra", d.line)
        allow = f"the instructor can allow it with sbatch_allowed: [{d.name}] in the preset"
        if d.candidates and any(c in governed for c in d.candidates):
            msg = (
                f"extra item {item!r}: {d.spelled.split('=')[0].split()[0]!r} abbreviates several sbatch "
                f"options ({', '.join('--' + c for c in d.candidates)}), among them one {where} rules "
                f"(rule '{governed[next(c for c in d.candidates if c in governed)][0]}'); write the "
                f"option in full (sbatch refuses an ambiguous one)"
            )
            items.append((at, msg))
        elif not d.name and not d.candidates and d.spelled.startswith("-"):
            msg = (
                f"extra item {item!r}: {d.spelled!r} is no sbatch option nbtrain knows, so it cannot "
                f"tell whether it bears on the SLURM rules of {where}; remove it (the instructor can "
                f"allow an option with sbatch_allowed: [NAME] in the preset)"
            )
            items.append((at, msg))
        elif d.name in governed and d.name != "time":
            rule, why = governed[d.name]
            fixed = own.get(d.name)
            if fixed is not None and d.name in ("partition", "account", "qos") and d.value == fixed:
                continue  # the fixed value itself
            msg = (
                f"extra item {item!r} sets sbatch --{d.name}"
                + (f" to {d.value!r}" if d.value is not None else "")
                + f", which {why}, and sbatch takes it over the preset's own line: not allowed by "
                f"{where} (rule '{rule}'); "
                + (f"allowed: {fixed!r} (or leave it out of extra)" if fixed is not None else
                   f"remove it from extra ({allow})")
            )  # fmt: skip
            items.append((at, msg))
    return items
