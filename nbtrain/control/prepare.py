"""The one validation entry: validate and plan a config, with no side effects.

    prepare(config)   parse -> facts and config rules (load_config, + the lab preset's) -> the hardware
                      (this machine, named, a SLURM partition's nodes: plan/target.py) -> plan -> rules
                      over the plan (batch sizes, the preset's memory cap) -> fit -> Prepared, or one
                      ConfigError raised once with every stage's problems (a stage that finds some lets
                      the later ones look wherever they can; the fit verdict joins others, alone it is
                      start's refusal)
    validate(config)  every problem that would stop ``start``: prepare's, and the fit rule's refusal
    estimate(config)  prepare, plus every method x strategy on this machine judged by the same fit rule

Every surface checks a config here: the ``%%finetune`` magic and the CLI (``prepare``), the widget panel
and the server extension's validate route (``validate``), so a config one of them shows as valid is one
``start`` accepts, and a refused one is refused with the same messages everywhere. This module sits
above the config (schema, preset), the planner and the estimator, and is where they are combined.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from nbtrain.contract import __version__, hooks, rewards
from nbtrain.contract.errors import ConfigError, NbtrainError, Problem, RunNotFound
from nbtrain.contract.notebook import notebook_namespace
from nbtrain.contract.objectives import rewards_objectives
from nbtrain.control.config import trainargs
from nbtrain.control.config.load import load_config
from nbtrain.control.config.preset import Planned, Preset, find_preset, plan_problems, train_args_problems
from nbtrain.control.config.preset.configrules import ConfigStage, config_problems
from nbtrain.control.config.problems import problems_error
from nbtrain.control.config.rules.batch import planned_problems
from nbtrain.control.config.schema import Resolved, RunConfig, VisionSettings
from nbtrain.control.memory import (
    Estimate,
    count_vision_parameters,
    is_vision_language,
    tokens_per_image,
)
from nbtrain.control.models import hub
from nbtrain.control.plan.accelerators import accelerator_problems
from nbtrain.control.plan.distributed import deepspeed_config
from nbtrain.control.plan.estimates import compare_table, request_for
from nbtrain.control.plan.facts import model_config
from nbtrain.control.plan.fit import Fit, fits
from nbtrain.control.plan.planner import Plan, estimate_for, make_plan, train_args
from nbtrain.control.plan.target import Where, where_to_plan
from nbtrain.control.runs.run import Run, get_run, has_trained_weights
from nbtrain.hardware import Hardware
from nbtrain.hardware import probe as probe_hardware

Items = list[tuple[tuple[str | int, ...], str]]  # (key path, message), as problems_error takes
T = TypeVar("T")


@dataclass
class Prepared:
    """A validated, planned run that has not started: what ``--dry-run`` prints."""

    resolved: Resolved
    plan: Plan
    hardware: Hardware
    train_args: dict[str, Any]
    rewards: bytes | None = None  # GRPO: the reward functions, cloudpickled; start() writes rewards.pkl
    hooks: bytes | None = None  # hooks: the notebook's objects, cloudpickled; start() writes hooks.pkl
    probe: bool = False  # a probe run: its ranks measure the model states they hold (nbtrain.probe)
    preset: Preset | None = None  # the lab preset in force (with the required course presets it chains)
    # a GGUF model: the file, its sha256 and the folder the worker converts it into (control/gguf.source)
    gguf: dict[str, Any] | None = None
    # a sweep's trial: torch threads for its CPU process (the cores shared out among the trials at once), and
    # which sweep and trial it is ({id, dir, trial}: views group the trial's run under its sweep)
    threads: int | None = None
    sweep: dict[str, Any] | None = None
    on: str | None = None  # the named hardware it was planned for (``prepare(on=...)``), None: where it runs

    @property
    def name(self) -> str:
        cfg = self.resolved.config
        objective = "" if cfg.objective == "sft" else f"-{cfg.objective}"
        model = Path(cfg.model)
        return cfg.name or f"{model.stem if self.gguf else model.name}-{cfg.method}{objective}"

    def memory(self) -> tuple[Estimate, Fit] | None:
        """The plan's memory estimate and the fit rule's verdict on it (what ``start`` goes by), or None
        when no estimate could be made (the model's config.json is not on this machine)."""
        if self.plan.estimate is None:
            return None
        mc = model_config(self.resolved)
        if mc is None:
            return None
        est = estimate_for(self.resolved.config, self.plan, mc)
        return est, fits(est, self.hardware)

    def to_dict(self) -> dict[str, Any]:
        r = self.resolved
        return {
            "nbtrain_version": __version__,
            "name": self.name,
            "config": r.config.model_dump(mode="json"),
            "model_kind": r.model_kind,
            "gguf": self.gguf,
            "data": {
                "train": asdict(r.train_data),
                "eval": asdict(r.eval_data) if r.eval_data else None,
                "sources": [asdict(s) for s in r.train_sources or [r.train_data]],
            },
            "train_args": self.train_args,
            "plan": self.plan.to_dict(),
            "hardware": self.hardware.to_dict(),
            "estimate": self.plan.estimate,
            "notes": r.notes,
            "probe": self.probe,
            "threads": self.threads,
            "sweep": self.sweep,
        }

    def summary(self) -> str:
        cfg = self.resolved.config
        lines = [
            f"nbtrain dry run: {self.name} (nothing started)",
            f"  model:     {cfg.model} ({self.resolved.model_kind})",
            *(
                [
                    f"             converted once into {self.gguf['folder'] or 'the cache'} "
                    f"({self.gguf['dtype']}" + (", already there)" if self.gguf["converted"] else ")")
                ]
                if self.gguf
                else []
            ),
            f"  method:    {cfg.method}",
            f"  objective: {cfg.objective}"
            + (f" (rewards: {', '.join(map(rewards.label, cfg.rewards))})" if cfg.rewards else ""),
            *([f"  hooks:     {hooks_summary(cfg.hooks.model_dump())}"] if cfg.hooks else []),
            f"  data:      {self.resolved.train_data.location} "
            f"[{self.resolved.train_data.kind}, {self.resolved.train_data.format}]",
            f"  plan:      {self.plan.nodes} node(s) x {self.plan.num_processes} process(es) on "
            f"{self.plan.device}, strategy {self.plan.strategy}, {self.plan.precision}, "
            f"launcher {self.plan.launcher}",
        ]
        lines += [f"    - {r}" for r in self.plan.reasons]
        lines += [f"  warning:   {w}" for w in self.plan.warnings]
        est = self.plan.estimate
        if est is not None:
            parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in est["parts"].items() if v)
            where = {"cuda": "per GPU", "npu": "per NPU"}.get(est["device"], "of RAM")  # MPS: unified memory
            cap = est["capacity_bytes"]
            of = f"of {cap / 2**30:.1f} GiB" if cap else "(size not known)"
            lines.append(f"  memory:    ~{est['per_device_bytes'] / 2**30:.2f} GiB {where} {of} "
                         f"({parts} GiB)")  # fmt: skip
            if est.get("cpu_bytes"):
                lines.append(f"             host RAM ~{est['cpu_bytes'] / 2**30:.2f} GiB per node")
            if est.get("disk_bytes"):  # offload: nvme
                lines.append(f"             disk ~{est['disk_bytes'] / 2**30:.2f} GiB per node (nvme_path)")
        if not self.plan.fits:
            lines.append(f"  DOES NOT FIT: {self.plan.fit_advice}")
        lines.append("  resolved config:")
        lines += ["    " + ln for ln in json.dumps(self.to_dict()["config"], indent=2).splitlines()]
        if self.plan.deepspeed is not None:
            lines.append("  deepspeed.json:")
            lines += ["    " + ln for ln in json.dumps(self.plan.deepspeed, indent=2).splitlines()]
        lines.append(f"  train args ({trainargs.config_name(cfg.objective)}):")
        lines += [f"    {k}: {v!r}" for k, v in sorted(self.train_args.items())]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.summary())}</pre>"


class RegisteredRuns:
    """The runs as the config's reward-model rule asks about them (config.rewardmodels.RunLookup): found
    in the registry by id, prefix or name, and whether they have trained weights yet."""

    def run_dir(self, ref: str) -> Path | None:
        try:
            return get_run(ref).dir
        except RunNotFound:
            return None

    def weights_problem(self, run_dir: Path, name: str) -> str | None:
        run = Run(run_dir)
        if has_trained_weights(run):
            return None
        return (
            f"run {name} ({run.status().state}) has no trained weights yet (no output/ and no complete "
            f"checkpoint); wait for it to finish (run.wait()), or ask it for a checkpoint (%finetune "
            f"checkpoint {name})"
        )


def prepare(
    config: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    hardware: Hardware | None = None,
    on: str | None = None,
    namespace: Mapping[str, Any] | None = None,
    capture_notebook: bool = True,
    enforce_preset: bool = True,
) -> Prepared:
    """Validate ``config`` (YAML text, a dict, or a .yaml path) and plan it. Raises ConfigError.

    A lab preset (nbtrain.control.config.preset) in force is applied; with ``enforce_preset=False`` (the
    estimate, which students use to find what fits) the rules only the plan shows, such as the memory cap,
    become warnings instead of errors.

    The functions and classes named in ``rewards:`` (objective: grpo) and ``hooks:`` are looked up in
    ``namespace`` (default: the notebook's) and serialised now, so a bad name fails here, before anything
    starts; ``capture_notebook=False`` leaves them out (a process that cannot see the notebook, a resume:
    its run directory holds them).

    ``on``: plan for hardware the user names instead of this machine ("8xA100-40GB", "2x8xH100-80GB",
    "1xT4": ``nbtrain.hardware.named``): the plan, estimate and fit rule are those of that hardware.
    """
    preset = find_preset()  # instructor mode: nbtrain.lab.yaml here or above, or $NBTRAIN_PRESET
    ns = (notebook_namespace() if namespace is None else namespace) if capture_notebook else None
    # Every stage's problems, raised together once at the end: a stage that finds some leaves the later
    # ones to look too wherever they can go on without what it gives.
    problems: list[Problem] = []
    res = load_config(
        config,
        name=name,
        preset=ConfigStage(preset) if preset is not None else None,
        namespace=ns,
        runs=RegisteredRuns(),
        deferred=problems,
    )
    loaded = list(problems)  # the config's own, handed on by load_config

    def stage(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except ConfigError as e:
            problems.extend(e.problems)
            return None

    hub_note = stage(lambda: hub_model_check(res))
    stage(lambda: vision_check(res))
    payload = stage(lambda: reward_payload(res, ns)) if ns is not None else None
    hook_payload = stage(lambda: hooks_payload(res, ns)) if ns is not None else None
    where = stage(lambda: _where(res, hardware, on))
    planned = None
    if where is not None:
        planned = _plan_stage(res, where, preset, enforce_preset, hub_note, problems)
    if problems:
        raise ConfigError(_one_each(problems, len(loaded)))
    assert planned is not None  # a stage that gave nothing has said why in ``problems``
    plan, hw, args, src = planned
    return Prepared(res, plan, hw, args, rewards=payload, hooks=hook_payload, preset=preset, gguf=src, on=on)


def _one_each(problems: list[Problem], first: int) -> list[Problem]:
    """The error's problems in the config's order, without a later stage's word on a key the config's own
    problems already name (the later stages looked at the config with that key left out)."""
    named = {p.path for p in problems[:first]}
    kept = problems[:first] + [p for p in problems[first:] if p.path not in named]
    return sorted(kept, key=lambda p: (p.line or 0, p.path))


def _where(res: Resolved, hardware: Hardware | None, on: str | None) -> Where:
    try:
        return where_to_plan(res, hardware, on)
    except ValueError as e:  # named hardware nbtrain does not know
        raise problems_error(res.text, [((), f"on={on!r}: {e}")]) from None


def _plan_stage(
    res: Resolved,
    where: Where,
    preset: Preset | None,
    enforce_preset: bool,
    hub_note: str | None,
    problems: list[Problem],
) -> tuple[Plan, Hardware, dict[str, Any], dict[str, Any] | None] | None:
    """Plan ``res`` for ``where``'s hardware and apply the rules over the plan; their problems (and, when
    there are others, the fit rule's verdict) go to ``problems``. None when it cannot plan."""
    hw = where.hardware
    if where.nodes is not None and where.nodes != res.config.distributed.nodes:
        d = res.config.distributed.model_copy(update={"nodes": where.nodes})
        res.config = res.config.model_copy(update={"distributed": d})
    plan = make_plan(res, hw)
    if not where.local:
        plan.reasons.insert(0, f"planned for {where.source}, not for this machine")
    if not plan.fits and where.probed and not problems:
        hw, plan = reclaim_warm_memory(res, hw, plan)
    refused = accelerator_problems(res.config, plan, hw.accelerator)  # Apple MPS, Ascend NPU
    refused += cpu_processes_problems(res, plan, hw) if where.local else []
    if hub_note is not None:
        (plan.reasons if plan.estimate is None else res.notes).append(f"model: {hub_note}")
    asked = res.config  # as given: the preset's plan rules see what it left to auto
    if res.config.method != plan.method:  # method: auto, decided by the planner
        res.config = res.config.model_copy(update={"method": plan.method})
    args = train_args(res, plan)
    if res.config.vision is not None and "max_length" not in res.config.train:
        args["max_length"] = None  # TRL would cut a long row inside its image tokens: the row's own length
    if preset is not None:
        violations = plan_problems(preset, _planned(asked, res, plan, args))
        if enforce_preset:
            refused += violations
        else:
            plan.warnings += [message for _, message in violations]
        res.notes += [f"lab preset: {p.source}" for p in preset.chain()]
    refused += planned_problems(res, args, plan.world_size)
    if refused:
        problems.extend(problems_error(res.text, refused).problems)
    if problems and not plan.fits and enforce_preset:
        # alone, a plan that does not fit is start's refusal (a dry run and the estimate still show it);
        # beside other problems it is one of them, so one error says everything that stands in the way
        problems.append(Problem("", f"it would not fit: {plan.fit_advice}"))
    if problems:
        return None
    src: dict[str, Any] | None = None
    try:
        if plan.strategy.startswith("zero"):
            plan.deepspeed = deepspeed_config(res, plan, args)
        src = gguf_source(res, plan.precision)
    except ConfigError as e:
        problems.extend(e.problems)
        return None
    return plan, hw, args, src


def reclaim_warm_memory(res: Resolved, hw: Hardware, plan: Plan) -> tuple[Hardware, Plan]:
    """Before a run is refused for the machine's RAM: this user's idle warm processes (each ~300-540 MB,
    one per home and environment) are the first to give memory back. When the memory they hold (RSS)
    would make the run fit, they are asked to exit, and once they have, the plan is made again on the RAM
    available then (a fresh probe: the verdict counts only memory actually given back). Otherwise, or when
    none exited, nothing changes."""
    from nbtrain.control.launch import warm

    held = warm.reclaimable()
    if not held or not hw.ram_total:
        return hw, plan
    freed = replace(hw, ram_available=min(hw.ram_total, hw.ram_available + held))
    if not make_plan(res, freed).fits:
        return hw, plan  # short of GPU memory, or of more RAM than they hold: they stay
    gone = warm.release_idle(f"a run needs the {held / 2**20:.0f} MiB of RAM idle warm processes hold")
    if not gone:
        return hw, plan
    mib = sum(g["rss_bytes"] for g in gone) / 2**20
    hw = probe_hardware()
    plan = make_plan(res, hw)
    plan.reasons.append(f"{len(gone)} idle warm process(es) exited to give their {mib:.0f} MiB of RAM back")
    return hw, plan


def cpu_processes_problems(res: Resolved, plan: Plan, hw: Hardware) -> Items:
    """More CPU processes on this machine than it has cores: each would get a fraction of a core and the
    machine would thrash (a SLURM job's nodes are its own, and not checked here)."""
    d = res.config.distributed
    most = max(2, hw.cpu_count or 1)  # two ranks always: the planner's own choice for a CPU run (any size)
    asked = d.num_processes if isinstance(d.num_processes, int) else 0
    if plan.device != "cpu" or d.slurm is not None or d.hostfile is not None or asked <= most:
        return []
    return [(("distributed", "num_processes"), (
        f"{asked} processes on this machine's {hw.cpu_count} CPU core(s): each would get a fraction of a "
        f"core; use at most {most} (or num_processes: auto)"
    ))]  # fmt: skip


def gguf_source(res: Resolved, precision: str) -> dict[str, Any] | None:
    """A GGUF model's file, content hash and the folder the worker converts it into (in the float type the
    plan trains in, or the file's own). The hash is read once per file version; nothing is dequantised."""
    from nbtrain.control.models import gguf

    cfg = res.config
    if res.model_kind == "hub" and cfg.gguf_file is not None:
        # the file's hash is known once the worker has it; the float type is the plan's, or the file's own
        # when its header is cached already
        cached = hub.gguf_file(cfg.model, cfg.gguf_file, cfg.revision)[0]
        info = gguf.read(cached) if cached else None
        dtype = (
            gguf.conversion_dtype(info, precision)
            if info
            else {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")
        )
        return {"file": None, "repo": cfg.model, "name": cfg.gguf_file, "sha256": None, "dtype": dtype,
                "folder": None, "architecture": info.architecture if info else None,
                "file_type": info.file_type if info else None, "converted": False}  # fmt: skip
    if res.model_kind != "gguf":
        return None
    try:
        src = gguf.source(res.config.model, precision)
    except (OSError, gguf.GgufProblem) as e:
        raise problems_error(res.text, [(("model",), str(e))]) from None
    res.notes.append(
        f"model: GGUF {src['architecture']} ({src['file_type']}), converted once into a {src['dtype']} model "
        f"folder" + (" (already converted)" if src["converted"] else " before the first step")
    )
    return src


def hub_model_check(res: Resolved) -> str | None:
    """Pre-flight of a Hub model before anything is written: its config.json fetched (into the HF cache,
    where the worker finds it), a missing, gated or private repo or bad revision refused here, with how to
    fix it, rather than minutes later in the worker. Returns a note when the Hub could not be asked."""
    if res.model_kind != "hub":
        return None
    try:
        if res.config.gguf_file is not None:  # a GGUF file in the repo: checked, downloaded by the worker
            return hub.gguf_file(res.config.model, res.config.gguf_file, res.config.revision)[1]
        return hub.model_config(res.config.model, res.config.revision)[1]
    except hub.HubProblem as e:
        raise problems_error(res.text, [(("model",), str(e))]) from None


# What TRL trains a vision-language model with (its vision collators): SFT and DPO; the others refused.
VISION_OBJECTIVES = ("sft", "dpo")


def vision_check(res: Resolved) -> None:
    """A vision-language model (its config.json nests a vision_config) gets ``vision:`` filled in; images
    in the data of a text model, ``vision:`` for one, or an objective other than SFT on images are
    refused, pointing at the line. A model whose config.json cannot be had is left to the worker."""
    mc = model_config(res)
    if mc is None:
        return
    cfg = res.config
    images = sum(s.images for s in res.train_sources) + (res.eval_data.images if res.eval_data else 0)
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if not is_vision_language(mc):
        if cfg.vision is not None:
            problems.append((("vision",), (
                f"vision: applies to a vision-language model; {cfg.model} is a text model (its config.json "
                f"has no vision_config): remove vision:"
            )))  # fmt: skip
        if images:
            problems.append((("data", "train"), (
                f"the data names images ({images} in the rows looked at), but {cfg.model} is a text model "
                f"(its config.json has no vision_config): use a vision-language model (Qwen2-VL, LLaVA, "
                f"...) or data without images"
            )))  # fmt: skip
    else:
        if cfg.objective not in VISION_OBJECTIVES:
            problems.append((("objective",), (
                f"objective: {cfg.objective} on a vision-language model is not supported by nbtrain yet; "
                f"objective: sft trains it on image+text conversations, objective: dpo on image preference "
                f"pairs"
            )))  # fmt: skip
        if res.train_data.format == "text":
            problems.append((("data", "train"), (
                "plain text rows cannot train a vision-language model here; give conversations (messages, "
                "alpaca or sharegpt rows, with or without images)"
            )))  # fmt: skip
        vision = cfg.vision or VisionSettings.model_validate({})
        if vision.images_per_row is None:
            most = max((s.images_per_row for s in res.train_sources), default=0)
            vision = vision.model_copy(update={"images_per_row": most})
        if vision.image_tokens is None:
            local = res.model_kind == "local"
            per_image = tokens_per_image(mc, cfg.model if local else None)
            vision = vision.model_copy(update={"image_tokens": per_image})
        res.config = cfg.model_copy(update={"vision": vision})
        encoder, projector = count_vision_parameters(mc) or (0, 0)
        counted = f"{encoder:,} + {projector:,} parameters" if encoder else "parameters not counted"
        tokens = (
            f"{vision.image_tokens} tokens per image" if vision.image_tokens else "tokens per image unknown"
        )
        res.notes.append(
            f"model: vision-language ({mc.get('model_type')}; image encoder + projector: {counted}), "
            f"{images} image(s) in the rows looked at (at most {vision.images_per_row} per row, {tokens}); "
            f"frozen: {vision.freeze}"
        )
    if problems:
        raise problems_error(res.text, problems)


def launch_refusal(prep: Prepared) -> str | None:
    """Why ``start`` refuses ``prep`` although it validated (the fit rule says it does not fit), or None."""
    if not prep.plan.fits:
        return f"not started: {prep.plan.fit_advice}. (--dry-run shows the whole estimate.)"
    return None


def validate(
    config: str | Path | dict[str, Any],
    *,
    hardware: Hardware | None = None,
    namespace: Mapping[str, Any] | None = None,
    capture_notebook: bool = True,
) -> list[Problem]:
    """Every problem that would stop ``start(prepare(config))``, as ``prepare`` and ``start`` word them;
    empty when the config launches. The panel's inline errors and the server's validate route are these.
    ``capture_notebook=False`` skips looking up GRPO's reward functions and the hooks (for a process, such
    as the Jupyter server, that cannot see the notebook defining them)."""
    return check_config(config, hardware=hardware, namespace=namespace, capture_notebook=capture_notebook)[0]


def check_config(
    config: str | Path | dict[str, Any],
    *,
    hardware: Hardware | None = None,
    namespace: Mapping[str, Any] | None = None,
    capture_notebook: bool = True,
    on: str | None = None,
) -> tuple[list[Problem], Prepared | None]:
    """``validate``'s problems and, when there are none, what ``start`` would start: the plan and the
    memory estimate a form shows before its Launch. ``on``: planned for named hardware instead (the
    panel's "Plan for"), as ``prepare``'s; nothing starts from that plan, so one that does not fit is
    shown with its fit advice rather than refused."""
    try:
        prep = prepare(
            config, hardware=hardware, on=on, namespace=namespace, capture_notebook=capture_notebook
        )
    except ConfigError as e:
        return list(e.problems), None
    except NbtrainError as e:  # e.g. a preset file that cannot be read: nothing would start either
        return [Problem("", str(e))], None
    refusal = None if on is not None else launch_refusal(prep)
    return ([Problem("", refusal)], None) if refusal else ([], prep)


def _planned(cfg: RunConfig, res: Resolved, plan: Plan, args: Mapping[str, Any]) -> Planned:
    """What the preset's plan rules read of the plan (the preset sits below the planner)."""
    est = plan.estimate
    per_device = None if est is None else est["per_device_bytes"]
    return Planned(cfg, res, plan.method, plan.strategy, plan.device, plan.world_size, per_device, args)


def check_resumed(prep: Prepared, resolved: Mapping[str, Any], where: Path) -> None:
    """A resume trains with the train args in the run's ``resolved.json`` (``where``), which anyone with
    the file can edit: check them as a new config's are, against the field ranges and the presets in force
    (prepare checked the config itself). Raises ConfigError naming the file."""
    args = resolved.get("train_args")
    if not isinstance(args, Mapping):
        raise ConfigError([Problem("train_args", f"{where} has no train_args mapping; start the run again")])
    items: Items = []
    for key, value in args.items():
        why = trainargs.bound_problem(str(key), value)
        if why:
            items.append((("train", str(key)), why))
    if prep.preset is not None:
        config = resolved.get("config")
        raw = {**(config if isinstance(config, Mapping) else {}), "train": dict(args)}
        items += [i for i in config_problems(prep.preset, raw, Path.cwd()) if i[0][:1] == ("train",)]
        planned = _planned(prep.resolved.config, prep.resolved, prep.plan, args)
        items += train_args_problems(prep.preset, planned)
    if items:
        raise ConfigError(
            [
                Problem("train_args." + ".".join(map(str, path[1:])), f"in {where}: {message}")
                for path, message in dict.fromkeys(items)
            ]
        )


def estimate_table(
    config: str | Path | dict[str, Any], *, hardware: Hardware | None = None, on: str | None = None
) -> tuple[Prepared, list[dict[str, Any]]]:
    """Will it fit? ``config`` prepared here (preset rules not enforced: an estimate only informs), and every
    method x strategy on this hardware with the fit rule's verdict (empty without the model's config.json)."""
    prep = prepare(config, hardware=hardware, on=on, enforce_preset=False)
    mc = model_config(prep.resolved)
    table: list[dict[str, Any]] = []
    if mc is not None:
        micro = trainargs.value(
            prep.train_args, "per_device_train_batch_size", prep.resolved.config.objective
        )
        req = request_for(prep.resolved.config, prep.plan.precision, mc, micro_batch=int(micro))
        table = compare_table(mc, prep.hardware, req)
    return prep, table


def reward_payload(res: Any, namespace: Mapping[str, Any] | None = None) -> bytes | None:
    """The reward payload of a validated GRPO / RLOO config (``config.Resolved``), or None for other
    objectives; ConfigError naming each bad entry of ``rewards:`` with its YAML line."""
    cfg = res.config
    if cfg.objective not in rewards_objectives() or not cfg.rewards:
        return None
    # a {model: ...} entry is resolved already (load_config): it travels as what the worker loads
    entries = [r if isinstance(r, str) else rewards.RewardModel(r.model) for r in cfg.rewards]
    payload, problems = rewards.capture(entries, namespace)
    if problems:
        raise problems_error(res.text, [(("rewards", i), msg) for i, msg in problems])
    return payload


def hooks_payload(res: Any, namespace: Mapping[str, Any] | None = None) -> bytes | None:
    """The notebook objects ``hooks:`` names, cloudpickled (None without hooks); ConfigError naming each bad
    entry with its YAML line."""
    if res.config.hooks is None:
        return None
    payload, problems = hooks.capture(res.config.hooks.model_dump(), namespace)
    if problems:
        raise problems_error(res.text, [(("hooks", *path), msg) for path, msg in problems])
    return payload


def hooks_summary(named: Mapping[str, Any]) -> str:
    """``hooks:`` in one line: key name, ... (what the dry run and the run's log say)."""
    parts = []
    for key, value in named.items():
        if value:
            parts.append(f"{key} {', '.join(value) if isinstance(value, list) else value}")
    return "; ".join(parts) or "none"


__all__ = [
    "Prepared",
    "check_config",
    "check_resumed",
    "estimate_table",
    "launch_refusal",
    "prepare",
    "validate",
]
