"""The panel's fields: one PanelField per key the form shows (its widget kind, label, choices and the
reference's description as its tooltip), the text <-> YAML scalar rules of its text boxes, and the
mapping from a run's config back to the form."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, get_args

import yaml
from pydantic import BaseModel

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import reference
from nbtrain.control.config.choices import METHODS
from nbtrain.control.config.preset import Preset
from nbtrain.control.config.schema import (
    DataSettings,
    DistributedSettings,
    LoraSettings,
    QuantSettings,
    RunConfig,
    SweepSettings,
)
from nbtrain.control.config.trainargs import sft_fields

# The strategy dropdown offers what the schema accepts; were that one value, it would show disabled.
STRATEGY_CHOICES: Final = get_args(DistributedSettings.model_fields["strategy"].annotation)
PRECISIONS: Final = get_args(RunConfig.model_fields["precision"].annotation)
DATA_FORMATS: Final = get_args(DataSettings.model_fields["format"].annotation)
# Top-level keys in the order the YAML is written (RunConfig's order); unknown keys follow.
TOP_ORDER: Final = (
    "model",
    "method",
    "objective",
    "rewards",
    "data",
    "train",
    "lora",
    "quantization",
    "precision",
    "distributed",
    "trust_remote_code",
    "name",
    "sweep",
)
SECTIONS: Final = frozenset({"data", "train", "lora", "quantization", "distributed", "sweep"})


class _Unset:
    """A field the user left empty: the key is not written and the validator's default applies."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


# ------------------------------------------------------------------------------- scalar text fields
# Number-like fields are text boxes holding one YAML scalar, so what a user types is validated exactly
# as the same text in a %%finetune cell would be (a wrong value gets the validator's message instead
# of being silently coerced by a numeric widget), and an empty box means "not set".

_NUMBER = re.compile(r"^[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def parse_scalar(text: str) -> Any:
    """The value a scalar text box holds: UNSET when empty, else what YAML would read.

    Python's number syntax is accepted too (``3e-4``, as a %%finetune cell reads it: YAML 1.2's floats),
    because that is what people type for a learning rate.
    """
    s = text.strip()
    if not s:
        return UNSET
    if _NUMBER.match(s):  # the regex lets through a few non-numbers ("1_"): those fall back to YAML
        with contextlib.suppress(ValueError):
            return int(s)
        with contextlib.suppress(ValueError):
            return float(s)
    try:
        return yaml.safe_load(s)
    except yaml.YAMLError:
        return s


def parse_names(text: str) -> Any:
    """A names box (``rewards:``): names split at commas, each entry read as YAML, so a reward model's
    ``{model: RUN}`` is a mapping; UNSET when empty."""
    try:
        items = yaml.safe_load(f"[{text}]")
    except yaml.YAMLError:
        items = None
    if not isinstance(items, list):  # not a YAML list: the names as typed, for the validator to judge
        items = [part.strip() for part in text.split(",")]
    names = [x for x in items if x not in (None, "")]
    return names or UNSET


def format_scalar(value: Any) -> str:
    """The text for ``value`` in a scalar box; ``parse_scalar(format_scalar(v)) == v`` (type included)."""
    if value is UNSET:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    out = yaml.safe_dump(value, default_flow_style=True, width=1_000_000, allow_unicode=True)
    out = out.removesuffix("\n...\n").strip()
    if same_value(parse_scalar(out), value):
        return out
    # A string YAML would read as something else (e.g. "1e5", or one with a comma): quote it.
    return json.dumps(value, ensure_ascii=False)


def parse_targets(text: str) -> Any:
    """lora.target_modules: 'auto', 'all-linear', ``[q_proj, v_proj]``, or ``q_proj, v_proj``."""
    s = text.strip()
    if "," in s and s[0] not in "[{'\"":
        return [part.strip() for part in s.split(",") if part.strip()]
    return parse_scalar(s)


def format_targets(value: Any) -> str:
    if isinstance(value, str) and "," in value:
        return json.dumps(value, ensure_ascii=False)
    return format_scalar(value)


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type (YAML round trips must not turn 1 into 1.0 or True into 1)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


# ----------------------------------------------------------------------------------------- fields


@dataclass(frozen=True)
class PanelField:
    path: str  # the dotted key path, as in Problem.path ("train.learning_rate")
    kind: str  # "text" | "path" (a string, with local candidates) | "scalar" (one YAML scalar) | "choice"
    group: str  # the field group (GROUPS), each shown in one step of the flow (STEPS)
    label: str = ""  # what a person reads; the key path is in the tooltip
    choices: tuple[Any, ...] = ()  # dropdown values, or suggestions for a scalar box
    default: Any = UNSET  # a dropdown's value when nothing is set
    placeholder: str = ""
    help: str = ""  # what the key means, where the config's fields do not say (train: keys: TRL's words)
    note: str = ""  # what only the panel knows (where its list comes from, ...), after the meaning
    option_labels: Mapping[Any, str] = field(default_factory=dict)  # a dropdown value's words

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def key(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def tooltip(self) -> str:
        """The YAML key the field writes, then what it means: the config field's own description
        (config/reference.py, the one source the completer and %finetune help read too)."""
        meaning = self.help or reference.keys().get(self.path, {}).get("description", "")
        text = " ".join(x for x in (meaning, self.note) if x)
        return f"{self.path}: {text}"[:400] if text else self.path

    def options(self) -> list[tuple[str, Any]]:
        """A dropdown's (label, value) pairs; the value that applies when nothing is set says so."""
        out = []
        for c in self.choices:
            label = self.option_labels.get(c, str(c))
            if self.default is not UNSET and same_value(c, self.default):
                label += " (default)"
            out.append((label, c))
        return out


# Field groups, in the order they show, and the steps of the flow they belong to (model -> method -> data
# -> hyperparameters -> start).
GROUPS: Final = ("Model", "Method", "LoRA", "QLoRA", "Data", "Training", "Sweep", "Run")
STEPS: Final = (
    ("Model", "what to fine-tune", ("Model",)),
    ("Method", "how much of it to train, and towards what", ("Method", "LoRA", "QLoRA")),
    ("Data", "what to train on", ("Data",)),
    (
        "Hyperparameters",
        "how long and how fast; an empty box keeps the value it shows; values separated by commas: a sweep",
        ("Training", "Sweep"),
    ),
    ("Start", "launch it here, or put it in a %%finetune cell", ("Run",)),
)

METHOD_WORDS: Final = {
    "lora": "LoRA: small adapters, the model frozen",
    "qlora": "QLoRA: LoRA on a 4/8-bit quantized model",
    "full": "full fine-tuning: every weight",
}
STRATEGY_WORDS: Final = {
    "auto": "auto: one process per GPU found",
    "none": "none: one process",
    "ddp": "DDP: a copy per GPU",
    "zero1": "ZeRO-1 (DeepSpeed)",
    "zero2": "ZeRO-2 (DeepSpeed)",
    "zero3": "ZeRO-3 (DeepSpeed)",
    "fsdp": "FSDP (PyTorch)",
}
SWEEP_METHOD_WORDS: Final = {
    "grid": "grid: every combination of the values",
    "random": "random: trials drawn from them",
    "tpe": "TPE (Optuna): learns from finished trials",
}
PRUNE_WORDS: Final = {
    "none": "no: every trial runs to its end",
    "median": "median: worse than earlier trials' median",
    "hyperband": "Hyperband: successive halving",
}
PRECISION_WORDS: Final = {
    "auto": "auto: bf16 where supported",
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
}
# Human labels of the TRL / transformers keys the Hyperparameters step shows, in this order.
TRAIN_LABELS: Final = {
    "max_steps": "Max steps",
    "num_train_epochs": "Epochs",
    "learning_rate": "Learning rate",
    "per_device_train_batch_size": "Batch size per device",
    "gradient_accumulation_steps": "Gradient accumulation",
    "max_length": "Max sequence length",
    "lr_scheduler_type": "LR schedule",
    "warmup_steps": "Warm-up steps",
    "optim": "Optimizer",
}


def _default_text(v: Any) -> str:
    return "null" if v is None else format_scalar(v)


def _schema_default(model: type[BaseModel], key: str) -> Any:
    return model.model_fields[key].get_default(call_default_factory=True)


def panel_fields() -> list[PanelField]:
    """The fields the panel shows, in display order (also the order of keys within a YAML section)."""
    sft = sft_fields()

    def train(key: str, placeholder: str | None = None) -> list[PanelField]:
        spec = sft.get(key)
        if spec is None:  # another TRL release without this key: the YAML can still hold it
            return []
        label = TRAIN_LABELS[key]
        if spec.choices and spec.kinds == ("str",):
            # an enum of transformers (SchedulerType, OptimizerNames): a dropdown of its values, the
            # TRL default shown and written only once the user picks something
            return [
                PanelField(
                    f"train.{key}",
                    "choice",
                    "Training",
                    label,
                    tuple(spec.choices),
                    spec.default,
                    help=spec.help,
                )
            ]
        return [
            PanelField(
                f"train.{key}",
                "scalar",
                "Training",
                label,
                choices=spec.choices or (),
                placeholder=placeholder or f"default {_default_text(spec.default)}",
                help=spec.help,
            )
        ]

    lora_default = {k: _schema_default(LoraSettings, k) for k in LoraSettings.model_fields}
    return [
        PanelField(
            "model",
            "path",
            "Model",
            "Model",
            placeholder="./model-dir or org/name",
            note="The list offers those found here and in the Hugging Face cache.",
        ),
        PanelField(
            "method",
            "choice",
            "Method",
            "Method",
            choices=METHODS,
            default=_schema_default(RunConfig, "method"),
            option_labels=METHOD_WORDS,
        ),
        PanelField(
            "objective",
            "choice",
            "Method",
            "Objective",
            choices=tuple(OBJECTIVES),
            default=_schema_default(RunConfig, "objective"),
            option_labels={k: f"{k}: {o.summary}" for k, o in OBJECTIVES.items()},
        ),
        PanelField(
            "lora.r",
            "scalar",
            "LoRA",
            "LoRA rank",
            placeholder=f"default {lora_default['r']}",
        ),
        PanelField(
            "lora.alpha",
            "scalar",
            "LoRA",
            "LoRA alpha",
            placeholder=f"default {lora_default['alpha']}",
        ),
        PanelField(
            "lora.dropout",
            "scalar",
            "LoRA",
            "LoRA dropout",
            placeholder=f"default {lora_default['dropout']}",
        ),
        PanelField(
            "lora.target_modules",
            "targets",
            "LoRA",
            "Target modules",
            placeholder="default auto (or all-linear, or q_proj, v_proj)",
        ),
        PanelField(
            "quantization.bits",
            "choice",
            "QLoRA",
            "Quantization",
            choices=(4, 8),
            default=_schema_default(QuantSettings, "bits"),
            option_labels={4: "4-bit", 8: "8-bit"},
        ),
        PanelField(
            "data.train",
            "path",
            "Data",
            "Training data",
            placeholder="data/train.jsonl",
            note="The list offers those found here.",
        ),
        PanelField(
            "data.dataset",
            "text",
            "Data",
            "Dataset name",
            placeholder="only for a dataset_info.json",
        ),
        PanelField(
            "data.format",
            "choice",
            "Data",
            "Format",
            choices=DATA_FORMATS,
            default=_schema_default(DataSettings, "format"),
        ),
        PanelField(
            "data.eval_split",
            "scalar",
            "Data",
            "Held out for eval",
            placeholder="e.g. 0.1 (none by default)",
        ),
        PanelField(
            "rewards",
            "names",
            "Data",
            "Rewards",
            placeholder="my_reward, format_reward, {model: RUN}",
        ),
        *train("max_steps", "default -1 (train for the epochs)"),
        *train("num_train_epochs"),
        *train("learning_rate"),
        *train("per_device_train_batch_size"),
        *train("gradient_accumulation_steps"),
        *train("max_length"),
        *train("lr_scheduler_type"),
        *train("warmup_steps"),
        *train("optim"),
        PanelField(
            "precision",
            "choice",
            "Training",
            "Precision",
            choices=PRECISIONS,
            default=_schema_default(RunConfig, "precision"),
            option_labels=PRECISION_WORDS,
        ),
        # shown once a box holds several values (ui/panel/sweepform.py): how the sweep tries them
        PanelField(
            "sweep.method",
            "choice",
            "Sweep",
            "Sweep method",
            choices=get_args(SweepSettings.model_fields["method"].annotation),
            default="grid",  # the lists typed in the boxes: every combination, unless another is picked
            option_labels=SWEEP_METHOD_WORDS,
        ),
        PanelField("sweep.trials", "scalar", "Sweep", "Trials", placeholder="grid: every combination"),
        PanelField("sweep.metric", "text", "Sweep", "Metric", placeholder="default eval_loss"),
        PanelField(
            "sweep.prune",
            "choice",
            "Sweep",
            "Stop bad trials",
            choices=get_args(SweepSettings.model_fields["prune"].annotation),
            default=_schema_default(SweepSettings, "prune"),
            option_labels=PRUNE_WORDS,
        ),
        PanelField(
            "sweep.at_once", "scalar", "Sweep", "At once", placeholder="default auto (cores and memory)"
        ),
        PanelField(
            "name",
            "text",
            "Run",
            "Run name",
            placeholder="default <model>-<method>",
        ),
        PanelField(
            "distributed.strategy",
            "choice",
            "Run",
            "Distributed",
            choices=STRATEGY_CHOICES,
            default=_schema_default(DistributedSettings, "strategy"),
            note="More settings (num_processes, offload, ...) in the YAML.",
            option_labels=STRATEGY_WORDS,
        ),
    ]


def section_active(section: str, method: Any) -> bool:
    """Whether a method-specific section belongs in the YAML; a hidden section is never written."""
    if section == "lora":
        return method != "full"
    if section == "quantization":
        return method == "qlora"
    return True


def _section_model(key: str) -> type[BaseModel] | None:
    """The settings model of a RunConfig section (``lora`` -> LoraSettings), read from the schema."""
    f = RunConfig.model_fields.get(key)
    if f is None:
        return None
    ann = f.annotation
    subs = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return subs[0] if subs else None


def _is_default(model: type[BaseModel], key: str, value: Any) -> bool:
    f = model.model_fields.get(key)
    if f is None or f.is_required():
        return False
    default = f.get_default(call_default_factory=True)
    return bool(value == default) and isinstance(value, bool) == isinstance(default, bool)


def config_from_run(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A run's resolved config (every default filled in) reduced to the keys that differ from defaults."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        model = _section_model(key)
        if model is not None and isinstance(value, Mapping):
            sub = {k: v for k, v in value.items() if not _is_default(model, k, v)}
            if key == "data" and isinstance(sub.get("train"), list):  # sources: only what was set
                sub["train"] = [
                    {k: v for k, v in s.items() if v is not None} if isinstance(s, Mapping) else s
                    for s in sub["train"]
                ]
            if sub or key == "data":
                out[key] = sub
        elif key == "train":
            if value:
                out[key] = dict(value)
        elif not _is_default(RunConfig, key, value):
            out[key] = value
    return out


def preset_fields(spec: list[PanelField], preset: Preset | None) -> list[PanelField]:
    """``spec`` with each dropdown offering only what the lab ``preset`` allows."""
    if preset is None:
        return spec
    out = []
    for f in spec:
        allowed = preset.choices(f.path) if f.kind == "choice" else None
        if allowed:
            default = f.default if f.default in allowed else allowed[0]
            f = replace(
                f, choices=tuple(allowed), default=default, help=f"{f.help} (the lab preset allows these)"
            )
        out.append(f)
    return out
