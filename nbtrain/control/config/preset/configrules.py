"""A course preset's rules over what the config says (the config stage): run by ``load_config`` on the
config once ``Preset.fill`` has filled in what the preset fixes, and by ``check_resumed`` on a run's train
args. What the config leaves to ``auto``, the memory cap and the compute cap are the plan stage's
(planrules.py). Rules of the one shape (collect.py) that touch nothing but the model path they compare."""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.control.config.preset.collect import Item, Items, Written, collect, not_allowed
from nbtrain.control.config.preset.model import PATH_KEYS, Preset
from nbtrain.control.config.preset.slurmrules import SLURM, fill_requeues


@dataclass(frozen=True)
class ConfigStage:
    """A preset's config stage as ``load_config`` takes it (its ``ConfigRules``): what the presets in force
    fill in, then their rules over what the config says."""

    preset: Preset

    def fill(self, raw: Mapping[Any, Any]) -> dict[Any, Any]:
        return fill(self.preset, raw)

    def config_problems(self, raw: Mapping[Any, Any], base: Path) -> Items:
        return config_problems(self.preset, raw, base)


def fill(preset: Preset, raw: Mapping[Any, Any]) -> dict[Any, Any]:
    """``raw`` (a parsed config) with what the presets in force fix and the config leaves out filled in
    (``preset``'s first), and the requeues a run gets under max_time."""
    out = dict(raw)
    for p in preset.chain():
        out = _fill_one(p, out)
    return fill_requeues(preset, out)


def _fill_one(p: Preset, raw: Mapping[Any, Any]) -> dict[Any, Any]:
    out = dict(raw)
    dist = out.get("distributed")
    if p.slurm is not None and (dist is None or isinstance(dist, dict)):
        dist = dict(dist or {})
        own = dist.get("slurm")
        dist["slurm"] = {**p.slurm, **own} if isinstance(own, dict) else own or dict(p.slurm)
        out["distributed"] = dist
    if p.data is not None:
        data = out.get("data")
        if data is None:
            out["data"] = p.fixed_data
        elif isinstance(data, dict):
            out["data"] = {**p.fixed_data, **data}
    train = out.get("train")
    if train is None or isinstance(train, dict):
        filled = dict(train or {})
        if p.seed is not None:
            filled.setdefault("seed", p.seed)
        if p.max_steps is not None:
            filled.setdefault("max_steps", p.max_steps)
        if filled:
            out["train"] = filled
    return out


def config_problems(preset: Preset, raw: Mapping[Any, Any], base: Path) -> Items:
    """Violations in what the config says (after ``fill``) of every preset in force: (key path, message)
    pairs. Values left to ``auto``, the memory cap and the compute cap are checked once planned
    (planrules.py)."""
    return collect(preset.chain(), CONFIG, Written(raw, base))


def models(p: Preset, c: Written) -> Iterator[Item]:
    model = c.raw.get("model")
    if p.models is not None and isinstance(model, str) and model and not model_allowed(p, model, c.base):
        yield (("model",), not_allowed(p, "models", "model", model, p.models))


def methods(p: Preset, c: Written) -> Iterator[Item]:
    method = c.raw.get("method", "lora")
    if p.methods is not None and method != "auto" and method not in p.methods:
        yield (("method",), not_allowed(p, "methods", "method", method, p.methods))


def objectives(p: Preset, c: Written) -> Iterator[Item]:
    objective = c.raw.get("objective", "sft")
    if p.objectives is not None and objective not in p.objectives:
        what = "objective" if "objective" in c.raw else "objective (sft when not given)"
        yield (("objective",), not_allowed(p, "objectives", what, objective, p.objectives))


def strategies(p: Preset, c: Written) -> Iterator[Item]:
    strategy = c.dist.get("strategy", "auto")
    if p.strategies is not None and strategy != "auto" and strategy not in p.strategies:
        yield (("distributed", "strategy"), not_allowed(p, "strategies", "strategy", strategy, p.strategies))


def max_steps(p: Preset, c: Written) -> Iterator[Item]:
    steps, cap = c.train.get("max_steps"), p.max_steps
    if (
        cap is not None
        and isinstance(steps, int)
        and not isinstance(steps, bool)
        and not 0 < steps <= cap
        and steps != 0
        and steps >= -1  # 0 and below -1: out of max_steps' own range, said by the field check
    ):
        shown = f"{steps} (train for num_train_epochs)" if steps < 1 else str(steps)
        yield (
            ("train", "max_steps"),
            f"max_steps {shown} is over the cap of {p.where} (rule 'max_steps'); allowed: 1 to {cap}",
        )


def trust_remote_code(p: Preset, c: Written) -> Iterator[Item]:
    """trust_remote_code: true (top level, in train:, or in a train: *_kwargs mapping) runs the model's
    own Python code: refused unless the preset allows it."""
    if p.trust_remote_code:
        return
    asked: list[tuple[str | int, ...]] = []
    if c.raw.get("trust_remote_code") is True:
        asked.append(("trust_remote_code",))
    for key, value in c.train.items():
        if key == "trust_remote_code" and value is True:
            asked.append(("train", key))
        elif isinstance(value, Mapping) and value.get("trust_remote_code") is True:
            asked.append(("train", str(key), "trust_remote_code"))
    for path in asked:
        yield (
            path,
            f"trust_remote_code: true runs Python code that comes with the model, which {p.where} does not "
            f"allow (rule 'trust_remote_code'); allowed: false (leave it out). The instructor can allow it "
            f"with trust_remote_code: true in the preset",
        )


def hooks(p: Preset, c: Written) -> Iterator[Item]:
    """hooks: keys the preset does not list: refused, since notebook code in the trainer can overwrite
    what is graded (a callback rewriting the logged loss, a loss or metric that returns what it likes,
    rows made trivial)."""
    given = c.raw.get("hooks")
    if not isinstance(given, Mapping):
        return
    allowed = ", ".join(p.hooks) or "none"
    for key, value in given.items():
        if value not in (None, []) and key not in p.hooks:
            yield (
                ("hooks", str(key)),
                f"hooks: {key} runs notebook code inside training, where it can change what the course "
                f"grades (the loss, the logged metrics, the rows), which {p.where} does not allow (rule "
                f"'hooks'); allowed: {allowed}. The instructor can allow it with hooks: [{key}] in the "
                f"preset",
            )


def _nodes(c: Written) -> int | None:
    nodes = c.dist.get("nodes", 1)
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None


def max_nodes(p: Preset, c: Written) -> Iterator[Item]:
    nodes = _nodes(c)
    if p.max_nodes is not None and nodes is not None and nodes > p.max_nodes:
        yield (
            ("distributed", "nodes"),
            f"nodes {nodes} is over the cap of {p.where} (rule 'max_nodes'); allowed: 1 to {p.max_nodes}",
        )


def max_processes(p: Preset, c: Written) -> Iterator[Item]:
    """Processes the config gives (num_processes x nodes); those num_processes: auto leaves to the
    planner are the plan stage's."""
    nodes, per_node = _nodes(c), c.dist.get("num_processes", "auto")
    given = isinstance(per_node, int) and not isinstance(per_node, bool)
    if p.max_processes is not None and nodes is not None and given and per_node * nodes > p.max_processes:
        yield (
            ("distributed", "num_processes"),
            f"{per_node * nodes} training processes (num_processes {per_node} x {nodes} node(s)) are over "
            f"the cap of {p.where} (rule 'max_processes'); allowed: 1 to {p.max_processes} in all",
        )


def seed(p: Preset, c: Written) -> Iterator[Item]:
    given = c.train.get("seed")
    if p.seed is not None and "seed" in c.train and given != p.seed:
        yield (
            ("train", "seed"),
            f"seed {given!r} differs from the one {p.where} fixes (rule 'seed'); allowed: {p.seed} (or "
            f"leave seed out)",
        )


def data(p: Preset, c: Written) -> Iterator[Item]:
    given = c.raw.get("data")
    if p.data is None or not isinstance(given, dict):
        return
    for key, fixed in p.fixed_data.items():
        if key in given and _norm(given[key], c.base, key) != _norm(fixed, c.base, key):
            yield (
                ("data", key),
                f"data.{key} {given[key]!r} differs from the data {p.where} fixes (rule 'data'); allowed: "
                f"{fixed!r} (or leave data.{key} out)",
            )


# the config stage, in the order its problems are said
CONFIG = (
    models,
    methods,
    objectives,
    strategies,
    max_steps,
    trust_remote_code,
    hooks,
    max_nodes,
    max_processes,
    *SLURM,
    seed,
    data,
)


def model_allowed(p: Preset, model: str, base: Path) -> bool:
    """``model`` matches one of the ``models`` globs, part by part (``*`` never crosses a ``/``): a
    Hub-id pattern against the model as written (``.`` and ``..`` normalised away), a path pattern
    (relative to the preset file) against the folder the model names, with and without its links
    resolved."""
    if p.models is None:
        return True
    spec = os.path.expanduser(model)
    written = posixpath.normpath(spec)
    local = spec if os.path.isabs(spec) else os.path.join(base, spec)
    folders = {posixpath.normpath(local), str(Path(local).resolve())}
    for pattern in p.models:
        pat = os.path.expanduser(pattern)
        if pattern.startswith((".", "/", "~")):
            full = pat if os.path.isabs(pat) else os.path.join(p.source.parent, pat)
            patterns = {posixpath.normpath(full), str(Path(full).resolve())}
            if any(_glob_match(f, x) for f in folders for x in patterns):
                return True
        elif _glob_match(written, posixpath.normpath(pat)):
            return True
    return False


def _glob_match(name: str, pattern: str) -> bool:
    """``fnmatch`` part by part: the same number of ``/``-separated parts, each matching its glob."""
    names, patterns = name.split("/"), pattern.split("/")
    return len(names) == len(patterns) and all(map(fnmatch.fnmatchcase, names, patterns))


def _norm(value: Any, base: Path, key: str = "") -> Any:
    """A data: value for comparison: paths that exist made absolute, the rest as written."""
    if isinstance(value, str) and key in PATH_KEYS:
        p = Path(value).expanduser()
        full = (base / p).resolve() if not p.is_absolute() else p.resolve()
        return str(full) if full.exists() else value
    if isinstance(value, list):
        return [_norm(x, base, key) for x in value]
    if isinstance(value, dict):
        return {k: _norm(x, base, k) for k, x in value.items()}
    return value
