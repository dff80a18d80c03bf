"""data: its sources, formats and columns, the rows themselves, and chat_template:."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nbtrain.control.config import datasetinfo
from nbtrain.control.config.datacheck import DataProblem, DataSource, RowHook
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.schema.run import RunConfig
from nbtrain.control.config.schema.sections import DataSourceSettings, columns_problem


def data_sections(cfg: RunConfig, probs: Problems) -> None:
    d = cfg.data
    if not d.streaming:
        return
    steps = cfg.train.get("max_steps")
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps > 0):
        probs.add(
            ("data", "streaming"),
            "streaming: true reads the data as it trains, so its length is unknown and epochs cannot be "
            "counted: set train: max_steps: N (the number of optimizer steps to run)",
        )
    if isinstance(d.eval_split, float):
        probs.add(
            ("data", "eval_split"),
            f"eval_split: {d.eval_split} is a fraction, but a streamed dataset has no known length: give a "
            f"number of rows (eval_split: 200 holds out the first 200) or eval: PATH",
        )


def preprocess_hook(raw: dict[str, Any], namespace: Mapping[str, Any] | None) -> RowHook | None:
    """``hooks: preprocess`` for the kernel's look at the rows: the notebook's function when ``namespace``
    has it (a missing one is reported by prepare, which captures the hooks), else None in ``fn``."""
    hooks = raw.get("hooks")
    name = hooks.get("preprocess") if isinstance(hooks, dict) else None
    if not isinstance(name, str) or not name:
        return None
    fn = namespace.get(name) if namespace is not None else None
    return RowHook(fn if callable(fn) else None, f"hooks: preprocess ({name})")


def check_sources(
    data: dict[str, Any],
    fmt: str,
    columns: dict[str, str] | None,
    facts: Facts,
    objective: str,
    probs: Problems,
    hook: RowHook | None = None,
) -> list[DataSource]:
    """Inspect every ``data: train:`` source (a string or a list of them) with its own format and
    column mapping (after ``hooks: preprocess``); sources that cannot be mixed (conversations with plain
    text, ...) are a problem."""
    train = data.get("train")
    if isinstance(train, str) and train:
        dataset = data.get("dataset")
        try:
            if isinstance(dataset, str) and dataset:
                return [inspect_info(train, dataset, fmt, facts, objective, columns, hook)]
            return [facts.data(train, fmt, objective, columns, preprocess=hook)]
        except DataProblem as e:
            probs.add(("data", "dataset" if isinstance(dataset, str) and dataset else "train"), str(e))
            return []
    if not isinstance(train, list):
        return []
    out: list[DataSource] = []
    for i, item in enumerate(train):
        try:
            spec = DataSourceSettings.model_validate(item)
        except ValidationError:
            continue  # reported by the schema pass
        src_fmt = spec.format or fmt
        try:
            if spec.dataset is not None:
                src = inspect_info(
                    spec.path, spec.dataset, src_fmt, facts, objective, spec.columns or columns, hook
                )
                out.append(replace(src, weight=spec.weight))
                continue
            src = facts.data(
                spec.path, src_fmt, objective, spec.columns or columns, split=spec.split,
                data_files=spec.data_files, preprocess=hook,
            )  # fmt: skip
        except DataProblem as e:
            probs.add(("data", "train", i, "dataset" if spec.dataset else "path"), str(e))
            continue
        out.append(replace(src, weight=spec.weight, split=spec.split, columns=spec.columns))
    if len(out) != len(train):
        return out
    kinds: dict[str, list[str]] = {}
    for src in out:
        if src.format == "auto":
            continue  # a hub dataset: checked in the worker
        kind = src.format
        if objective == "sft":
            kind = "plain text" if src.format == "text" else "conversations"
        kinds.setdefault(kind, []).append(Path(src.spec).name)
    if len(kinds) > 1:
        parts = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in kinds.items())
        probs.add(
            ("data", "train"),
            f"these sources cannot be mixed, the trainer takes one kind of row ({parts}); convert them to "
            f"one format or train on them in separate runs",
        )
    return out


def inspect_info(
    spec: str,
    name: str,
    fmt: str,
    facts: Facts,
    objective: str,
    columns: dict[str, str] | None,
    hook: RowHook | None,
) -> DataSource:
    """The dataset ``name`` of the LLaMA-Factory dataset_info.json ``spec`` names, inspected like any
    source, with its resolved facts (file or Hub id, split, columns in nbtrain's names, tags) recorded in
    the DataSource the worker reads. ``columns`` (data: columns:) win over the entry's, name by name."""
    try:
        entry = facts.dataset_info(spec, name)
    except datasetinfo.InfoProblem as e:
        raise DataProblem(str(e)) from None
    merged = {**(entry.columns or {}), **(columns or {})} or None
    if merged is not None:
        problem = columns_problem(merged)
        if problem:
            raise DataProblem(f"{entry.info}: {name!r} with data: columns: {problem}")
    src = facts.data(entry.spec, fmt, objective, merged, split=entry.split, preprocess=hook, tags=entry.tags)
    return replace(
        src, spec=f"{name} ({entry.info})", split=entry.split, columns=merged, tags=entry.tags,
        dataset=name, dataset_info=entry.info,
    )  # fmt: skip


def chat_template_key(raw: dict[str, Any], facts: Facts, probs: Problems) -> dict[str, Any]:
    """``chat_template:`` (a built-in's name, contract/chat_templates, or a Jinja file) as TRL's
    ``train: chat_template_path``, the file's absolute path; the config without the key."""
    from nbtrain.contract.chat_templates import BUILTIN, builtin_template

    if "chat_template" not in raw:
        return raw
    raw = dict(raw)
    value = raw.pop("chat_template")
    names = ", ".join(BUILTIN)
    if not isinstance(value, str) or not value.strip():
        probs.add(("chat_template",), f"chat_template: names a built-in template ({names}) or a Jinja file")
        return raw
    given = raw.get("train")
    train: dict[str, Any] = given if isinstance(given, dict) else {}
    if train.get("chat_template_path"):
        probs.add(
            ("chat_template",),
            "chat_template: and train: chat_template_path both set the chat template; keep one",
        )
        return raw
    path = builtin_template(value)
    if path is None:
        path = Path(value).expanduser()
        path = path if path.is_absolute() else facts.base / path
        if not facts.is_file(path) or path.suffix not in (".jinja", ".j2"):
            probs.add(
                ("chat_template",),
                f"chat_template: {value!r} is neither a built-in template ({names}) nor a Jinja template "
                f"file (.jinja or .j2; looked for {path})",
            )
            return raw
    raw["train"] = {**train, "chat_template_path": str(facts.resolved(str(path)))}
    return raw
