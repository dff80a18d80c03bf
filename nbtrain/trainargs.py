"""Validate ``train:`` keys against the TRL config of the run's objective without importing TRL.

``objective: sft`` takes SFTConfig names, ``dpo`` DPOConfig, ``orpo`` ORPOConfig, ``kto`` KTOConfig and
``grpo`` GRPOConfig (see nbtrain.objectives). Each field list comes from a JSON snapshot shipped with
the package (nbtrain/assets/<objective>_fields.json, made by ``nbtrain.worker.introspect`` for the
versions nbtrain is tested with). If the installed TRL or transformers differ, the snapshot is made
again once in a subprocess and cached under NBTRAIN_HOME.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from nbtrain.objectives import OBJECTIVES
from nbtrain.paths import home_dir

# Keys nbtrain sets itself: say where the setting lives instead.
MANAGED = {
    "output_dir": "nbtrain writes checkpoints to <run dir>/checkpoints and the result to <run dir>/output",
    "logging_dir": "nbtrain keeps logs in <run dir>/logs",
    "use_cpu": "the plan chooses the device from the hardware it finds",
    "no_cuda": "the plan chooses the device from the hardware it finds",
    "local_rank": "the launcher sets the rank",
    "deepspeed": "DeepSpeed is chosen by `distributed:` (multi-process support), not by train.deepspeed",
    "resume_from_checkpoint": "resuming is done by nbtrain from the run directory",
    "overwrite_output_dir": "each run has its own directory",
}

# Common names from other tools and older TRL/transformers releases.
RENAMED = {
    "max_seq_length": "max_length",
    "max_seq_len": "max_length",
    "sequence_len": "max_length",
    "evaluation_strategy": "eval_strategy",
    "lr": "learning_rate",
    "epochs": "num_train_epochs",
    "num_epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "micro_batch_size": "per_device_train_batch_size",
    "train_batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size",
    "gradient_accumulation": "gradient_accumulation_steps",
    "grad_accum": "gradient_accumulation_steps",
    "warmup": "warmup_steps",
    "scheduler": "lr_scheduler_type",
    "optimizer": "optim",
}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kinds: tuple[str, ...]
    choices: tuple[str, ...] | None
    optional: bool
    default: Any
    help: str

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "list": isinstance(value, list),
            "dict": isinstance(value, dict),
            "any": True,
        }
        if not any(ok[k] for k in self.kinds):
            return False
        if self.choices and isinstance(value, str) and "str" in self.kinds:
            return value in self.choices
        return True

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        names = {
            "bool": "true/false",
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "list": "a list",
            "dict": "a mapping",
            "any": "any value",
        }
        parts = [names[k] for k in self.kinds]
        if self.optional:
            parts.append("null")
        return " or ".join(parts)


def _installed_versions() -> dict[str, str]:
    out = {}
    for pkg in ("trl", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "missing"
    return out


# Fields whose type hint is narrower than what the TRL config accepts (its __post_init__ converts).
_ALSO_ACCEPTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("dpo", "loss_type"): ("str",),  # DPOConfig turns loss_type: sigmoid into ["sigmoid"]
}


def config_name(objective: str = "sft") -> str:
    """The TRL config class whose names ``train:`` takes for ``objective`` (e.g. "DPOConfig")."""
    return OBJECTIVES[objective].config_class.split(":")[1]


@lru_cache(maxsize=8)
def fields_for(objective: str = "sft") -> dict[str, FieldSpec]:
    """The settable fields of the TRL config of ``objective``, from the shipped or a regenerated snapshot."""
    if objective not in OBJECTIVES:
        raise KeyError(f"no TRL config for objective {objective!r}")
    asset = f"assets/{objective}_fields.json"
    snapshot = json.loads(resources.files("nbtrain").joinpath(asset).read_text("utf-8"))
    versions = _installed_versions()
    data = snapshot
    if snapshot["versions"] != versions and "missing" not in versions.values():
        cache = (
            home_dir()
            / "cache"
            / f"{objective}_fields-trl{versions['trl']}-tf{versions['transformers']}.json"
        )
        if not cache.exists():
            # A subprocess keeps TRL (and torch) out of the kernel; it runs once per version pair.
            subprocess.run(
                [sys.executable, "-m", "nbtrain.worker.introspect", str(cache), objective],
                check=True,
                capture_output=True,
                timeout=300,
            )
        data = json.loads(Path(cache).read_text("utf-8"))
    out = {}
    for name, f in data["fields"].items():
        kinds = tuple(f["kinds"]) + _ALSO_ACCEPTS.get((objective, name), ())
        choices = tuple(f["choices"]) if f["choices"] else None
        out[name] = FieldSpec(name, kinds, choices, bool(f["optional"]), f["default"], f["help"])
    return out


def sft_fields() -> dict[str, FieldSpec]:
    return fields_for("sft")


def check_key(key: str, objective: str = "sft") -> str | None:
    """None if ``key`` is a settable name of the objective's TRL config, else what to do instead."""
    fields = fields_for(objective)
    if key in MANAGED:
        return f"'{key}' is not set here: {MANAGED[key]}"
    if key in fields:
        return None
    if key in RENAMED and RENAMED[key] in fields:
        return f"unknown key '{key}'; did you mean '{RENAMED[key]}'? (the TRL/transformers name)"
    close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.7)
    msg = f"unknown key '{key}'"
    if close:
        msg += f"; did you mean '{close[0]}'?"
    else:
        # A key of another objective's config is a common slip (beta under objective: sft, ...): say which.
        owners = [o for o in OBJECTIVES if o != objective and key in fields_for(o)]
        if owners:
            which = " or ".join(f"objective: {o}" for o in owners)
            msg += f" for objective: {objective}; it belongs to {which}"
    return msg + (
        f" (train: takes TRL {config_name(objective)} / TrainingArguments names; {len(fields)} are known)"
    )


def yaml_number_hint(value: Any) -> str:
    """PyYAML reads ``3e-4`` (no dot) as a string: say so, since the value looks right to a person."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        fixed = (
            value
            if "." in value.split("e")[0].split("E")[0]
            else value.replace("e", ".0e", 1).replace("E", ".0E", 1)
        )
        return f" (YAML reads {value} as text; write {fixed} so it is a number)"
    return ""


def check_value(key: str, value: Any, objective: str = "sft") -> str | None:
    spec = fields_for(objective)[key]
    if spec.accepts(value):
        return None
    hint = yaml_number_hint(value) if {"int", "float"} & set(spec.kinds) else ""
    return f"{value!r} is not valid for {key}: expected {spec.expected()}{hint}"
