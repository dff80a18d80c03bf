"""A widget form for a run config, for people who would rather not type YAML.

    import nbtrain; nbtrain.panel()            # or: %finetune panel

The form is another way to write the same YAML a ``%%finetune`` cell takes: it shows that YAML live,
validates it with ``nbtrain.control.prepare.validate``, the check Launch itself goes by (so every inline
error is the message launching would give, on the field it belongs to, and a form without errors
launches), previews the first data rows as the model will see them, and launches, stops, loads and
exports runs through ``nbtrain.control.start``.

Nothing here imports torch, transformers or bitsandbytes: the data preview renders the model's chat
template with jinja2 directly (the way transformers does), and validation that needs bitsandbytes runs
its probe in a subprocess (see ``nbtrain.control.config.schema``). Validation and the preview run in a
background thread, debounced, so typing never waits for them and a slow first check does not block the kernel.
"""

from __future__ import annotations

import contextlib
import copy
import html
import json
import math
import os
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, get_args

import ipywidgets as widgets
import yaml
from jinja2 import TemplateError
from pydantic import BaseModel

from nbtrain.contract.errors import ConfigError, NbtrainError, Problem
from nbtrain.contract.formats import (
    FILE_KINDS,
    FORMAT_HELP,
    FORMATS,
    RowError,
    apply_columns,
    detect_format,
    to_example,
)
from nbtrain.contract.gguf import cache_dir, is_gguf
from nbtrain.contract.objectives import OBJECTIVES, rewards_objectives
from nbtrain.contract.paths import runs_root
from nbtrain.control import start as api
from nbtrain.control.config import datasetinfo, reference
from nbtrain.control.config.chat_template import ChatTemplate, find_chat_template
from nbtrain.control.config.choices import METHODS
from nbtrain.control.config.datacheck import DataProblem, read_rows
from nbtrain.control.config.load import parse_source
from nbtrain.control.config.preset import Preset, find_preset
from nbtrain.control.config.schema import (
    DataSettings,
    DistributedSettings,
    LoraSettings,
    QuantSettings,
    RunConfig,
)
from nbtrain.control.config.trainargs import sft_fields
from nbtrain.control.hub import cache_dir as hub_cache_dir
from nbtrain.control.prepare import validate as validate_config
from nbtrain.control.runs.follow import FollowStopped, follow
from nbtrain.control.runs.run import Run, get_run
from nbtrain.ui.preview import CHIP_STYLE, THUMB_STYLE, segments_html

if TYPE_CHECKING:
    from nbtrain.ui.dashboard import Dashboard
    from nbtrain.ui.export_box import ExportBox

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
)
SECTIONS: Final = frozenset({"data", "train", "lora", "quantization", "distributed"})
PREVIEW_CHARS = 2000  # per message / rendered row, so one huge row cannot flood the notebook


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

    Python's number syntax is accepted too (``3e-4``; YAML 1.1 reads that as a string), because that
    is what people type for a learning rate.
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
    if _same(parse_scalar(out), value):
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


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type (YAML round trips must not turn 1 into 1.0 or True into 1)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
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
            if self.default is not UNSET and _same(c, self.default):
                label += " (default)"
            out.append((label, c))
        return out


# Field groups, in the order they show, and the steps of the flow they belong to (model -> method -> data
# -> hyperparameters -> start).
GROUPS: Final = ("Model", "Method", "LoRA", "QLoRA", "Data", "Training", "Run")
STEPS: Final = (
    ("Model", "what to fine-tune", ("Model",)),
    ("Method", "how much of it to train, and towards what", ("Method", "LoRA", "QLoRA")),
    ("Data", "what to train on", ("Data",)),
    ("Hyperparameters", "how long and how fast; an empty box keeps its default", ("Training",)),
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


def _section_active(section: str, method: Any) -> bool:
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


# ----------------------------------------------------------------------------------- chat template


# ------------------------------------------------------------------------------------ data preview


@dataclass
class PreviewRow:
    number: int  # the row's line (jsonl/csv) or position (json/parquet) in the file
    format: str
    example: dict[str, Any] | None = None  # {"messages": [...]} or {"text": ...}
    error: str | None = None
    segments: list[tuple[str, bool]] | None = None  # the chat template's rendering
    template_error: str | None = None
    thumbnails: list[str] = field(default_factory=list)  # the row's images (data: URIs), when it has some


@dataclass
class Preview:
    rows: list[PreviewRow] = field(default_factory=list)
    note: str | None = None  # why there is nothing (or less) to show
    template: ChatTemplate | None = None
    template_note: str | None = None
    mark_trained: bool = False


def _resolve(spec: str, base: Path) -> Path:
    p = Path(spec).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _section(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, Mapping) else {}


def data_preview(cfg: Mapping[str, Any], base: Path, n: int = 3) -> Preview:
    """The first ``n`` training rows of ``cfg`` normalised as the worker will, and chat-templated."""
    data = _section(cfg, "data")
    spec, fmt, dataset = data.get("train"), data.get("format", "auto"), data.get("dataset")
    note = None
    if isinstance(spec, list) and spec and isinstance(spec[0], Mapping):
        # Several sources: the first one's rows (the token-exact preview of the mix is %finetune preview).
        note = f"the first of {len(spec)} sources"
        first: Mapping[str, Any] = spec[0]
        fmt = first.get("format") or fmt
        spec, dataset = first.get("path"), first.get("dataset")
    if not isinstance(spec, str) or not spec.strip():
        return Preview(note="set data.train to see its first rows here")
    columns: dict[str, str] | None = None
    tags: dict[str, str] | None = None
    if isinstance(dataset, str) and dataset:  # a LLaMA-Factory dataset: its file, columns and tags
        try:
            entry = datasetinfo.resolve(spec, dataset, base)
        except (datasetinfo.InfoProblem, OSError) as e:
            return Preview(note=f"no preview: {e}")
        spec, columns, tags = entry.spec, entry.columns, entry.tags
    objective = cfg.get("objective", "sft")
    objective = objective if isinstance(objective, str) and objective in OBJECTIVES else "sft"
    path = _resolve(spec, base)
    if not path.exists():
        return Preview(note=f"no preview: {path} does not exist")
    kind = "disk" if path.is_dir() else FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        return Preview(note=f"no preview: cannot read {path.name}")
    try:
        raw = read_rows(path, kind, n)
    except (DataProblem, OSError, ValueError) as e:
        return Preview(note=f"no preview: {e}")
    if not raw:
        return Preview(note=f"no preview: {path.name} has no rows")

    out = Preview(mark_trained=bool(_section(cfg, "train").get("assistant_only_loss")), note=note)
    model = cfg.get("model")
    if isinstance(model, str) and model.strip():
        mdir = _resolve(model, base)
        if mdir.is_dir():
            try:
                out.template = find_chat_template(mdir)
            except (OSError, ValueError) as e:
                out.template_note = f"could not read the chat template of {mdir.name}: {e}"
            if out.template is None and out.template_note is None:
                out.template_note = f"{mdir.name} has no chat template (conversational data needs one)"
        else:
            out.template_note = (
                f"{model} is not a local directory: the chat template is shown once the model is on disk"
            )
    for number, row in raw:
        renamed = None
        if columns and isinstance(row, Mapping):
            try:
                row = apply_columns(row, columns)
            except RowError as e:
                renamed = str(e)
        use = fmt if fmt in FORMATS else (detect_format(row, objective) if isinstance(row, Mapping) else None)
        item = PreviewRow(number, use or "?")
        if renamed is not None:
            item.error = renamed
        elif use is None:
            item.error = "matches no known format"
        else:
            try:  # image rows as a vision model sees them
                item.example = to_example(row, use, vision=None, tags=tags)
            except RowError as e:
                item.error = str(e)
            if item.example and item.example.get("images"):
                item.thumbnails = thumbnails(item.example["images"], path.parent if kind != "disk" else path)
        msgs = item.example.get("messages") if item.example else None
        if msgs and out.template is not None:
            try:
                item.segments = out.template.segments(
                    msgs, item.example.get("tools") if item.example else None
                )
            except TemplateError as e:
                item.template_error = f"{type(e).__name__}: {e}"
        out.rows.append(item)
    return out


_ROLE_COLOURS = {"system": "#6a1b9a", "user": "#1565c0", "assistant": "#2e7d32", "tool": "#ef6c00"}
_PRE = "white-space:pre-wrap;margin:0;font-family:monospace;font-size:12px"


def _clip(s: str) -> str:
    return s if len(s) <= PREVIEW_CHARS else s[: PREVIEW_CHARS - 1] + "…"


def _message_html(m: Mapping[str, Any]) -> str:
    colour = _ROLE_COLOURS.get(m["role"], "#333")
    content = m["content"]
    if isinstance(content, list):  # a vision row's parts: its text, and where each image goes
        body = "".join(
            f"<span style='{CHIP_STYLE}'>image</span>"
            if p.get("type") == "image"
            else html.escape(str(p.get("text")))
            for p in content
        )
    else:
        body = html.escape(_clip(str(content or "")))
    for call in m.get("tool_calls") or []:  # an assistant turn that calls tools: each call, readable
        fn = call.get("function") or {} if isinstance(call, Mapping) else {}
        args = fn.get("arguments")
        text = f"{fn.get('name')}({args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})"
        body += ("\n" if body else "") + f"<span style='{CHIP_STYLE}'>call</span> " + html.escape(_clip(text))
    role = m["role"] + (f" · {m['name']}" if m["role"] == "tool" and m.get("name") else "")
    return (
        f"<div><span style='color:{colour};font-weight:bold'>{html.escape(role)}</span>"
        f"<pre style='{_PRE};margin-left:1em'>{body}</pre></div>"
    )


def _tools_html(tools: list[Mapping[str, Any]]) -> str:
    """A row's tool definitions, collapsed to their names; open, one signature a line (each parameter
    with its JSON type, the required ones without a "?") and the description in grey."""
    names, lines = [], []
    for t in tools:
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping):
            continue
        given = fn.get("parameters")
        params: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        listed = params.get("properties")
        props: Mapping[str, Any] = listed if isinstance(listed, Mapping) else {}
        required = set(params.get("required") or [])
        args = ", ".join(
            f"{k}{'' if k in required else '?'}: {v.get('type', 'any') if isinstance(v, Mapping) else 'any'}"
            for k, v in props.items()
        )
        name = str(fn.get("name"))
        names.append(name)
        about = str(fn.get("description") or "")
        grey = f" <span style='color:#777'>{html.escape(about)}</span>" if about else ""
        lines.append(html.escape(f"{name}({args})") + grey)
    return (
        f"<details><summary><span style='color:#ef6c00;font-weight:bold'>tools</span> "
        f"<small>({len(names)}: {html.escape(', '.join(names))})</small></summary>"
        f"<pre style='{_PRE};margin-left:1em'>{'<br>'.join(lines)}</pre></details>"
    )


def thumbnails(refs: list[Any], base: Path, most: int = 4) -> list[str]:
    """Small PNG data: URIs of a row's first images that are on this machine (paths, bytes); Pillow only."""
    import base64
    import io

    from PIL import Image

    from nbtrain.contract.images import ImageRowError, image_source

    out = []
    for ref in refs[:most]:
        try:
            kind, value = image_source(ref, base)
            if kind not in ("path", "bytes"):
                continue
            with Image.open(value if kind == "path" else io.BytesIO(value)) as im:
                small = im.convert("RGB")
            small.thumbnail((64, 64))
            buf = io.BytesIO()
            small.save(buf, format="PNG")
        except (ImageRowError, OSError, ValueError):
            continue  # the row's own check reports a broken image
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def preview_html(p: Preview) -> str:
    parts = ["<div class='nbtrain-preview'>"]
    if p.note:
        parts.append(f"<i>{html.escape(p.note)}</i>")
    if p.rows and p.template is not None:
        caption = f"chat template from {p.template.origin}"
        if p.mark_trained:
            caption += (
                "; <mark>highlighted</mark> text is what the loss is computed on (assistant_only_loss)"
                if p.template.has_generation_blocks
                else "; this template has no {% generation %} blocks: with assistant_only_loss nbtrain "
                "finds the assistant turns from its rendering (Preview shows exactly what is trained)"
            )
        parts.append(f"<div><small>{caption}</small></div>")
    elif p.rows and p.template_note:
        parts.append(f"<div><small>{html.escape(p.template_note)}</small></div>")
    for r in p.rows:
        parts.append("<div style='border-left:3px solid #bbb;padding-left:8px;margin:6px 0'>")
        parts.append(f"<div><b>row {r.number}</b> <small>({html.escape(r.format)})</small></div>")
        if r.error:
            parts.append(f"<div style='color:#c62828'>{html.escape(r.error)}</div>")
        if r.thumbnails:
            imgs = "".join(
                f"<img src='{u}' alt='image of row {r.number}' style='{THUMB_STYLE}'>" for u in r.thumbnails
            )
            parts.append(f"<div style='display:flex'>{imgs}</div>")
        ex = r.example or {}
        if "text" in ex:
            parts.append(f"<pre style='{_PRE}'>{html.escape(_clip(str(ex['text'])))}</pre>")
        if ex.get("tools"):
            parts.append(_tools_html(ex["tools"]))
        for m in ex.get("messages", []):
            parts.append(_message_html(m))
        for key in ("prompt", "chosen", "rejected", "completion", "label"):
            if key not in ex:
                continue
            value = ex[key]
            parts.append(f"<div><small><b>{key}</b></small></div>")
            if isinstance(value, list):
                parts += [_message_html(m) for m in value]
            else:
                parts.append(f"<pre style='{_PRE};margin-left:1em'>{html.escape(_clip(str(value)))}</pre>")
        if r.segments is not None:
            body = segments_html(r.segments, p.mark_trained)
            parts.append(
                f"<details open><summary><small>as the model sees it</small></summary>"
                f"<pre style='{_PRE};background:#f6f6f6;padding:4px'>{body}</pre></details>"
            )
        if r.template_error:
            parts.append(
                f"<div style='color:#c62828'>the chat template failed: {html.escape(r.template_error)}</div>"
            )
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


# ------------------------------------------------------------------------------- local path candidates
# The model and data boxes offer what is on disk: model folders (a config.json beside the weights) and
# data files (the suffixes the data loader reads) below the notebook's folder, and the models in the Hub
# cache. The walk is bounded, so a home folder full of files costs milliseconds, not seconds.

SKIP_DIRS: Final = frozenset(
    {"node_modules", "__pycache__", "site-packages", "nbtrain_runs", "checkpoints", "wandb", "mlruns"}
)
MAX_CANDIDATES = 200
CANDIDATES_EVERY = 10.0  # seconds: how often typing may look at the disk again


def _walk(base: Path, depth: int, budget: int = 4000) -> Iterable[tuple[Path, list[os.DirEntry[str]]]]:
    """(folder, its entries) below ``base`` (itself included), breadth first, at most ``depth`` levels,
    ``budget`` entries in all; hidden folders, the runs root and tool folders are skipped."""
    try:
        skip = runs_root()
    except OSError:
        skip = None
    queue: list[tuple[Path, int]] = [(base, 0)]
    seen: set[tuple[int, int]] = set()
    while queue and budget > 0:
        folder, level = queue.pop(0)
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue  # a link back up the tree
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)[:budget]
        except OSError:
            continue
        budget -= len(entries)
        yield folder, entries
        if level >= depth:
            continue
        for e in entries:
            if e.name.startswith(".") or e.name in SKIP_DIRS:
                continue
            with contextlib.suppress(OSError):
                if e.is_dir() and (skip is None or Path(e.path) != skip):
                    queue.append((Path(e.path), level + 1))


def _relative(p: Path, base: Path) -> str:
    try:
        rel = p.relative_to(base)
    except ValueError:
        return str(p)
    return f"./{rel.as_posix()}" if len(rel.parts) == 1 else rel.as_posix()


def model_candidates(base: Path, depth: int = 2) -> list[str]:
    """Model folders below ``base`` (those holding a config.json) and GGUF files, the example models
    fetched already (``nbtrain.example_model(name=...)``: their GGUF files in nbtrain's cache), then the
    Hub cache's models (org/name)."""
    out = []
    for folder, entries in _walk(base, depth):
        if folder != base and any(e.name == "config.json" for e in entries):
            out.append(_relative(folder, base))
        out += [_relative(folder / e.name, base) for e in entries if is_gguf(e.name)]
    with contextlib.suppress(OSError), os.scandir(cache_dir() / "examples") as it:
        out += sorted(e.path for e in it if is_gguf(e.name) and not e.name.startswith("."))
    hub = Path(hub_cache_dir())
    with contextlib.suppress(OSError), os.scandir(hub) as it:
        names = sorted(e.name for e in it if e.name.startswith("models--"))
        out += [n.removeprefix("models--").replace("--", "/") for n in names]
    return out[:MAX_CANDIDATES]


def data_candidates(base: Path, depth: int = 3) -> list[str]:
    """Data files below ``base`` (FILE_KINDS suffixes) and save_to_disk() folders; model folders are
    not looked into (their .json files are not data)."""
    out: list[str] = []
    for folder, entries in _walk(base, depth):
        names = {e.name for e in entries}
        if "config.json" in names and folder != base:
            continue  # a model folder
        if "dataset_info.json" in names and "state.json" in names:
            out.append(_relative(folder, base))
            continue
        for e in entries:
            if Path(e.name).suffix.lower() in FILE_KINDS and not e.name.startswith("."):
                with contextlib.suppress(OSError):
                    if e.is_file():
                        out.append(_relative(Path(e.path), base).removeprefix("./"))
    return out[:MAX_CANDIDATES]


# -------------------------------------------------------------------------------------- debouncing


class _Debouncer:
    """Runs ``job(item, generation)`` in one background thread on the latest submitted item, once
    ``delay`` seconds have passed without a newer one. Errors in the job go to ``on_error``."""

    def __init__(
        self, delay: float, job: Callable[[Any, int], None], on_error: Callable[[str], None]
    ) -> None:
        self.delay = delay
        self._job = job
        self._on_error = on_error
        self._cond = threading.Condition()
        self._item: Any = None
        self._submitted = 0
        self._taken = 0
        self._done = 0
        self._due = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def latest(self) -> int:
        return self._submitted

    def submit(self, item: Any) -> None:
        with self._cond:
            if self._closed:
                return
            self._item = item
            self._submitted += 1
            self._due = time.monotonic() + self.delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nbtrain-panel-check", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or self._done >= self._submitted, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if self._taken < self._submitted:
                        wait = self._due - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                item, gen = self._item, self._submitted
                self._taken = gen
            try:
                self._job(item, gen)
            except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
                self._on_error(traceback.format_exc())
            finally:
                with self._cond:
                    self._done = gen
                    self._cond.notify_all()


# ------------------------------------------------------------------------------------------- panel

ConfigSource = str | Path | Mapping[str, Any] | Run | None

_LABEL_WIDTH = 168  # px; the labels are words, so they fit (no key path cut off)
_FIELD_WIDTH = "372px"
_ERROR_STYLE = f"color:#c62828;font-size:12px;line-height:1.3;margin:0 0 2px {_LABEL_WIDTH + 8}px"
_CSS = f"""<style>
.nbtrain-invalid input, .nbtrain-invalid select, .nbtrain-invalid textarea {{border-color:#c62828 !important}}
.nbtrain-step {{border:1px solid var(--jp-border-color2, #e0e0e0); border-radius:6px;
  padding:4px 10px 8px 10px; margin:0 0 10px 0}}
.nbtrain-step-title {{font-size:14px; font-weight:600; margin:2px 0 6px 0;
  color:var(--jp-ui-font-color0, #212121)}}
.nbtrain-step-num {{display:inline-block; width:20px; height:20px; line-height:20px; border-radius:10px;
  background:#1565c0; color:#fff; text-align:center; font-size:12px; margin-right:8px}}
.nbtrain-step-hint {{font-weight:normal; font-size:12px; color:var(--jp-ui-font-color2, #757575);
  margin-left:8px}}
.nbtrain-label {{display:block; width:{_LABEL_WIDTH - 8}px; padding-right:8px; white-space:nowrap;
  overflow:hidden; text-overflow:ellipsis; line-height:var(--jp-widgets-inline-height, 28px);
  color:var(--jp-ui-font-color1, #424242); cursor:help}}
.nbtrain-side-title {{font-weight:600; margin:4px 0; white-space:nowrap}}
.nbtrain-data-help {{font-size:12px; line-height:1.5; color:var(--jp-ui-font-color2, #616161);
  margin:2px 0 0 {_LABEL_WIDTH}px}}
.nbtrain-data-help summary {{cursor:pointer}}
.nbtrain-side-title small {{font-weight:normal; color:var(--jp-ui-font-color2, #757575)}}
.nbtrain-buttons {{margin:6px 0 2px {_LABEL_WIDTH + 8}px}}
.nbtrain-status {{margin:4px 0 0 {_LABEL_WIDTH + 8}px; font-size:12px; line-height:1.4;
  color:var(--jp-ui-font-color1, #424242)}}
</style>"""
# The comm target of the lab extension's "insert a cell" (labextension/src/tocell.ts).
CELLS_TARGET: Final = "nbtrain.cells"


def label_html(f: PanelField) -> str:
    """A field's label: its words, with the YAML key and its help as the tooltip."""
    title, text = html.escape(f.tooltip), html.escape(f.label or f.path)
    return f"<label class='nbtrain-label' title='{title}'>{text}</label>"


def _side_title(title: str, hint: str) -> str:
    return f"<div class='nbtrain-side-title'>{html.escape(title)} <small>{html.escape(hint)}</small></div>"


class ConfigPanel:
    """The form. Display it (last expression of a cell, or ``.show()``); drive it from code with
    ``fields[path].value = ...``, ``set_config``, ``to_yaml``/``to_dict``, and the buttons' ``click()``.
    """

    def __init__(self, config: ConfigSource = None, *, debounce: float = 0.25, preview_rows: int = 3) -> None:
        self.preset = find_preset()  # instructor mode: its fixed fields show filled and disabled
        self.spec = preset_fields(panel_fields(), self.preset)
        self._by_path = {f.path: f for f in self.spec}
        self.preview_rows = preview_rows
        self.run: Run | None = None  # the run launched last from this panel
        self.view: Dashboard | None = None  # the dashboard of that run, shown in ``live``
        self._watch_stop = threading.Event()
        self.status_message = ""
        self.dom_class = f"nbtrain-panel-{uuid.uuid4().hex[:12]}"  # finds the panel's cell in the page
        self._set: set[str] = set()  # dropdowns the user (or the loaded config) set explicitly
        self._touched: set[str] = set()  # fields the user changed, or a loaded config filled
        self._reveal = False  # Launch was pressed: every problem shows, touched or not
        self._extra: dict[Any, Any] = {}  # keys the form has no field for, written back unchanged
        self._filling = False
        self._lock = threading.RLock()
        self._problems: dict[str, str] = {}  # every field problem of the last check
        self._all_general: list[str] = []  # and those without a field
        self._field_errors: dict[str, str] = {}  # what shows of them
        self._general_errors: list[str] = []
        self._frontend = False  # the lab extension answered: To cell inserts the cell through it
        self._candidates_at = -math.inf
        self._action_error: str | None = None
        self._background: list[threading.Thread] = []
        self._preview_key: Any = None
        self._debouncer = _Debouncer(debounce, self._check, self._job_failed)

        self.fields: dict[str, Any] = {f.path: self._make_widget(f) for f in self.spec}
        self.labels = {
            f.path: widgets.HTML(label_html(f), layout=widgets.Layout(width=f"{_LABEL_WIDTH}px", margin="0"))
            for f in self.spec
        }
        self.error_labels = {f.path: widgets.HTML("") for f in self.spec}
        self.yaml_view = widgets.HTML("")
        self.error_area = widgets.HTML("")
        self.status_area = widgets.HTML("")
        self.preview = widgets.HTML("")
        self.launch_button = widgets.Button(
            description="Launch", button_style="success", icon="play", tooltip="check the config and start it"
        )
        self.stop_button = widgets.Button(
            description="Stop",
            button_style="warning",
            icon="stop",
            disabled=True,  # enabled while the run launched here is active
            tooltip="stop the run launched here after its current step (it saves a checkpoint)",
        )
        self.to_cell_button = widgets.Button(
            description="To cell", icon="clipboard", tooltip="insert a %%finetune cell with this config"
        )
        self.load_ref = widgets.Text(
            placeholder="run id or name",
            layout=widgets.Layout(flex="1 1 auto", width="auto", max_width="260px"),
        )
        self.load_button = widgets.Button(
            description="Load",
            icon="folder-open",
            tooltip="fill the form with a run's config",
            layout=widgets.Layout(flex="0 0 auto", width="84px"),
        )
        self.live = widgets.VBox([])  # the launched run's dashboard
        self.export_area = widgets.VBox([])  # that run's export form (once it has weights), or a loaded run's
        self.export_box: ExportBox | None = None
        self.launch_button.on_click(self._guard(self._launch))
        self.stop_button.on_click(self._guard(self._stop))
        self.to_cell_button.on_click(self._guard(self._to_cell))
        self.load_button.on_click(self._guard(self._load))
        for f in self.spec:
            self.fields[f.path].observe(self._changed_handler(f.path), names="value")
        self.data_help = widgets.HTML("")
        self.rows: dict[str, Any] = {}  # a field's label, box and error line
        self.groups = {g: self._group(g) for g in GROUPS}
        self.groups["Data"].children = (*self.groups["Data"].children, self.data_help)
        self.preset_note = widgets.HTML(preset_note_html(self.preset))
        self.widget = self._layout()
        self.widget.add_class("nbtrain-panel")
        self.widget.add_class(self.dom_class)
        self._refresh_candidates(Path.cwd())
        self._hello = self._open_comm({"action": "hello", "panel": self.dom_class}, self._on_hello)

        self._filling = True
        try:
            self._apply_preset()
        finally:
            self._filling = False
        if isinstance(config, Run):
            self.set_config(config_from_run(config.config))
        elif config is not None:
            self.set_config(config)
        else:
            self._refresh()

    # --------------------------------------------------------------------------------- building
    def _make_widget(self, f: PanelField) -> Any:
        # No description: ipywidgets shows a tooltip only on a widget without one, so the label is a
        # widget of its own (label_html) and the key and its help show on both.
        common: dict[str, Any] = {"layout": widgets.Layout(width=_FIELD_WIDTH), "tooltip": f.tooltip}
        if f.kind == "choice":
            w = widgets.Dropdown(options=f.options(), value=f.default, **common)
            w.disabled = len(f.choices) < 2
            return w
        if f.kind == "path":  # typed freely, with what is on disk offered as it is typed
            return widgets.Combobox(
                value="", options=[], ensure_option=False, placeholder=f.placeholder, **common
            )
        if f.choices:
            return widgets.Combobox(
                value="",
                options=[str(c) for c in f.choices],
                ensure_option=False,
                placeholder=f.placeholder,
                **common,
            )
        return widgets.Text(value="", placeholder=f.placeholder, **common)

    def _group(self, name: str) -> Any:
        for f in self.spec:
            if f.group == name:
                line = widgets.HBox(
                    [self.labels[f.path], self.fields[f.path]], layout=widgets.Layout(align_items="center")
                )
                self.rows[f.path] = widgets.VBox([line, self.error_labels[f.path]])
        return widgets.VBox([self.rows[f.path] for f in self.spec if f.group == name])

    def _layout(self) -> Any:
        """The flow: one numbered step after another (model, method, data, hyperparameters, start), the
        YAML and the data preview beside it, the launched run's dashboard below."""
        self.steps: dict[str, Any] = {}
        for n, (title, hint, groups) in enumerate(STEPS, 1):
            head = widgets.HTML(
                f"<div class='nbtrain-step-title'><span class='nbtrain-step-num'>{n}</span>"
                f"{html.escape(title)}<span class='nbtrain-step-hint'>{html.escape(hint)}</span></div>"
            )
            children = [head, *(self.groups[g] for g in groups)]
            if title == "Start":
                buttons = widgets.HBox([self.launch_button, self.stop_button, self.to_cell_button])
                buttons.add_class("nbtrain-buttons")
                children += [self.error_area, buttons, self.status_area]
            box = widgets.VBox(children)
            box.add_class("nbtrain-step")
            self.steps[title] = box
        form = widgets.VBox(list(self.steps.values()), layout=widgets.Layout(width="580px", flex="0 0 auto"))
        load = widgets.HBox([self.load_ref, self.load_button], layout=widgets.Layout(align_items="center"))
        side = widgets.VBox(
            [
                widgets.HTML(_side_title("Start from a run", "fill the form with its config")),
                load,
                widgets.HTML(_side_title("YAML", "what a %%finetune cell would hold")),
                self.yaml_view,
                widgets.HTML(_side_title("Data preview", "the first rows as the model sees them")),
                self.preview,
            ],
            layout=widgets.Layout(min_width="300px", flex="1 1 0", margin="0 10px 0 14px", overflow="hidden"),
        )
        return widgets.VBox(
            [
                widgets.HTML(_CSS),
                self.preset_note,
                widgets.HBox([form, side], layout=widgets.Layout(align_items="flex-start")),
                self.live,
                self.export_area,
            ]
        )

    # ------------------------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def close(self) -> None:
        """Stop the background checker and live view, and close the widgets (a kernel keeps every
        widget, with its layout and style, until it is closed)."""
        self._debouncer.close()
        self._close_view()
        self._close_export()
        for c in (self._hello,):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        todo = [self.widget]
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            for part in (getattr(w, "layout", None), getattr(w, "style", None), w):
                if isinstance(part, widgets.Widget):
                    part.close()

    # --------------------------------------------------------------------------- config <-> form
    @classmethod
    def from_yaml(cls, text: str, **kwargs: Any) -> ConfigPanel:
        """A panel showing ``text`` (YAML). Raises ConfigError if it is not YAML or not a mapping."""
        return cls(text, **kwargs)

    @classmethod
    def from_run(cls, ref: str | Path | Run, **kwargs: Any) -> ConfigPanel:
        return cls(get_run(ref), **kwargs)

    def set_config(self, source: str | Path | Mapping[str, Any]) -> None:
        """Fill the form from YAML text, a .yaml path or a dict; keys without a field are kept as they are."""
        raw: Any
        if isinstance(source, Mapping):
            raw = dict(source)
        else:
            raw, _, _ = parse_source(source)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            kind = type(raw).__name__
            raise ConfigError(
                [Problem("", f"the config must be a mapping of keys (model:, data:, ...), got {kind}")]
            )
        raw = copy.deepcopy(raw)
        with self._lock:
            self._filling = True
            try:
                self._set.clear()
                self._extra = {}
                for f in self.spec:
                    self._write(f, UNSET)
                for key, value in raw.items():
                    if isinstance(key, str) and key in self._by_path:
                        self._write(self._by_path[key], value)
                    elif key in SECTIONS and isinstance(value, dict):
                        rest: dict[Any, Any] = {}
                        for sub, v in value.items():
                            path = f"{key}.{sub}"
                            if path in self._by_path:
                                self._write(self._by_path[path], v)
                            else:
                                rest[sub] = v
                        self._extra[key] = rest
                    else:
                        self._extra[key] = value
                self._apply_preset()
                # what a loaded config holds was written by someone: its problems show at once
                self._touched = {f.path for f in self.spec if self._read(f) is not UNSET}
            finally:
                self._filling = False
        self._refresh()

    def _apply_preset(self) -> None:
        """Fill and disable the fields the lab preset fixes; always write the dropdowns it restricts
        (their first allowed value may not be the schema's default). Called while filling."""
        if self.preset is None:
            return
        for path, value in self.preset.locked().items():
            f = self._by_path.get(path)
            if f is None:
                continue  # no field (train.seed): the preset fills it in when the config is checked
            self._write(f, value)
            self.fields[path].disabled = True
            self.fields[path].tooltip = f"fixed by the lab preset {self.preset.source}"
        for f in self.spec:
            if f.kind == "choice" and self.preset.choices(f.path) is not None:
                self._set.add(f.path)

    def _write(self, f: PanelField, value: Any) -> None:
        w = self.fields[f.path]
        if f.kind == "choice":
            if value is UNSET:
                w.options = f.options()
                w.value = f.default
                self._set.discard(f.path)
                return
            if not any(_same(value, c) for c in f.choices):
                # Keep a value the form does not offer, so it is shown, validated and written back.
                w.options = [*f.options(), (f"{value!r} (not allowed)", value)]
            w.value = value
            self._set.add(f.path)
        elif f.kind in ("text", "path"):
            w.value = "" if value is UNSET else value if isinstance(value, str) else str(value)
        elif f.kind == "targets":
            w.value = format_targets(value)
        elif f.kind == "names":
            is_names = isinstance(value, list) and all(isinstance(x, (str, dict)) for x in value)
            w.value = ", ".join(map(format_scalar, value)) if is_names else format_scalar(value)
        else:
            w.value = format_scalar(value)

    def _read(self, f: PanelField) -> Any:
        w = self.fields[f.path]
        if f.kind == "choice":
            v = w.value
            return v if f.path in self._set or not _same(v, f.default) else UNSET
        if f.kind in ("text", "path"):
            return w.value.strip() or UNSET
        if f.kind == "targets":
            return parse_targets(w.value)
        if f.kind == "names":
            return parse_names(w.value)
        return parse_scalar(w.value)

    @property
    def method(self) -> Any:
        return self.fields["method"].value

    def to_dict(self) -> dict[str, Any]:
        """The config the form represents: set fields, changed dropdowns, and keys it has no field for."""
        with self._lock:
            values = {f.path: self._read(f) for f in self.spec}
            extra = copy.deepcopy(self._extra)
        method = self.method
        out: dict[Any, Any] = {}
        keys = [*TOP_ORDER, *(k for k in extra if k not in TOP_ORDER)]
        for key in keys:
            if key in SECTIONS:
                if not _section_active(key, method):
                    continue
                sub = {
                    f.key: values[f.path]
                    for f in self.spec
                    if f.section == key and "." in f.path and values[f.path] is not UNSET
                }
                more = extra.get(key, UNSET)
                if isinstance(more, dict):
                    out[key] = {**sub, **{k: v for k, v in more.items() if k not in sub}}
                elif sub:
                    out[key] = sub
                elif more is not UNSET:
                    out[key] = more
                elif key == "data":
                    out[key] = {}  # required: an empty form then reports data.train as missing
            elif key in values:
                if values[key] is not UNSET:
                    out[key] = values[key]
            elif key in extra:
                out[key] = extra[key]
        return out

    def to_yaml(self) -> str:
        return _dump(self.to_dict())

    # ------------------------------------------------------------------------------- reacting
    def _changed_handler(self, path: str) -> Callable[[dict[str, Any]], None]:
        def changed(change: dict[str, Any]) -> None:
            if self._filling:
                return
            if self._by_path[path].kind == "choice":
                self._set.add(path)
            self._touched.add(path)
            self._refresh()

        return changed

    def _refresh(self) -> None:
        """Re-show the YAML now and queue validation and the preview (debounced, in the background)."""
        method = self.method
        self.groups["LoRA"].layout.display = "" if _section_active("lora", method) else "none"
        self.groups["QLoRA"].layout.display = "" if _section_active("quantization", method) else "none"
        self._show_objective_fields()
        cfg = self.to_dict()
        text = _dump(cfg)
        self.yaml_view.value = f"<pre style='{_PRE}'>{html.escape(text)}</pre>"
        self._debouncer.submit((text, cfg, Path.cwd()))

    @property
    def objective(self) -> Any:
        return self.fields["objective"].value

    def _show_objective_fields(self) -> None:
        """The data formats the objective trains on (the format dropdown offers only those), the rows
        they expect, and rewards: for grpo and rloo only."""
        objective = self.objective
        known = OBJECTIVES.get(objective) if isinstance(objective, str) else None
        self.rows["rewards"].layout.display = "" if objective in rewards_objectives() else "none"
        if known is None:
            self.data_help.value = ""
            return
        f, w = self._by_path["data.format"], self.fields["data.format"]
        allowed = ["auto", *known.formats]
        labels = {c: label for label, c in f.options()}
        options = [(labels.get(c, c), c) for c in allowed]  # the objective's order: its first is preferred
        if not any(_same(w.value, c) for c in allowed):
            # Keep a format the objective does not take, so the validator's message shows on it.
            options.append((f"{w.value!r} (not for {objective})", w.value))
        if [v for _, v in options] != [v for _, v in w.options]:
            filling, self._filling = self._filling, True
            try:
                value = w.value
                w.options = options
                w.value = value
            finally:
                self._filling = filling
        w.disabled = len(f.choices) < 2
        rows = "".join(
            f"<div style='margin:2px 0 0 12px'><code>{html.escape(k)}</code>: "
            f"<code>{html.escape(FORMAT_HELP[k])}</code></div>"
            for k in known.formats
        )
        names = ", ".join(known.formats)
        self.data_help.value = (
            f"<details class='nbtrain-data-help'><summary>objective: {html.escape(objective)} trains on "
            f"rows like: {html.escape(names)}</summary>{rows}</details>"
        )

    def settle(self, timeout: float | None = 30.0) -> bool:
        """Wait until inline errors and the preview reflect the latest change and a Stop has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self._debouncer.settle(timeout)
        for t in list(self._background):
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            ok = ok and not t.is_alive()
        return ok

    def _refresh_candidates(self, base: Path) -> None:
        """Offer the model folders and data files found on disk in the model and data boxes."""
        self._candidates_at = time.monotonic()
        for path, found in (("model", model_candidates(base)), ("data.train", data_candidates(base))):
            w = self.fields.get(path)
            if isinstance(w, widgets.Combobox) and list(w.options) != found:
                w.options = found

    def _check(self, item: tuple[str, dict[str, Any], Path], gen: int) -> None:
        text, cfg, base = item
        if time.monotonic() - self._candidates_at > CANDIDATES_EVERY:
            self._refresh_candidates(base)
        problems = validate(text)
        key = (_preview_inputs(cfg, base), self.preview_rows)
        html_preview = None
        if key != self._preview_key:
            html_preview = preview_html(data_preview(cfg, base, self.preview_rows))
        if gen != self._debouncer.latest:
            return  # a newer change is queued; its check will show the current state
        with self._lock:
            self._apply_problems(problems)
            if html_preview is not None:
                self.preview.value = html_preview
                self._preview_key = key

    def _job_failed(self, tb: str) -> None:
        with self._lock:
            self._general_errors = [f"checking the config failed unexpectedly:\n{tb}"]
            self._render_errors()

    def _target(self, path: str) -> str | None:
        parts = path.split(".") if path else []
        for i in range(len(parts), 0, -1):
            cand = ".".join(parts[:i])
            if cand in self._by_path:
                return cand
        return None

    def _apply_problems(self, problems: Iterable[Problem]) -> None:
        by_field: dict[str, list[str]] = {}
        general: list[str] = []
        for p in problems:
            target = self._target(p.path)
            if target is None:
                general.append(f"{p.path or 'config'}: {p.message}")
            else:
                by_field.setdefault(target, []).append(p.message)
        with self._lock:
            self._problems = {k: "\n".join(v) for k, v in by_field.items()}
            self._all_general = general
            self._show_problems()

    def _shows(self, path: str) -> bool:
        """Whether a field's problem shows: once Launch was pressed, once the user changed the field, or
        while it holds a value; so an empty form opens without "required key is missing" everywhere."""
        return self._reveal or path in self._touched or self._read(self._by_path[path]) is not UNSET

    def _show_problems(self) -> None:
        self._field_errors = {k: v for k, v in self._problems.items() if self._shows(k)}
        started = self._reveal or bool(self._touched) or bool(self._extra)
        self._general_errors = list(self._all_general) if started else []
        for path, label in self.error_labels.items():
            msg = self._field_errors.get(path)
            value = f"<div style='{_ERROR_STYLE}'>{html.escape(msg)}</div>" if msg else ""
            if label.value != value:
                label.value = value
            w = self.fields[path]
            if msg:
                w.add_class("nbtrain-invalid")
            else:
                w.remove_class("nbtrain-invalid")
        self._render_errors()

    def _render_errors(self) -> None:
        items = [*self._general_errors, *([self._action_error] if self._action_error else [])]
        self.error_area.value = (
            "".join(f"<pre style='{_PRE};{_ERROR_STYLE}'>{html.escape(m)}</pre>" for m in items)
            if items
            else ""
        )

    @property
    def errors(self) -> dict[str, str]:
        """Inline errors by field path (the validator's messages), as last shown."""
        with self._lock:
            return dict(self._field_errors)

    @property
    def problems(self) -> dict[str, str]:
        """Every field's problem of the last check, shown or not yet (an untouched empty field's)."""
        with self._lock:
            return dict(self._problems)

    @property
    def general_errors(self) -> list[str]:
        """Problems with no field of their own, and the last button's error."""
        with self._lock:
            return [*self._general_errors, *([self._action_error] if self._action_error else [])]

    # -------------------------------------------------------------------------------- buttons
    def _guard(self, action: Callable[[], None]) -> Callable[[Any], None]:
        """A click handler: widgets have no cell to fail, so errors are shown in the panel."""

        def handler(_button: Any) -> None:
            self._action(None)
            try:
                action()
            except NbtrainError as e:
                self._action(str(e))
            except Exception:  # noqa: BLE001 - a click has no cell: the traceback goes to the panel
                self._action(f"unexpected error:\n{traceback.format_exc()}")

        return handler

    def _action(self, error: str | None, status: str | None = None) -> None:
        with self._lock:
            self._action_error = error
            self._render_errors()
            if status is not None:
                self._say(status)

    def _say(self, status: str) -> None:
        with self._lock:
            self.status_message = status
            self.status_area.value = f"<div class='nbtrain-status'>{html.escape(status)}</div>"

    def _launch(self) -> None:
        with self._lock:
            self._reveal = True  # from now on every problem shows, touched or not
            self._show_problems()
        text = self.to_yaml()
        try:
            prep = api.prepare(text)
        except ConfigError as e:
            self._apply_problems(e.problems)
            raise
        run = api.start(prep)
        self.run = run
        self._show_run(run)
        self._action(None, f"started run {run.id} ({run.name})")

    def _show_run(self, run: Run) -> None:
        """Show ``run``'s dashboard (the one a ``%%finetune`` cell shows) under the form, kept current by
        its own thread, and keep Stop enabled while the run is active.

        The dashboard's widgets are children of the panel rather than ``display()``-ed from the click
        handler: a display from a handler lands in whatever cell runs then, and its updates would carry
        the click's parent header; widget values travel over each widget's own comm.
        """
        from nbtrain.ui.dashboard import Dashboard  # plotly loads on the first launch, not with the panel

        self._close_view()  # the previous run goes on; only its view here stops
        self._close_export()
        view = Dashboard(run)
        view.refresh()  # builds its widgets
        self.view = view
        self.live.children = (view.box,) if view.box is not None else ()
        view.start()
        self.stop_button.disabled = False
        stop = threading.Event()
        self._watch_stop = stop
        threading.Thread(
            target=self._watch, args=(run, stop), name=f"nbtrain-panel-watch-{run.id}", daemon=True
        ).start()

    def _watch(self, run: Run, stop: threading.Event) -> None:
        """Until ``run`` ends: then Stop is disabled and the status line says how it ended."""
        try:
            st = follow(run.status, interval=0.5, stop=stop, what=f"run {run.id}")
        except FollowStopped:
            return
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._action(f"following run {run.id} failed:\n{traceback.format_exc()}")
            return
        if self.run is run:
            self.stop_button.disabled = True
            self._say(f"run {run.id}: {st.describe()}")
            self._offer_export(run)

    def _offer_export(self, run: Run) -> None:
        """The export form of ``run`` under its dashboard, once it has something to export."""
        from nbtrain.control.export import has_trained_weights
        from nbtrain.ui.export_box import ExportBox

        if self.export_box is not None and self.export_box.run.dir == run.dir:
            return
        self._close_export()
        if has_trained_weights(run):
            self.export_box = ExportBox(run)
            self.export_area.children = (self.export_box.box,)

    def _close_export(self) -> None:
        box, self.export_box = self.export_box, None
        self.export_area.children = ()
        if box is not None and not box.busy:  # a running export finishes; its form just leaves
            box.close()

    def _close_view(self) -> None:
        self._watch_stop.set()
        view, self.view = self.view, None
        if view is not None:
            view.close()
        old, self.live.children = self.live.children, ()
        todo = list(old)
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    def _stop(self) -> None:
        run = self.run
        if run is None:
            raise NbtrainError("no run was launched from this panel yet; Launch one first")
        self.stop_button.disabled = True  # one request is enough; the run winds down in the background
        self._action(None, f"stopping run {run.id} (it finishes its step and saves a checkpoint)…")
        # Run.stop waits for the worker to exit (up to its timeout): do that off the kernel thread.
        t = threading.Thread(
            target=self._stop_in_background, args=(run,), name="nbtrain-panel-stop", daemon=True
        )
        self._background = [b for b in self._background if b.is_alive()] + [t]
        t.start()

    def _stop_in_background(self, run: Run) -> None:
        try:
            st = run.stop()
        except NbtrainError as e:
            self._action(str(e))
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._action(f"stopping run {run.id} failed:\n{traceback.format_exc()}")
        else:
            self._action(None, f"run {run.id}: {st.describe()}")
        if self.run is run and not run.status().done:
            self.stop_button.disabled = False  # it did not stop: let the user try again

    # ------------------------------------------------------------------------------------ To cell
    # In JupyterLab and Notebook 7 the lab extension inserts the cell at once (labextension/src/tocell.ts):
    # the panel says hello on a comm when it is made, and once the extension has answered, To cell sends
    # the cell's text on a new comm. Elsewhere (no extension, another frontend) IPython's set_next_input
    # is what there is, and a notebook applies that only when the next cell runs: the panel says so.

    def _open_comm(self, data: dict[str, Any], on_msg: Callable[[dict[str, Any]], None]) -> Any:
        """A comm to the frontend's ``nbtrain.cells`` target; outside a kernel, comm's inert stand-in."""
        try:
            from comm import create_comm
        except ImportError:  # no kernel stack at all
            return None
        c = create_comm(target_name=CELLS_TARGET, data=data)
        c.on_msg(on_msg)
        return c

    def _on_hello(self, msg: dict[str, Any]) -> None:
        if msg.get("content", {}).get("data", {}).get("ready"):
            self._frontend = True

    def _to_cell(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise NbtrainError("'To cell' needs IPython or Jupyter; copy the YAML shown above instead")
        # the cell is a %%finetune cell: make sure the magic exists in this kernel (%load_ext nbtrain)
        shell.extension_manager.load_extension("nbtrain")
        source = "%%finetune\n" + self.to_yaml()
        if self._frontend:
            self._open_comm(
                {"action": "insert", "panel": self.dom_class, "source": source}, self._on_inserted
            )
            self._action(None, "inserting a %%finetune cell below the panel…")
            return
        shell.set_next_input(source, replace=False)
        # Jupyter delivers this with the reply of the next executed cell; say so, or it looks lost.
        self._action(
            None,
            "a new %%finetune cell with this config follows the next cell you run (the nbtrain "
            "JupyterLab extension, which inserts it at once, is not active in this frontend)",
        )

    def _on_inserted(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data", {})
        if "inserted" in data:
            self._action(None, "a %%finetune cell with this config is below the panel: run it to start")
        else:
            self._action(f"the notebook could not insert the cell: {data.get('error', data)}")

    def _load(self) -> None:
        ref = self.load_ref.value.strip()
        if not ref:
            raise NbtrainError("type a run id, id prefix or name next to Load")
        run = get_run(ref)
        self.set_config(config_from_run(run.config))
        self._action(None, f"loaded the config of run {run.id}")
        self._offer_export(run)


def _dump(cfg: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(cfg), sort_keys=False, allow_unicode=True, width=100)


def _preview_inputs(cfg: Mapping[str, Any], base: Path) -> tuple[Any, ...]:
    """What the preview depends on (including file times), so other edits do not re-read the data."""
    data, train = _section(cfg, "data"), _section(cfg, "train")
    stamps: list[Any] = []
    for spec in (data.get("train"), cfg.get("model")):
        if isinstance(spec, str) and spec.strip():
            p = _resolve(spec, base)
            for q in (p, p / "chat_template.jinja", p / "tokenizer_config.json"):
                try:
                    stamps.append(q.stat().st_mtime_ns)
                except OSError:
                    stamps.append(None)
    return (
        base,
        repr(data.get("train")),
        repr(data.get("format")),
        repr(cfg.get("model")),
        bool(train.get("assistant_only_loss")),
        tuple(stamps),
    )


def validate(text: str) -> list[Problem]:
    """What would stop ``text`` from launching (empty when Launch would start it): the one validation
    entry every surface uses, so the form shows exactly the messages Launch would raise."""
    return validate_config(text)


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


def preset_note_html(preset: Preset | None) -> str:
    """The panel's note on the lab preset in force: its file and rules."""
    if preset is None:
        return ""
    rules = "".join(f"<li>{html.escape(r)}</li>" for r in preset.rules())
    return (
        f"<div class='nbtrain-preset' style='border-left:3px solid #6a1b9a;padding-left:8px'>"
        f"&#128274; <b>Lab preset</b> <code>{html.escape(str(preset.source))}</code>: greyed fields are "
        f"fixed by the course; a config outside these rules is refused."
        f"<ul style='margin:2px 0'>{rules}</ul></div>"
    )


def panel(config: ConfigSource = None) -> ConfigPanel:
    """A config panel, empty or filled from YAML text, a .yaml path, a dict, or a Run's config."""
    return ConfigPanel(config)


__all__ = [
    "STRATEGY_CHOICES",
    "ChatTemplate",
    "ConfigPanel",
    "PanelField",
    "Preview",
    "PreviewRow",
    "config_from_run",
    "data_preview",
    "find_chat_template",
    "format_scalar",
    "panel",
    "panel_fields",
    "parse_scalar",
    "preview_html",
    "validate",
]
