"""Validate ``train:`` keys against the TRL config of the run's objective without importing TRL.

``objective: sft`` takes SFTConfig names, ``dpo`` DPOConfig, ``orpo`` ORPOConfig, ``kto`` KTOConfig,
``reward`` RewardConfig, ``grpo`` GRPOConfig and ``rloo`` RLOOConfig (see nbtrain.contract.objectives).
Each field list comes from a JSON snapshot shipped with the package (nbtrain/assets/<objective>_fields.json,
made by ``nbtrain.worker.introspect`` for the versions nbtrain is tested with). If the installed TRL or
transformers differ, the snapshot is made again once in a subprocess and cached under NBTRAIN_HOME.
"""

from __future__ import annotations

import difflib
import json
import math
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from nbtrain.contract.adapters import NBTRAIN_LORA_KEYS
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.contract.paths import home_dir

# Keys nbtrain sets itself: say where the setting lives instead.
MANAGED = {
    "output_dir": "nbtrain writes checkpoints to <run dir>/checkpoints and the result to <run dir>/output",
    "logging_dir": "nbtrain keeps logs in <run dir>/logs",
    "use_cpu": "the plan chooses the device from the hardware it finds",
    "no_cuda": "the plan chooses the device from the hardware it finds",
    "local_rank": "the launcher sets the rank",
    "deepspeed": "DeepSpeed is chosen by `distributed:` (multi-process support), not by train.deepspeed",
    "fsdp": "FSDP is chosen by `distributed: {strategy: fsdp}`, not by train.fsdp",
    "fsdp_config": "nbtrain writes the FSDP settings from `distributed: {strategy: fsdp}`",
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


def _installed_versions(packages: tuple[str, ...] = ("trl", "transformers")) -> dict[str, str]:
    out = {}
    for pkg in packages:
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


@lru_cache(maxsize=16)  # one per objective, and peft's LoraConfig
def fields_for(objective: str = "sft") -> dict[str, FieldSpec]:
    """The settable fields of the TRL config of ``objective``, from the shipped or a regenerated snapshot."""
    if objective not in OBJECTIVES and objective != LORA:
        raise KeyError(f"no TRL config for objective {objective!r}")
    asset = f"assets/{objective}_fields.json"
    snapshot = json.loads(resources.files("nbtrain").joinpath(asset).read_text("utf-8"))
    versions = _installed_versions(("peft",) if objective == LORA else ("trl", "transformers"))
    data = snapshot
    if snapshot["versions"] != versions and "missing" not in versions.values():
        tag = "-".join(f"{k}{v}" for k, v in sorted(versions.items()))
        cache = home_dir() / "cache" / f"{objective}_fields-{tag}.json"
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


def default(objective: str, field: str) -> Any:
    """TRL's (or transformers') default for ``field`` of ``objective``'s config, read from the snapshot: the
    one place a kernel-side consumer gets one, never re-typed (they differ by objective: learning_rate is
    2e-5 for SFT, 1e-6 for DPO; ``tests/control/config/test_trainargs_defaults.py`` checks)."""
    return fields_for(objective)[field].default


def value(args: Mapping[str, Any], field: str, objective: str = "sft") -> Any:
    """``args[field]`` where the training args set it, else TRL's default for it (``default``)."""
    return args[field] if field in args else default(objective, field)


# ------------------------------------------------------------------------------------------- lora:
LORA = "lora"  # fields_for(LORA): peft's LoraConfig, the names lora: takes beside nbtrain's own
# what nbtrain sets itself (nbtrain's own lora: keys are contract.adapters.NBTRAIN_LORA_KEYS)
LORA_MANAGED = {
    "lora_alpha": "write alpha: (nbtrain's name for it)",
    "lora_dropout": "write dropout: (nbtrain's name for it)",
    "task_type": "nbtrain sets it (a causal language model)",
    "peft_type": "nbtrain sets it (LoRA)",
    "auto_mapping": "peft fills it in",
    "peft_version": "peft fills it in",
    "base_model_name_or_path": "it is model: (the base the adapter goes on)",
    "revision": "it is revision: at the top level",
    "inference_mode": "training needs it off; the server and export load the adapter for inference",
    "megatron_config": "nbtrain does not train with Megatron-LM",
    "megatron_core": "nbtrain does not train with Megatron-LM",
    "runtime_config": "peft fills it in",
}
# Initialisations that need more than a flag (a calibration dataset, or their own quantisation):
NEEDS_MORE = {
    "loftq": "init_lora_weights: loftq needs a quantized base and peft's loftq_config (LoftQ quantises the "
             "base itself); not supported by nbtrain: use pissa or olora (method: lora), or method: qlora",
    "eva": "init_lora_weights: eva needs a calibration pass over the data (peft's eva_config); not supported "
           "by nbtrain: use pissa or olora",
    "corda": "init_lora_weights: corda needs a calibration pass over the data (peft's corda_config); not "
             "supported by nbtrain: use pissa or olora",
    "lora_ga": "init_lora_weights: lora_ga needs gradient estimates (peft's lora_ga_config); not supported "
               "by nbtrain: use pissa or olora",
}  # fmt: skip
LORA_EXTRA = {"loraplus_lr_ratio": "LoRA+: how much faster the B matrices learn than A (e.g. 16)"}


def check_lora_key(key: str) -> str | None:
    """None if ``key`` may be written in lora: (nbtrain's names, peft's LoraConfig fields, LoRA+), else why
    not and what to write."""
    if key in NBTRAIN_LORA_KEYS:
        return None
    if key in LORA_MANAGED:
        return f"'{key}' is not set here: {LORA_MANAGED[key]}"
    fields = fields_for(LORA)
    if key in fields:
        return None
    known = list(dict.fromkeys([*NBTRAIN_LORA_KEYS, *(k for k in fields if k not in LORA_MANAGED)]))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
    hint = (
        f"; did you mean '{close[0]}'?"
        if close
        else f" (it takes peft's LoraConfig fields: {', '.join(known)})"
    )
    return f"unknown key '{key}' in lora:{hint}"


def check_lora_value(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``key`` of lora: (after check_lora_key), or None."""
    if key in NBTRAIN_LORA_KEYS and key not in LORA_EXTRA:
        return None  # nbtrain's own fields: the schema checks them
    if key == "loraplus_lr_ratio":
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
        return None if ok else f"loraplus_lr_ratio is {LORA_EXTRA[key]}: a positive number, not {value!r}"
    if key == "init_lora_weights" and isinstance(value, str) and value in NEEDS_MORE:
        return NEEDS_MORE[value]
    spec = fields_for(LORA)[key]
    if spec.accepts(value):
        return None
    if key == "init_lora_weights" and isinstance(value, str) and value.startswith("pissa_niter_"):
        return None  # pissa with fast SVD: "pissa_niter_[number of iterations]"
    return f"{value!r} is not valid for {key}: expected {spec.expected()}"


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
    """A number given as text (quoted in YAML, or a string in a dict): say so, since it looks right."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return f" ({value!r} is text; write it as a number, without quotes)"
    return ""


# ------------------------------------------------------------------------------------------- bounds
# TRL's and transformers' field metadata carries types, not ranges, and most of them check a range only
# when the trainer is built, in the training process (or never: learning_rate: .inf trains to loss 0.0 and
# "completes"). So the ranges are here, checked before anything starts.


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**63


_GE0 = (lambda x: _number(x) and x >= 0, "a finite number >= 0")
_GT0 = (lambda x: _number(x) and x > 0, "a finite number > 0")
_UNIT_OPEN = (lambda x: _number(x) and 0 <= x < 1, "a number from 0 up to (not including) 1")
_UNIT = (lambda x: _number(x) and 0 <= x <= 1, "a number from 0 to 1")
_INT_GE1 = (lambda x: _integer(x) and x >= 1, "an integer >= 1")
_INT_GE0 = (lambda x: _integer(x) and x >= 0, "an integer >= 0")
_SEED = (lambda x: _integer(x) and 0 <= x < 2**32, "an integer >= 0 (below 2**32, what numpy takes)")
# logging_steps, save_steps, eval_steps: a whole number of steps, or below 1 a fraction of the run
_STEPS = (
    lambda x: _number(x) and x > 0 and (x < 1 or float(x).is_integer()),
    "a whole number of steps >= 1, or a fraction of the run between 0 and 1",
)

BOUNDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "learning_rate": _GE0,
    "weight_decay": _GE0,
    "warmup_steps": _GE0,
    "warmup_ratio": _UNIT,
    "max_grad_norm": _GE0,
    "adam_beta1": _UNIT_OPEN,
    "adam_beta2": _UNIT_OPEN,
    "adam_epsilon": _GE0,
    "label_smoothing_factor": _UNIT,
    "neftune_noise_alpha": _GE0,
    "num_train_epochs": _GT0,
    "temperature": _GT0,
    "max_steps": (
        lambda x: _integer(x) and (x == -1 or x >= 1),
        "-1 (train for num_train_epochs) or an integer >= 1",
    ),
    "per_device_train_batch_size": _INT_GE1,
    "per_device_eval_batch_size": _INT_GE1,
    "gradient_accumulation_steps": _INT_GE1,
    "eval_accumulation_steps": _INT_GE1,
    "steps_per_generation": _INT_GE1,
    "generation_batch_size": _INT_GE1,
    "max_length": _INT_GE1,
    "max_prompt_length": _INT_GE1,
    "max_completion_length": _INT_GE1,
    "save_total_limit": _INT_GE1,
    "dataloader_num_workers": _INT_GE0,
    "seed": _SEED,
    "data_seed": _SEED,
    "logging_steps": _STEPS,
    "save_steps": _STEPS,
    "eval_steps": _STEPS,
}


def bound_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is out of range for ``key`` (naming the range), or None. ``None`` is left to the
    type check (the fields that take it say so)."""
    if value is None:
        return None
    bound = BOUNDS.get(key)
    if bound is not None:
        ok, allowed = bound
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            allowed += ", below 2**63"  # what torch and numpy take
        return None if ok(value) else f"{key}: {value!r} is out of range; allowed: {allowed}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}: {value!r} is not a number a trainer can use; allowed: a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return f"{key}: {value} is out of range; allowed: an integer that fits in 64 bits"
    return None


def non_finite(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], float]]:
    """(key path, value) of every .inf / .nan inside a mapping or list (lr_scheduler_kwargs, ...)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(path, value)]
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in non_finite(v, (*path, str(k)))]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in non_finite(v, (*path, i))]
    return []


# ----------------------------------------------------------------------------------------- choices

FEW = 8  # a list of choices this long or shorter is shown whole; a longer one by its closest names


def closest(value: str, choices: Sequence[str], n: int = 3, default: Any = None) -> list[str]:
    """The few ``choices`` closest to ``value``: one for a typo (``cosin`` -> ``cosine``), else names that
    start with it (the default first) and then similar ones (``adamw`` -> ``adamw_torch_fused``, ...)."""
    v = value.strip().lower()
    if v in choices:
        return [v]  # written in other capitals
    ratios = sorted(((difflib.SequenceMatcher(None, v, c).ratio(), c) for c in choices), reverse=True)
    if ratios and ratios[0][0] >= 0.85:
        return [ratios[0][1]]
    prefixed = sorted((c for c in choices if v and c.startswith(v)), key=lambda c: (c != default, len(c)))
    similar = [c for r, c in ratios if r >= 0.6 and c not in prefixed]
    return (prefixed + similar)[:n]


def one_of(names: Sequence[str], word: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


def choice_problem(key: str, value: Any, choices: Sequence[str], default: Any = None) -> str:
    """``value`` is not one of ``choices``: the closest names (did you mean ...?), all of them when they
    are few, else how many there are and a few, never a wall of names."""
    close = closest(value, choices, default=default) if isinstance(value, str) else []
    msg = f"{value!r} is not a value {key} takes"
    if close:
        msg += f"; did you mean {one_of(close)}?"
    if len(choices) <= FEW:
        return msg + f" Choose one of {', '.join(choices)}"
    if close:
        return msg + f" ({len(choices)} values are accepted; the default is {default})"
    few = [default, *sorted((c for c in choices if c != default), key=len)][:4] if default in choices else []
    few = few or sorted(choices, key=len)[:4]
    return msg + f": it takes one of {len(choices)} names, such as {', '.join(few)}"


def check_value(key: str, value: Any, objective: str = "sft") -> str | None:
    spec = fields_for(objective)[key]
    if spec.accepts(value):
        return bound_problem(key, value)
    if spec.choices and isinstance(value, str) and "str" in spec.kinds:
        return choice_problem(key, value, spec.choices, spec.default)
    hint = yaml_number_hint(value) if {"int", "float"} & set(spec.kinds) else ""
    return f"{value!r} is not valid for {key}: expected {spec.expected()}{hint}"
