"""Run config: YAML (or a dict) -> validated, typed ``RunConfig``; every problem collected into one error.

Validation is in two passes: the schema (pydantic, strict types, unknown keys rejected) and the rules
(config/rules/) that look at the world (model path, data files, TRL key names, bitsandbytes). Problems
from both are reported together with the key path as written, its YAML line, allowed values and a
close match (config/problems.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import ValidationError

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.contract.formats import FORMATS
from nbtrain.contract.objectives import OBJECTIVES, UNAVAILABLE
from nbtrain.control.config.datacheck import DataProblem, DataSource, flags_problem
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems, schema_problems
from nbtrain.control.config.rewardmodels import RunLookup
from nbtrain.control.config.rules.data import chat_template_key, check_sources, data_sections, preprocess_hook
from nbtrain.control.config.rules.distributed import check_distributed
from nbtrain.control.config.rules.method import method_sections
from nbtrain.control.config.rules.model import (
    check_init_from,
    check_model,
    lora_layers_problem,
    lora_targets_problem,
)
from nbtrain.control.config.rules.objective import (
    hooks_sections,
    objective_sections,
    reward_models,
    unavailable_objective,
)
from nbtrain.control.config.rules.paths import nul_problems
from nbtrain.control.config.rules.secrets import secret_problems
from nbtrain.control.config.rules.train import check_train
from nbtrain.control.config.schema.run import Resolved, RunConfig
from nbtrain.control.config.schema.sections import DataSettings, LoraSettings, QuantSettings, RewardModelRef
from nbtrain.control.config.yamlsafe import MAX_BYTES as MAX_YAML_BYTES
from nbtrain.control.config.yamlsafe import DuplicateKeys, YamlProblem, YamlSyntax, load_yaml


def parse_source(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any] | Any, str, Path]:
    """Return (raw object, YAML text, base dir for relative paths). Raises ConfigError on bad YAML."""
    base = Path.cwd()
    if isinstance(source, dict):
        return source, yaml.safe_dump(source, sort_keys=False), base
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.strip().endswith((".yaml", ".yml"))
    ):
        if "\0" in str(source):  # Path's lookups raise a bare ValueError on one
            why = "which no file name can hold: remove it"
            raise ConfigError([Problem("", f"the config file name {str(source)!r} holds a NUL byte, {why}")])
        p = Path(source).expanduser()
        if not p.is_file():
            raise ConfigError([Problem("", f"config file not found: {p.resolve()}")])
        try:
            with p.open(encoding="utf-8") as f:
                text = f.read(MAX_YAML_BYTES + 1)  # a longer file is refused by load_yaml, not read whole
        except UnicodeDecodeError as e:
            raise ConfigError(
                [Problem("", f"config file {p} is not UTF-8 text (byte {e.start}): save it as UTF-8 YAML")]
            ) from None
    else:
        text = str(source)
    try:
        raw = load_yaml(text)  # yaml.safe_load, with the size and alias expansion bounded
    except YamlProblem as e:
        lines = text.splitlines()

        def source_of(line: int | None) -> str | None:
            return lines[line - 1] if line and line <= len(lines) else None

        if isinstance(e, DuplicateKeys):
            raise ConfigError(
                [
                    Problem(".".join(d.path), d.message(), d.again, source_of(d.again), d.column)
                    for d in e.found
                ]
            ) from None
        what = "YAML syntax error" if isinstance(e, YamlSyntax) else "config refused"
        raise ConfigError([Problem("", f"{what}: {e}", e.line, source_of(e.line), e.column)]) from None
    return raw, text, base


class ConfigRules(Protocol):
    """Rules applied to a config as it is read: a lab preset's config stage
    (nbtrain.control.config.preset.ConfigStage) is one. Typed here so that the config loader does not import
    the preset (which sits beside it, not below it)."""

    def fill(self, raw: Mapping[Any, Any]) -> dict[Any, Any]: ...

    def config_problems(
        self, raw: Mapping[Any, Any], base: Path
    ) -> list[tuple[tuple[str | int, ...], str]]: ...


# The keys the later stages read the world through (the model's files or Hub repo, the data): a problem
# with one of them leaves nothing sound for those stages to look at.
_WORLD_KEYS = ("model", "gguf_file", "revision", "data", "trust_remote_code")


def _world_read(probs: Problems) -> bool:
    return not any(p.path.split(".")[0].split("[")[0] in _WORLD_KEYS for p in probs.items)


def _without_problem_keys(raw: dict[str, Any], error: ValidationError) -> RunConfig | None:
    """The config with each key its schema problems name left out (each then takes its default), for the
    later stages to look at (the problems themselves are reported); None when it still does not parse."""
    import copy

    relaxed = copy.deepcopy(raw)
    for e in error.errors():
        loc = [k for k in e["loc"] if isinstance(k, str | int)]
        node: Any = relaxed
        for key in loc[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and loc:
            node.pop(loc[-1], None)
        elif loc and isinstance(loc[0], str):
            relaxed.pop(loc[0], None)
    try:
        return RunConfig.model_validate(relaxed)
    except ValidationError:
        return None


def load_config(
    source: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    preset: ConfigRules | None = None,
    namespace: Mapping[str, Any] | None = None,
    runs: RunLookup | None = None,
    deferred: list[Problem] | None = None,
) -> Resolved:
    """Validate a config and everything it points at; raise ConfigError listing every problem.

    ``deferred`` (prepare's): where the later stages can still go on -- the config parses once the keys
    its schema problems name are left out, and its training data was read -- the problems are added to
    it and the config so far is returned, so the plan's, the preset's and the fit rule's problems join them
    in the one error prepare raises.

    With a lab ``preset`` (nbtrain.control.config.preset), what it fixes and the config leaves out is
    filled in first, and its violations are reported with the other problems. ``namespace``: the
    notebook's, where ``hooks: preprocess`` is found to look at the rows as the worker will format them
    (without it, their format is left to the worker). ``runs``: how a reward model named by a run's id or
    name is found (prepare gives the registry's)."""
    raw, text, base = parse_source(source)
    probs = Problems(text)
    facts = Facts(base, runs)  # everything the rules below know of the world, read once
    if raw is None:
        raise ConfigError([Problem("", "the config is empty; it needs at least model: and data: train:")])
    if not isinstance(raw, dict):
        raise ConfigError(
            [
                Problem(
                    "", f"the config must be a mapping of keys (model:, data:, ...), got {type(raw).__name__}"
                )
            ]
        )
    secret_problems(raw, probs)
    if name is not None:
        raw = {**raw, "name": name}
    if nul_problems(raw, probs):
        # A path holding NUL cannot be looked up: the checks of the world below wait until it is fixed, and
        # the schema's (which look at nothing) are said with it.
        nul = list(probs.items)
        try:
            RunConfig.model_validate(raw)
        except ValidationError as e:
            schema_problems(e, raw, probs)
        said = {p.path for p in nul}
        items = [*nul, *(p for p in probs.items[len(nul) :] if p.path not in said)]
        raise ConfigError(sorted(items, key=lambda p: (p.line or 0, p.path)))
    raw = chat_template_key(raw, facts, probs)
    preset_items: list[tuple[tuple[str | int, ...], str]] = []
    if preset is not None:
        raw = preset.fill(raw)
        preset_items = preset.config_problems(raw, base)  # listed after the config's own problems
    cfg: RunConfig | None = None
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        schema_problems(e, raw, probs)
        if deferred is not None:
            cfg = _without_problem_keys(raw, e)

    # The checks below look at the world. They run on whatever parts parsed, so one pass reports
    # every problem it can, not only the schema's.
    model = raw.get("model")
    model_kind = (
        check_model(model, facts, probs, raw.get("gguf_file"))
        if isinstance(model, str) and model
        else "local"
    )
    objective = raw.get("objective", "sft")
    if isinstance(objective, str) and objective in UNAVAILABLE:
        probs.add(("objective",), unavailable_objective(objective, facts))
    # train: keys are checked against the objective's TRL config; an unknown or unavailable objective
    # has none, and is reported on its own.
    known_objective = objective if isinstance(objective, str) and objective in OBJECTIVES else None
    train = raw.get("train")
    if isinstance(train, dict) and known_objective is not None:
        check_train(train, raw.get("precision", "auto"), probs, known_objective)
    user_ds: dict[str, Any] | None = None
    reward_list: list[str | RewardModelRef] | None = None
    init_from: Path | None = None
    if cfg is not None:
        method_sections(cfg, probs)
        init_from = check_init_from(cfg, facts, probs)
        if model_kind == "local" and cfg.lora is not None and isinstance(cfg.lora.target_modules, list):
            names = facts.module_names(facts.resolved(cfg.model))
            why = lora_targets_problem(names, cfg.lora.target_modules) if names else None
            if why:
                probs.add(("lora", "target_modules"), why)
        layers = (cfg.lora.model_extra or {}).get("layers_to_transform") if cfg.lora is not None else None
        if model_kind == "local" and isinstance(layers, int | list) and not isinstance(layers, bool):
            config_json = facts.model_config(facts.resolved(cfg.model))
            why = lora_layers_problem(config_json, layers) if config_json else None
            if why:
                probs.add(("lora", "layers_to_transform"), why)
        data_sections(cfg, probs)
        objective_sections(cfg, probs)
        reward_list = reward_models(cfg, facts, probs)
        hooks_sections(cfg, probs)
        user_ds = check_distributed(cfg, facts, probs)
    data: dict[str, Any] = raw["data"] if isinstance(raw.get("data"), dict) else {}
    fmt = data.get("format", "auto")
    fmt = fmt if fmt in ("auto", *FORMATS) else "auto"
    # Rows are checked after data: columns: renames them; with a broken mapping (reported already)
    # every row would look wrong, so they wait until it is fixed.
    columns: dict[str, str] | None = None
    try:
        columns = DataSettings.model_validate({"train": "-", "columns": data.get("columns")}).columns
        columns_ok = True
    except ValidationError:
        columns_ok = False
    sources: dict[str, DataSource] = {}
    train_sources: list[DataSource] = []
    if known_objective is not None and columns_ok:
        hook = preprocess_hook(raw, namespace)
        train_sources = check_sources(data, fmt, columns, facts, known_objective, probs, hook)
        if isinstance(data.get("eval"), str) and data["eval"]:
            try:
                sources["eval"] = facts.data(data["eval"], fmt, known_objective, columns, preprocess=hook)
            except DataProblem as e:
                probs.add(("data", "eval"), str(e))
    flags = flags_problem([*train_sources, *sources.values()], train if isinstance(train, dict) else None)
    if flags:
        probs.add(("train", "assistant_only_loss"), flags)
    if (
        data.get("mask_history") is True
        and isinstance(train, dict)
        and train.get("assistant_only_loss") is False
    ):
        probs.add(
            ("data", "mask_history"),
            "mask_history trains each conversation's last assistant turn only, and train: says "
            "assistant_only_loss: false (every token); keep one of the two",
        )
    if data.get("mask_history") is True and known_objective not in (None, "sft"):
        probs.add(
            ("data", "mask_history"),
            f"mask_history is for SFT conversations, not objective: {known_objective}",
        )
    with_tools = [Path(s.location).name for s in [*train_sources, *sources.values()] if s.tools]
    if with_tools and isinstance(raw.get("model"), str):
        from nbtrain.control.config.chat_template import tools_problem  # jinja2: only for tool rows

        why = tools_problem(with_tools, raw["model"], train if isinstance(train, dict) else None)
        if why:
            probs.add(("model",), why)
    if raw.get("method") == "qlora":
        why = facts.bitsandbytes_problem()
        if why:
            probs.add(("method",), f"method: qlora needs bitsandbytes: {why}")
    for path, message in preset_items:
        probs.add(path, message)
    if probs.items and deferred is not None and cfg is not None and train_sources and _world_read(probs):
        deferred.extend(probs.items)  # the stages after this one can still look: prepare raises them all
    elif probs.items or cfg is None:
        raise ConfigError(sorted(probs.items, key=lambda p: (p.line or 0, p.path)))
    train_src, eval_src = train_sources[0], sources.get("eval")

    # Fill defaults that depend on the method, and make paths absolute for the worker.
    updates: dict[str, Any] = {}
    if cfg.method in ("lora", "qlora", "auto") and cfg.lora is None:
        updates["lora"] = LoraSettings.model_validate({})
    if cfg.method in ("qlora", "auto") and cfg.quantization is None:
        updates["quantization"] = QuantSettings.model_validate({})
    if model_kind == "local":
        updates["model"] = str(facts.resolved(cfg.model))
    elif model_kind == "gguf":  # the file itself (a folder holding one names it)
        updates["model"], updates["gguf_file"] = (
            str(facts.gguf(facts.resolved(cfg.model), cfg.gguf_file).found),
            None,
        )
    if init_from is not None:
        updates["init_from"] = str(init_from)
    if reward_list is not None:
        updates["rewards"] = reward_list  # {model: ...} as the worker loads it: a directory or a Hub id
    # A dataset of a dataset_info.json keeps the json as its path (a resume resolves it again); the file or
    # Hub id it names is in the source the worker reads.
    data_updates: dict[str, Any] = {"train": train_src.dataset_info or train_src.location}
    if isinstance(cfg.data.train, list):
        data_updates["train"] = [
            s.model_copy(update={"path": src.dataset_info or src.location})
            for s, src in zip(cfg.data.train, train_sources, strict=True)
        ]
    if eval_src is not None:
        data_updates["eval"] = eval_src.location
    updates["data"] = cfg.data.model_copy(update=data_updates)
    cfg = cfg.model_copy(update=updates)
    dist_updates: dict[str, Any] = {}
    for key in ("hostfile", "deepspeed_config", "nvme_path"):
        value = getattr(cfg.distributed, key)
        if value is not None:
            dist_updates[key] = str((base / Path(value).expanduser()).resolve())
    if dist_updates:
        cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update=dist_updates)})
    notes = [
        f"data: {train_src.kind} file, format {train_src.format}"
        + (" (detected)" if cfg.data.format == "auto" and train_src.kind != "hub" else "")
        + (f", dataset {train_src.dataset!r} of {train_src.dataset_info}" if train_src.dataset else "")
    ]
    if len(train_sources) > 1:
        how = (
            f"mixed by weight ({cfg.data.stopping_strategy})"
            if train_sources[0].weight is not None
            else "concatenated"
        )
        notes[0] = f"data: {len(train_sources)} sources {how}: " + ", ".join(
            f"{Path(s.spec).name} [{s.kind}, {s.format}" + (f", weight {s.weight:g}]" if s.weight else "]")
            for s in train_sources
        )
    if cfg.data.streaming:
        notes.append(f"data: streaming (an IterableDataset; {cfg.train['max_steps']} steps)")
    if cfg.objective != "sft":
        notes.append(f"objective: {cfg.objective} ({OBJECTIVES[cfg.objective].summary})")
    return Resolved(cfg, text, model_kind, train_src, eval_src, notes, user_ds, train_sources)
