"""Instructor mode: a lab preset (``nbtrain.lab.yaml``) that a course ships beside its notebooks.

    # nbtrain.lab.yaml                      found in the working directory or any folder above it,
    course: Fine-tuning 101, lab 3          # or at the path in $NBTRAIN_PRESET
    models: [./tiny-llama, "Qwen/Qwen2.5-*"]   # globs; relative paths are relative to this file
    methods: [lora, qlora]
    objectives: [sft, dpo]
    strategies: [none]
    max_steps: 200                          # a cap: a config without max_steps gets it
    max_train_examples: 20000               # a compute cap: effective batch x max_steps + eval rows
    max_nodes: 1                            # caps on distributed: nodes, and processes in all
    max_processes: 2
    max_memory_gb: 16                       # per device, against the memory estimate (GiB, as it prints)
    seed: 42                                # fixed: a config without train: seed gets it
    data: {train: data/pref.jsonl}          # fixed: a config without data: (or one of its keys) gets it
    trust_remote_code: false                # the default: a model's own Python code never runs
    hooks: [compute_metrics]                # hooks: keys students may use (none unless listed)
    required: true                          # the rules follow the student out of this folder
    slurm: {partition: class, qos: students, account: fin101, time: "00:30:00"}   # every run on the cluster
    max_gpus: 1                             # per run: slurm gpus_per_node x nodes
    max_time: "01:00:00"                    # per run: its slurm time limit (SLURM's formats)
    max_runs_at_once: 1                     # a student's runs queued or running on the cluster at once
    sbatch_allowed: [gres]                  # sbatch options slurm: extra: may set though they bear on the
                                            # rules above (none unless listed)

Every rule is optional. A config outside a rule is refused by ``nbtrain.prepare`` (so by ``%%finetune``,
the CLI and the panel) before anything is written, with one ConfigError listing every violation: the
rule, the preset file, the value the config has and the values the rule allows. Values the preset fixes
and the config leaves out are filled in, and ``resolved.json`` records them. ``nbtrain resume`` checks
the rules again against the train args the run will use (its ``resolved.json``).

Model globs match whole path parts (``*`` never crosses a ``/``), against the model as written with
``.`` and ``..`` normalised away, and against the folder it names; a Hub id never holds ``..``.

``required: true`` makes the course stick: once nbtrain has seen the preset it is remembered (in
``$NBTRAIN_HOME/courses.json``), and its rules apply wherever the student works, also beside another
preset or an empty ``$NBTRAIN_PRESET``. If its file disappears, nothing starts until it is back or the
student leaves the course on purpose (``leave_course``); an instructor who drops ``required`` releases it.

``slurm:`` routes every run of the course to SLURM: a config without ``distributed: slurm:`` gets these
settings, and one that names another partition, account or QOS is refused (its time, GPUs and the rest it
may set within the caps). Students see their place in the queue in the cell, the list and the sidebar.
``slurm: extra:`` lines are read as sbatch reads them (control/launch/sbatch.py: every spelling, short and
long, abbreviated, several options on one line): under these rules they may not set what the preset fixes
or caps (partition, account, QOS, another cluster, time, or GPUs, nodes, tasks, whole nodes, job arrays
under max_gpus) unless ``sbatch_allowed`` lists the option; a value equal to the fixed one, or a time
within the cap, is no escape and passes. ``max_time`` caps a run's whole time on the cluster: with
``requeue: auto`` each requeue is another job of ``time``, so time x (1 + max_requeues) stays within it
(a config that leaves max_requeues out gets as many as fit).

A preset is a guard rail for a course, not a sandbox: it shapes what the notebook surfaces start; a
student who writes their own training loop is outside it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.contract.hooks import KEYS as hook_keys
from nbtrain.contract.paths import home_dir
from nbtrain.contract.rundir import atomic_write_json
from nbtrain.control.config.choices import AvailableObjective, Method, Strategy
from nbtrain.control.config.slurmrules import Items, fill_requeues, slurm_problems, slurm_seconds
from nbtrain.control.config.yamlsafe import MAX_BYTES, YamlProblem, load_yaml
from nbtrain.control.launch import sbatch

PRESET_FILE = "nbtrain.lab.yaml"
PRESET_ENV = "NBTRAIN_PRESET"
# data: keys a preset may fix (those of DataSettings that name what is trained on, not how it is read)
DATA_KEYS = ("train", "eval", "format", "eval_split", "max_samples", "columns")
_PATH_KEYS = ("train", "eval", "path")  # whose string values are paths (or hub ids) in data:


# The caps a preset can set, as its rules list them: (field, what the number counts).
_CAPS = (
    ("max_steps", ""),
    ("max_train_examples", " rows read (effective batch x steps, and each evaluation's rows)"),
    ("max_nodes", ""),
    ("max_processes", " training processes in all"),
    ("max_memory_gb", " GiB per device (estimated)"),
)


class Preset(BaseModel):
    """The rules of ``nbtrain.lab.yaml``; ``source`` is the file they came from."""

    model_config = ConfigDict(extra="forbid", strict=True)

    course: str | None = None
    models: list[str] | None = Field(None, min_length=1)
    methods: list[Method] | None = Field(None, min_length=1)
    objectives: list[AvailableObjective] | None = Field(None, min_length=1)
    strategies: list[Strategy] | None = Field(None, min_length=1)
    max_steps: int | None = Field(None, gt=0)
    max_train_examples: int | None = Field(None, gt=0)  # effective batch x max_steps
    max_nodes: int | None = Field(None, gt=0)
    max_processes: int | None = Field(None, gt=0)  # training processes in all (nodes x per node)
    max_memory_gb: float | None = Field(None, gt=0, allow_inf_nan=False)
    seed: int | None = None
    data: dict[str, Any] | None = None  # in the file: a mapping of data: keys, or the train: path alone
    trust_remote_code: bool = False  # whether a config may run a model's own Python code
    required: bool = False  # the rules follow the student everywhere once seen (courses.json)
    slurm: dict[str, Any] | None = None  # sbatch settings every run of the course gets (distributed: slurm:)
    max_gpus: int | None = Field(None, gt=0)  # per run, on the cluster: gpus_per_node x nodes
    max_time: str | None = None  # per run, on the cluster: its time limit, in SLURM's formats
    max_runs_at_once: int | None = Field(None, gt=0)  # a student's runs queued or running on the cluster
    # sbatch options (long names) slurm: extra: may set though they bear on the rules above: none unless
    # listed, as sbatch takes an extra line's value over the preset's own lines
    sbatch_allowed: list[str] = Field(default_factory=list)
    # hooks: keys a config may use: each runs notebook code inside training, where it can change what a
    # course grades (the loss, the logged metrics, the rows), so none is allowed unless listed here
    hooks: list[str] = Field(default_factory=list)
    source: Path = Field(default=Path(PRESET_FILE), exclude=True)
    # Required course presets that apply as well as this one (find_preset fills it): see chain()
    _also: list[Preset] = PrivateAttr(default_factory=list)

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

    @field_validator("slurm")
    @classmethod
    def _slurm_ok(cls, v: Any) -> Any:
        if v is None:
            return v
        from nbtrain.control.config.schema import SlurmSettings

        SlurmSettings.model_validate(v)  # the keys and values distributed: slurm: takes
        return dict(v)

    @field_validator("hooks")
    @classmethod
    def _hooks_ok(cls, v: list[str]) -> list[str]:
        unknown = [k for k in v if k not in hook_keys]
        if unknown:
            raise ValueError(
                f"hooks: lists the hooks: keys allowed ({', '.join(hook_keys)}); not {', '.join(unknown)}"
            )
        return v

    @field_validator("sbatch_allowed")
    @classmethod
    def _sbatch_allowed_ok(cls, v: list[str]) -> list[str]:
        unknown = [k for k in v if k not in sbatch.OPTIONS]
        if unknown:
            raise ValueError(
                f"sbatch_allowed lists sbatch options by their long name without dashes (gres, nodes, "
                f"exclusive, ...); not {', '.join(map(repr, unknown))}"
            )
        return [sbatch.ALIASES.get(k, k) for k in v]

    @field_validator("max_time")
    @classmethod
    def _time_ok(cls, v: Any) -> Any:
        if v is not None and slurm_seconds(v) is None:
            raise ValueError(f"max_time {v!r} is not a SLURM time (minutes, HH:MM:SS, D-HH:MM...)")
        return v

    # ------------------------------------------------------------------------------------ reading
    @property
    def where(self) -> str:
        return f"the lab preset {self.source}"

    def chain(self) -> list[Preset]:
        """Every preset in force: this one, then the required course presets that also apply. Each one's
        rules are checked on their own, so a config passes only when it passes all of them."""
        return [self, *self._also]

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
        """One line per rule, for the panel and for messages (the required presets' too, after theirs)."""
        out = self._own_rules()
        for other in self._also:
            out.append(f"also, the required course preset {other.source}:")
            out += [f"  {r}" for r in other._own_rules()]
        return out

    def _own_rules(self) -> list[str]:
        out = [f"course: {self.course}" + (" (required)" if self.required else "")] if self.course else []
        for key in ("models", "methods", "objectives", "strategies"):
            allowed = getattr(self, key)
            if allowed is not None:
                out.append(f"{key}: {', '.join(map(str, allowed))}")
        for key, what in _CAPS:
            cap = getattr(self, key)
            if cap is not None:
                out.append(
                    f"{key}: at most {cap:g}{what}"
                    if isinstance(cap, float)
                    else f"{key}: at most {cap}{what}"
                )
        if self.seed is not None:
            out.append(f"seed: {self.seed} (fixed)")
        if self.slurm is not None:
            out.append("runs go to SLURM: " + ", ".join(f"{k} {v}" for k, v in self.slurm.items()))
        for key, what in (("max_gpus", "GPUs per run"), ("max_time", "time per run"),
                          ("max_runs_at_once", "runs on the cluster at once")):  # fmt: skip
            if getattr(self, key) is not None:
                out.append(f"{key}: at most {getattr(self, key)} {what}")
        if self.sbatch_allowed:
            out.append(f"sbatch_allowed: {', '.join(self.sbatch_allowed)} (in slurm: extra)")
        for k, v in (self.data or {}).items():
            out.append(f"data.{k}: {v} (fixed)")
        out.append(f"trust_remote_code: {'allowed' if self.trust_remote_code else 'not allowed'}")
        out.append(f"hooks: {', '.join(self.hooks) + ' allowed' if self.hooks else 'none allowed'}")
        return out

    # ------------------------------------------------------------------------------------ applying
    def fill(self, raw: Mapping[Any, Any]) -> dict[Any, Any]:
        """``raw`` (a parsed config) with what the presets in force fix and the config leaves out filled
        in (this one's first)."""
        out = dict(raw)
        for preset in self.chain():
            out = preset._fill_one(out)
        return fill_requeues(self, out)

    def _fill_one(self, raw: Mapping[Any, Any]) -> dict[Any, Any]:
        out = dict(raw)
        dist = out.get("distributed")
        if self.slurm is not None and (dist is None or isinstance(dist, dict)):
            dist = dict(dist or {})
            own = dist.get("slurm")
            dist["slurm"] = {**self.slurm, **own} if isinstance(own, dict) else own or dict(self.slurm)
            out["distributed"] = dist
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

    def not_allowed(self, rule: str, what: str, value: Any, allowed: list[Any]) -> str:
        """The message for ``value`` outside ``rule`` (also used for values the planner chose)."""
        return (
            f"{what} {value!r} is not allowed by {self.where} (rule '{rule}'); "
            f"allowed: {', '.join(map(str, allowed))}"
        )

    def config_problems(self, raw: Mapping[Any, Any], base: Path) -> Items:
        """Violations in what the config says (after ``fill``) of every preset in force: (key path,
        message) pairs. Values left to ``auto``, the memory cap and the compute cap are checked once
        planned (nbtrain.control.prepare, which sits above both the preset and the planner)."""
        return [item for preset in self.chain() for item in preset._own_problems(raw, base)]

    def _own_problems(self, raw: Mapping[Any, Any], base: Path) -> Items:
        items: Items = []
        model = raw.get("model")
        if (
            self.models is not None
            and isinstance(model, str)
            and model
            and not self.model_allowed(model, base)
        ):
            items.append((("model",), self.not_allowed("models", "model", model, self.models)))
        method = raw.get("method", "lora")
        if self.methods is not None and method != "auto" and method not in self.methods:
            items.append((("method",), self.not_allowed("methods", "method", method, self.methods)))
        objective = raw.get("objective", "sft")
        if self.objectives is not None and objective not in self.objectives:
            what = "objective" if "objective" in raw else "objective (sft when not given)"
            items.append((("objective",), self.not_allowed("objectives", what, objective, self.objectives)))
        dist = raw.get("distributed")
        strategy = dist.get("strategy", "auto") if isinstance(dist, dict) else "auto"
        if self.strategies is not None and strategy != "auto" and strategy not in self.strategies:
            items.append(
                (
                    ("distributed", "strategy"),
                    self.not_allowed("strategies", "strategy", strategy, self.strategies),
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
            and steps != 0
            and steps >= -1  # 0 and below -1: out of max_steps' own range, said by the field check
        ):
            shown = f"{steps} (train for num_train_epochs)" if steps < 1 else str(steps)
            items.append(
                (
                    ("train", "max_steps"),
                    f"max_steps {shown} is over the cap of {self.where} (rule 'max_steps'); "
                    f"allowed: 1 to {cap}",
                )
            )
        items += self._remote_code_problems(raw, train)
        items += self._hooks_problems(raw.get("hooks"))
        items += self._distributed_problems(dist)
        items += slurm_problems(self, dist)
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

    def _remote_code_problems(self, raw: Mapping[Any, Any], train: Mapping[Any, Any]) -> Items:
        """trust_remote_code: true (top level, in train:, or in a train: *_kwargs mapping) runs the
        model's own Python code: refused unless the preset allows it."""
        if self.trust_remote_code:
            return []
        asked: list[tuple[str | int, ...]] = []
        if raw.get("trust_remote_code") is True:
            asked.append(("trust_remote_code",))
        for key, value in train.items():
            if key == "trust_remote_code" and value is True:
                asked.append(("train", key))
            elif isinstance(value, Mapping) and value.get("trust_remote_code") is True:
                asked.append(("train", str(key), "trust_remote_code"))
        return [
            (
                path,
                f"trust_remote_code: true runs Python code that comes with the model, which {self.where} "
                f"does not allow (rule 'trust_remote_code'); allowed: false (leave it out). The "
                f"instructor can allow it with trust_remote_code: true in the preset",
            )
            for path in asked
        ]

    def _hooks_problems(self, given: Any) -> Items:
        """hooks: keys the preset does not list (rule 'hooks'): refused, since notebook code in the trainer
        can overwrite what is graded (a callback rewriting the logged loss, a loss or metric that returns
        what it likes, rows made trivial)."""
        if not isinstance(given, Mapping):
            return []
        allowed = ", ".join(self.hooks) or "none"
        return [
            (
                ("hooks", str(key)),
                f"hooks: {key} runs notebook code inside training, where it can change what the course "
                f"grades (the loss, the logged metrics, the rows), which {self.where} does not allow (rule "
                f"'hooks'); allowed: {allowed}. The instructor can allow it with hooks: [{key}] in the "
                f"preset",
            )
            for key, value in given.items()
            if value not in (None, []) and key not in self.hooks
        ]

    def _distributed_problems(self, dist: Any) -> Items:
        dist = dist if isinstance(dist, Mapping) else {}
        items: Items = []
        nodes, per_node = dist.get("nodes", 1), dist.get("num_processes", "auto")
        nodes_given = isinstance(nodes, int) and not isinstance(nodes, bool)
        if self.max_nodes is not None and nodes_given and nodes > self.max_nodes:
            items.append(
                (
                    ("distributed", "nodes"),
                    f"nodes {nodes} is over the cap of {self.where} (rule 'max_nodes'); allowed: 1 to "
                    f"{self.max_nodes}",
                )
            )
        if (
            self.max_processes is not None
            and nodes_given
            and isinstance(per_node, int)
            and not isinstance(per_node, bool)
            and per_node * nodes > self.max_processes
        ):
            items.append(
                (
                    ("distributed", "num_processes"),
                    f"{per_node * nodes} training processes (num_processes {per_node} x {nodes} node(s)) "
                    f"are over the cap of {self.where} (rule 'max_processes'); allowed: 1 to "
                    f"{self.max_processes} in all",
                )
            )
        return items

    def model_allowed(self, model: str, base: Path) -> bool:
        """``model`` matches one of the ``models`` globs, part by part (``*`` never crosses a ``/``): a
        Hub-id pattern against the model as written (``.`` and ``..`` normalised away), a path pattern
        (relative to the preset file) against the folder the model names, with and without its links
        resolved."""
        if self.models is None:
            return True
        spec = os.path.expanduser(model)
        written = posixpath.normpath(spec)
        local = spec if os.path.isabs(spec) else os.path.join(base, spec)
        folders = {posixpath.normpath(local), str(Path(local).resolve())}
        for pattern in self.models:
            pat = os.path.expanduser(pattern)
            if pattern.startswith((".", "/", "~")):
                full = pat if os.path.isabs(pat) else os.path.join(self.source.parent, pat)
                patterns = {posixpath.normpath(full), str(Path(full).resolve())}
                if any(_glob_match(f, p) for f in folders for p in patterns):
                    return True
            elif _glob_match(written, posixpath.normpath(pat)):
                return True
        return False

    # ------------------------------------------------------------------------------------ the panel
    def locked(self) -> dict[str, Any]:
        """Config key paths the presets in force pin to one value: the panel shows them filled and
        disabled (this preset's value where two pin one)."""
        out: dict[str, Any] = {}
        for preset in self.chain():
            for key, value in preset._own_locked().items():
                out.setdefault(key, value)
        return out

    def _own_locked(self) -> dict[str, Any]:
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
        """The values the presets in force allow for a dropdown (``method``, ``objective``,
        ``distributed.strategy``): those every one of them allows, or None when none restricts it."""
        out: list[Any] | None = None
        for preset in self.chain():
            got = {
                "method": preset.methods,
                "objective": preset.objectives,
                "distributed.strategy": preset.strategies,
            }.get(path)
            if got is not None:
                out = list(got) if out is None else [x for x in out if x in got]
        return out


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _glob_match(name: str, pattern: str) -> bool:
    """``fnmatch`` part by part: the same number of ``/``-separated parts, each matching its glob."""
    names, patterns = name.split("/"), pattern.split("/")
    return len(names) == len(patterns) and all(map(fnmatch.fnmatchcase, names, patterns))


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
        with p.open(encoding="utf-8") as f:
            raw = load_yaml(f.read(MAX_BYTES + 1))  # yaml.safe_load, size and alias expansion bounded
    except YamlProblem as e:
        where = f" (line {e.line}" + (f", column {e.column}" if e.column else "") + ")" if e.line else ""
        raise _problem(p, str(e) + where) from None
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
    return _folder_preset(start)


def _folder_preset(start: Path | None = None) -> Path | None:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PRESET_FILE
        if candidate.is_file():
            return candidate
    return None


# ------------------------------------------------------------------------------- required courses


def courses_file() -> Path:
    """Where the required course presets seen here are remembered."""
    return home_dir() / "courses.json"


def _remembered() -> list[Path]:
    try:
        data = json.loads(courses_file().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ConfigError(
            [
                Problem(
                    "",
                    f"{courses_file()} (the required course presets seen here) cannot be read: {e}; "
                    f"fix it, or delete it to forget every course",
                )
            ]
        ) from None
    paths = data.get("required", []) if isinstance(data, dict) else []
    return [Path(x) for x in paths if isinstance(x, str)]


def _save_remembered(paths: list[Path]) -> None:
    courses_file().parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(courses_file(), {"required": [str(x) for x in dict.fromkeys(paths)]})


def leave_course(path: str | Path | None = None) -> list[Path]:
    """Stop applying a required course preset here (all of them when ``path`` is None): leaving a course
    on purpose. Returns the presets forgotten."""
    known = _remembered()
    gone = known if path is None else [p for p in known if p == Path(path).expanduser().resolve()]
    if gone:
        _save_remembered([p for p in known if p not in gone])
    return gone


def _required_presets(found: Preset | None) -> list[Preset]:
    """The remembered required course presets other than ``found``, each still required (one whose
    instructor dropped ``required`` is forgotten); one whose file is gone stops everything."""
    known = _remembered()
    if found is not None and found.required and found.source not in known:
        known.append(found.source)
        _save_remembered(known)
    out: list[Preset] = []
    for src in known:
        if found is not None and src == found.source:
            continue
        if not src.is_file():
            raise ConfigError(
                [
                    Problem(
                        "",
                        f"the course preset {src} says required: true, and it is gone (moved or deleted): "
                        f"a required course's rules apply wherever you work once nbtrain has seen them, so "
                        f"nothing starts without them. Put the file back, or leave the course on purpose: "
                        f"from nbtrain.control.config.preset import leave_course; leave_course({str(src)!r})",
                    )
                ]
            )
        preset = load_preset(src)
        if preset.required:
            out.append(preset)
        else:
            leave_course(src)  # the instructor released it
    return out


def find_preset(start: Path | None = None) -> Preset | None:
    """The lab preset in force here, or None: $NBTRAIN_PRESET or the ``nbtrain.lab.yaml`` in the working
    directory or above, together with every required course preset (``chain()``): one seen before and
    remembered, or the folder's own when $NBTRAIN_PRESET points elsewhere."""
    path = preset_path(start)
    found = load_preset(path) if path is not None else None
    extra: list[Preset] = []
    folder = _folder_preset(start) if os.environ.get(PRESET_ENV) else None
    if folder is not None and folder != path:
        near = load_preset(folder)
        if near.required:
            extra.append(near)
            if near.source not in _remembered():
                _save_remembered([*_remembered(), near.source])
    extra += [p for p in _required_presets(found) if all(p.source != e.source for e in extra)]
    if found is None:
        if not extra:
            return None
        found, extra = extra[0], extra[1:]
    found._also = extra
    return found


__all__ = [
    "PRESET_ENV",
    "PRESET_FILE",
    "Preset",
    "courses_file",
    "find_preset",
    "leave_course",
    "load_preset",
    "preset_path",
]
