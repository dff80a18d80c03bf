"""Instructor mode: a lab preset (``nbtrain.lab.yaml``) that a course ships beside its notebooks.

    # nbtrain.lab.yaml                      found in the working directory or any folder above it,
    course: Fine-tuning 101, lab 3          # or at the path in $NBTRAIN_PRESET
    models: [./tiny-llama, "Qwen/Qwen2.5-*"]   # globs; relative paths are relative to this file
    methods: [lora, qlora]
    objectives: [sft, dpo]
    strategies: [none]
    max_steps: 200                          # a cap: a config without max_steps gets it
    max_memory_gb: 16                       # per device, against the memory estimate (GiB, as it prints)
    seed: 42                                # fixed: a config without train: seed gets it
    data: {train: data/pref.jsonl}          # fixed: a config without data: (or one of its keys) gets it

Every rule is optional. A config outside a rule is refused by ``nbtrain.prepare`` (so by ``%%finetune``,
the CLI and the panel) before anything is written, with one ConfigError listing every violation: the
rule, the preset file, the value the config has and the values the rule allows. Values the preset fixes
and the config leaves out are filled in, and ``resolved.json`` records them.

A preset is a guard rail for a course, not a sandbox: it shapes what the notebook surfaces start; a
student who writes their own training loop is outside it.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nbtrain.errors import ConfigError, Problem

if TYPE_CHECKING:
    from nbtrain.config import Resolved
    from nbtrain.plan import Plan

PRESET_FILE = "nbtrain.lab.yaml"
PRESET_ENV = "NBTRAIN_PRESET"
# data: keys a preset may fix (those of DataSettings that name what is trained on, not how it is read)
DATA_KEYS = ("train", "eval", "format", "eval_split", "max_samples", "columns")
_PATH_KEYS = ("train", "eval", "path")  # whose string values are paths (or hub ids) in data:
Items = list[tuple[tuple[str | int, ...], str]]  # (key path, message), as config.problems_error takes


class Preset(BaseModel):
    """The rules of ``nbtrain.lab.yaml``; ``source`` is the file they came from."""

    model_config = ConfigDict(extra="forbid", strict=True)

    course: str | None = None
    models: list[str] | None = Field(None, min_length=1)
    methods: list[Literal["full", "lora", "qlora"]] | None = Field(None, min_length=1)
    objectives: list[Literal["sft", "dpo", "orpo", "kto", "grpo"]] | None = Field(None, min_length=1)
    strategies: list[Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp"]] | None = Field(
        None, min_length=1
    )
    max_steps: int | None = Field(None, gt=0)
    max_memory_gb: float | None = Field(None, gt=0)
    seed: int | None = None
    data: dict[str, Any] | None = None  # in the file: a mapping of data: keys, or the train: path alone
    source: Path = Field(default=Path(PRESET_FILE), exclude=True)

    @field_validator("data", mode="before")
    @classmethod
    def _data_ok(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = {"train": v}
        if not isinstance(v, dict):
            return v  # None, or a wrong type the schema reports
        unknown = [k for k in v if k not in DATA_KEYS]
        if unknown:
            raise ValueError(f"data: may fix {', '.join(DATA_KEYS)}; not {', '.join(map(str, unknown))}")
        if "train" not in v and "eval" not in v:
            raise ValueError("data: fixes at least train: (the dataset every student trains on)")
        return v

    # ------------------------------------------------------------------------------------ reading
    @property
    def where(self) -> str:
        return f"the lab preset {self.source}"

    @property
    def fixed_data(self) -> dict[str, Any]:
        return {k: self._preset_path(v) if k in _PATH_KEYS else v for k, v in (self.data or {}).items()}

    def _preset_path(self, value: Any) -> Any:
        """A path the preset gives, made absolute against the preset's folder when it exists there."""
        if isinstance(value, str):
            p = (self.source.parent / Path(value).expanduser()).resolve()
            return str(p) if p.exists() else value
        if isinstance(value, list):
            return [self._preset_path(x) for x in value]
        if isinstance(value, dict):
            return {k: self._preset_path(x) if k == "path" else x for k, x in value.items()}
        return value

    def rules(self) -> list[str]:
        """One line per rule, for the panel and for messages."""
        out = [f"course: {self.course}"] if self.course else []
        for key in ("models", "methods", "objectives", "strategies"):
            allowed = getattr(self, key)
            if allowed is not None:
                out.append(f"{key}: {', '.join(map(str, allowed))}")
        if self.max_steps is not None:
            out.append(f"max_steps: at most {self.max_steps}")
        if self.max_memory_gb is not None:
            out.append(f"max_memory_gb: at most {self.max_memory_gb:g} GiB per device (estimated)")
        if self.seed is not None:
            out.append(f"seed: {self.seed} (fixed)")
        for k, v in (self.data or {}).items():
            out.append(f"data.{k}: {v} (fixed)")
        return out

    # ------------------------------------------------------------------------------------ applying
    def fill(self, raw: Mapping[Any, Any]) -> dict[Any, Any]:
        """``raw`` (a parsed config) with what the preset fixes and the config leaves out filled in."""
        out = dict(raw)
        if self.data is not None:
            data = out.get("data")
            if data is None:
                out["data"] = self.fixed_data
            elif isinstance(data, dict):
                out["data"] = {**self.fixed_data, **data}
        train = out.get("train")
        if train is None or isinstance(train, dict):
            filled = dict(train or {})
            if self.seed is not None:
                filled.setdefault("seed", self.seed)
            if self.max_steps is not None:
                filled.setdefault("max_steps", self.max_steps)
            if filled:
                out["train"] = filled
        return out

    def _not_allowed(self, rule: str, what: str, value: Any, allowed: list[Any]) -> str:
        return (
            f"{what} {value!r} is not allowed by {self.where} (rule '{rule}'); "
            f"allowed: {', '.join(map(str, allowed))}"
        )

    def config_problems(self, raw: Mapping[Any, Any], base: Path) -> Items:
        """Violations in what the config says (after ``fill``): (key path, message) pairs. Values left to
        ``auto`` are checked once planned (``plan_problems``)."""
        items: Items = []
        model = raw.get("model")
        if (
            self.models is not None
            and isinstance(model, str)
            and model
            and not self.model_allowed(model, base)
        ):
            items.append((("model",), self._not_allowed("models", "model", model, self.models)))
        method = raw.get("method", "lora")
        if self.methods is not None and method != "auto" and method not in self.methods:
            items.append((("method",), self._not_allowed("methods", "method", method, self.methods)))
        objective = raw.get("objective", "sft")
        if self.objectives is not None and objective not in self.objectives:
            what = "objective" if "objective" in raw else "objective (sft when not given)"
            items.append((("objective",), self._not_allowed("objectives", what, objective, self.objectives)))
        dist = raw.get("distributed")
        strategy = dist.get("strategy", "auto") if isinstance(dist, dict) else "auto"
        if self.strategies is not None and strategy != "auto" and strategy not in self.strategies:
            items.append(
                (
                    ("distributed", "strategy"),
                    self._not_allowed("strategies", "strategy", strategy, self.strategies),
                )
            )
        train = raw.get("train")
        train = train if isinstance(train, dict) else {}
        steps = train.get("max_steps")
        cap = self.max_steps
        if (
            cap is not None
            and isinstance(steps, int)
            and not isinstance(steps, bool)
            and not 0 < steps <= cap
        ):
            shown = f"{steps} (train for num_train_epochs)" if steps < 1 else str(steps)
            items.append(
                (
                    ("train", "max_steps"),
                    f"max_steps {shown} is over the cap of {self.where} (rule 'max_steps'); "
                    f"allowed: 1 to {cap}",
                )
            )
        seed = train.get("seed")
        if self.seed is not None and "seed" in train and seed != self.seed:
            items.append(
                (
                    ("train", "seed"),
                    f"seed {seed!r} differs from the one {self.where} fixes (rule 'seed'); allowed: "
                    f"{self.seed} (or leave seed out)",
                )
            )
        data = raw.get("data")
        if self.data is not None and isinstance(data, dict):
            for key, fixed in self.fixed_data.items():
                if key in data and _norm(data[key], base, key) != _norm(fixed, base, key):
                    items.append(
                        (
                            ("data", key),
                            f"data.{key} {data[key]!r} differs from the data {self.where} fixes (rule "
                            f"'data'); allowed: {fixed!r} (or leave data.{key} out)",
                        )
                    )
        return items

    def model_allowed(self, model: str, base: Path) -> bool:
        """``model`` as written, or as the path it names, matches one of the ``models`` globs (whose
        relative paths are relative to the preset file)."""
        if self.models is None:
            return True
        names = {model}
        p = Path(model).expanduser()
        local = (base / p).resolve() if not p.is_absolute() else p.resolve()
        if local.exists():
            names.add(str(local))
        for pattern in self.models:
            patterns = {pattern}
            if pattern.startswith((".", "/", "~")):
                patterns.add(str((self.source.parent / Path(pattern).expanduser()).resolve()))
            if any(fnmatch.fnmatchcase(n, pat) for n in names for pat in patterns):
                return True
        return False

    def plan_problems(self, res: Resolved, plan: Plan) -> Items:
        """Violations only the plan shows: method/strategy chosen from ``auto``, and the memory cap."""
        items: Items = []
        cfg = res.config
        if self.methods is not None and cfg.method == "auto" and plan.method not in self.methods:
            what = "method (chosen by method: auto)"
            items.append((("method",), self._not_allowed("methods", what, plan.method, self.methods)))
        if (
            self.strategies is not None
            and cfg.distributed.strategy == "auto"
            and plan.strategy not in self.strategies
        ):
            what = "strategy (chosen by strategy: auto)"
            items.append(
                (
                    ("distributed", "strategy"),
                    self._not_allowed("strategies", what, plan.strategy, self.strategies),
                )
            )
        if self.max_memory_gb is not None:
            cap = self.max_memory_gb * 2**30
            est = plan.estimate
            if est is None:
                items.append(
                    (
                        ("model",),
                        f"{self.where} caps memory at {self.max_memory_gb:g} GiB per device (rule "
                        f"'max_memory_gb'), but no memory estimate could be made for {cfg.model} (its "
                        f"config.json is not on this machine); use a model whose files are here",
                    )
                )
            elif est["per_device_bytes"] > cap:
                items.append(
                    (
                        (),
                        f"this run needs about {est['per_device_bytes'] / 2**30:.2f} GiB per device "
                        f"(estimate), over the {self.max_memory_gb:g} GiB cap of {self.where} (rule "
                        f"'max_memory_gb'); lower per_device_train_batch_size or max_length, or use "
                        f"method: lora or qlora (nbtrain.estimate(config) shows what each costs)",
                    )
                )
        return items

    # ------------------------------------------------------------------------------------ the panel
    def locked(self) -> dict[str, Any]:
        """Config key paths the preset pins to one value: the panel shows them filled and disabled."""
        out: dict[str, Any] = {}
        for key, fixed in self.fixed_data.items():
            out[f"data.{key}"] = fixed
        if self.models is not None and len(self.models) == 1 and not _is_glob(self.models[0]):
            out["model"] = self._preset_path(self.models[0])
        for path, allowed in (
            ("method", self.methods),
            ("objective", self.objectives),
            ("distributed.strategy", self.strategies),
        ):
            if allowed is not None and len(allowed) == 1:
                out[path] = allowed[0]
        if self.seed is not None:
            out["train.seed"] = self.seed
        return out

    def choices(self, path: str) -> list[Any] | None:
        """The values the preset allows for a dropdown (``method``, ``objective``,
        ``distributed.strategy``), or None when it does not restrict it."""
        allowed = {
            "method": self.methods,
            "objective": self.objectives,
            "distributed.strategy": self.strategies,
        }
        got = allowed.get(path)
        return list(got) if got is not None else None


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _norm(value: Any, base: Path, key: str = "") -> Any:
    """A data: value for comparison: paths that exist made absolute, the rest as written."""
    if isinstance(value, str) and key in _PATH_KEYS:
        p = Path(value).expanduser()
        full = (base / p).resolve() if not p.is_absolute() else p.resolve()
        return str(full) if full.exists() else value
    if isinstance(value, list):
        return [_norm(x, base, key) for x in value]
    if isinstance(value, dict):
        return {k: _norm(x, base, k) for k, x in value.items()}
    return value


def _problem(path: Path, message: str) -> ConfigError:
    return ConfigError([Problem("", f"lab preset {path}: {message}")])


def load_preset(path: str | Path) -> Preset:
    """Read and check a preset file; a bad one is a ConfigError naming the file and the key."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise _problem(p, f"file not found (set by ${PRESET_ENV})" if os.environ.get(PRESET_ENV) else
                       "file not found")  # fmt: skip
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise _problem(p, f"not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _problem(
            p, f"a preset is a mapping of rules (models:, methods:, ...), got {type(raw).__name__}"
        )
    if "source" in raw:
        raise _problem(p, "unknown rule 'source'")
    try:
        preset = Preset.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"] if not str(x).startswith(("list[", "dict[", "str")))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(k for k in Preset.model_fields if k != "source")
                msg = f"unknown rule; the rules are {allowed}"
            lines.append(f"{where}: {msg}")
        raise _problem(p, "; ".join(dict.fromkeys(lines))) from None
    return preset.model_copy(update={"source": p})


def preset_path(start: Path | None = None) -> Path | None:
    """$NBTRAIN_PRESET, else the first ``nbtrain.lab.yaml`` in ``start`` (the working directory) or a
    folder above it."""
    env = os.environ.get(PRESET_ENV)
    if env:
        return Path(env).expanduser().resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PRESET_FILE
        if candidate.is_file():
            return candidate
    return None


def find_preset(start: Path | None = None) -> Preset | None:
    """The lab preset in force here, or None."""
    path = preset_path(start)
    return load_preset(path) if path is not None else None


__all__ = ["PRESET_ENV", "PRESET_FILE", "Preset", "find_preset", "load_preset", "preset_path"]
