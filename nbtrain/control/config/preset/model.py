"""The preset model: the rules of ``nbtrain.lab.yaml`` (the package's docstring shows them all) as typed
fields checked as the file is read, what the presets in force fill in, and what the panel shows of them
(their rules in words, the values they pin, the choices they leave). The rules themselves are
configrules.py, slurmrules.py and planrules.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from nbtrain.contract.hooks import KEYS as hook_keys
from nbtrain.control.config.choices import AvailableObjective, Method, Strategy
from nbtrain.control.launch import sbatch

PRESET_FILE = "nbtrain.lab.yaml"
PRESET_ENV = "NBTRAIN_PRESET"
# data: keys a preset may fix (those of DataSettings that name what is trained on, not how it is read)
DATA_KEYS = ("train", "eval", "format", "eval_split", "max_samples", "columns")
PATH_KEYS = ("train", "eval", "path")  # whose string values are paths (or hub ids) in data:


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
        if v is not None and sbatch.slurm_seconds(v) is None:
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
        return {k: self._preset_path(v) if k in PATH_KEYS else v for k, v in (self.data or {}).items()}

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
