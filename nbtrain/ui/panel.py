"""A widget form for a run config, for people who would rather not type YAML.

    import nbtrain; nbtrain.panel()            # or: %finetune panel

The form is another way to write the same YAML a ``%%finetune`` cell takes: it shows that YAML live,
validates it with ``nbtrain.config.load_config`` (so every inline error is the YAML validator's own
message, on the field it belongs to), previews the first data rows as the model will see them, and
launches, stops, loads and exports runs through ``nbtrain.api``.

Nothing here imports torch, transformers or bitsandbytes: the data preview renders the model's chat
template with jinja2 directly (the way transformers does), and validation that needs bitsandbytes runs
its probe in a subprocess (see ``nbtrain.config``). Validation and the preview run in a background
thread, debounced, so typing never waits for them and a slow first check does not block the kernel.
"""

from __future__ import annotations

import contextlib
import copy
import html
import json
import math
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, get_args

import ipywidgets as widgets
import yaml
from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel

from nbtrain import api
from nbtrain.config import (
    METHODS,
    DataSettings,
    DistributedSettings,
    LoraSettings,
    QuantSettings,
    RunConfig,
    load_config,
    parse_source,
)
from nbtrain.datacheck import FILE_KINDS, DataProblem, read_rows
from nbtrain.errors import ConfigError, NbtrainError, Problem
from nbtrain.formats import FORMAT_HELP, FORMATS, RowError, detect_format, to_example
from nbtrain.objectives import OBJECTIVES
from nbtrain.preset import Preset, find_preset
from nbtrain.runs import Run, get_run
from nbtrain.trainargs import sft_fields
from nbtrain.ui.live import LiveView
from nbtrain.ui.preview import segments_html

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
    kind: str  # "text" (a string) | "scalar" (one YAML scalar) | "choice" (a dropdown) | "targets"
    group: str
    choices: tuple[Any, ...] = ()  # dropdown values, or suggestions for a scalar box
    default: Any = UNSET  # a dropdown's value when nothing is set
    placeholder: str = ""
    help: str = ""

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def key(self) -> str:
        return self.path.rsplit(".", 1)[-1]


GROUPS: Final = ("Model", "Data", "Training", "LoRA", "QLoRA", "Run")


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
        return [
            PanelField(
                f"train.{key}",
                "scalar",
                "Training",
                choices=spec.choices or (),
                placeholder=placeholder or f"default {_default_text(spec.default)}",
                help=spec.help,
            )
        ]

    lora_default = {k: _schema_default(LoraSettings, k) for k in LoraSettings.model_fields}
    return [
        PanelField(
            "model",
            "text",
            "Model",
            placeholder="./model-dir or org/name",
            help="a directory saved with save_pretrained(), or a hub id",
        ),
        PanelField(
            "method", "choice", "Model", choices=METHODS, default=_schema_default(RunConfig, "method")
        ),
        PanelField(
            "objective",
            "choice",
            "Model",
            choices=tuple(OBJECTIVES),
            default=_schema_default(RunConfig, "objective"),
            help="what training optimises: sft (imitate answers), dpo / orpo (prefer chosen over "
            "rejected), kto (desirable / undesirable completions), grpo (reward functions)",
        ),
        PanelField(
            "data.train",
            "text",
            "Data",
            placeholder="data/train.jsonl",
            help=".jsonl, .json, .csv, .parquet, a save_to_disk() directory, or a hub dataset id",
        ),
        PanelField(
            "data.format",
            "choice",
            "Data",
            choices=DATA_FORMATS,
            default=_schema_default(DataSettings, "format"),
        ),
        PanelField(
            "data.eval_split",
            "scalar",
            "Data",
            placeholder="e.g. 0.1 (none by default)",
            help="fraction of the training rows held out for evaluation (0.1), or a number of rows (200)",
        ),
        PanelField(
            "rewards",
            "names",
            "Data",
            placeholder="my_reward, format_reward",
            help="objective: grpo: reward functions defined in the notebook, or built-ins "
            "(format_reward, length_reward)",
        ),
        *train("max_steps", "default -1 (train for num_train_epochs)"),
        *train("num_train_epochs"),
        *train("learning_rate"),
        *train("per_device_train_batch_size"),
        *train("gradient_accumulation_steps"),
        *train("max_length"),
        *train("lr_scheduler_type"),
        PanelField(
            "precision",
            "choice",
            "Training",
            choices=PRECISIONS,
            default=_schema_default(RunConfig, "precision"),
        ),
        PanelField("lora.r", "scalar", "LoRA", placeholder=f"default {lora_default['r']}"),
        PanelField("lora.alpha", "scalar", "LoRA", placeholder=f"default {lora_default['alpha']}"),
        PanelField("lora.dropout", "scalar", "LoRA", placeholder=f"default {lora_default['dropout']}"),
        PanelField(
            "lora.target_modules",
            "targets",
            "LoRA",
            placeholder="default auto (or all-linear, or q_proj, v_proj)",
            help="'auto' (the model's usual attention projections), 'all-linear', or module names",
        ),
        PanelField(
            "quantization.bits",
            "choice",
            "QLoRA",
            choices=(4, 8),
            default=_schema_default(QuantSettings, "bits"),
        ),
        PanelField(
            "name",
            "text",
            "Run",
            placeholder="default <model>-<method>",
            help="letters, digits, '.', '_' or '-'",
        ),
        PanelField(
            "distributed.strategy",
            "choice",
            "Run",
            choices=STRATEGY_CHOICES,
            default=_schema_default(DistributedSettings, "strategy"),
            help="auto: one process per GPU found (DDP when several); none: one process; "
            "zero1/2/3: DeepSpeed ZeRO; more settings (num_processes, offload, ...) in the YAML",
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


_GEN_START, _GEN_END = "\x00nbtrain-gen+\x00", "\x00nbtrain-gen-\x00"


class GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` as transformers defines it, for plain jinja2.

    transformers uses the tag to find the assistant tokens (``assistant_only_loss``); here it renders
    its body between markers, so the preview can show which text the loss is computed on.
    """

    tags = {"generation"}  # noqa: RUF012 - jinja2's API declares this as a plain class attribute

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller: Macro) -> str:
        return f"{_GEN_START}{caller()}{_GEN_END}"


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' version: jinja2's own tojson escapes HTML characters, which changes the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template and special tokens, read from its directory without transformers."""

    source: str
    origin: str  # the file it came from, for the preview's caption
    tokens: Mapping[str, str] = field(default_factory=dict)  # bos_token, eos_token, ...

    @property
    def has_generation_blocks(self) -> bool:
        return re.search(r"\{%-?\s*generation\s*-?%\}", self.source) is not None

    def segments(self, messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        """The rendered conversation as (text, inside a generation block) pieces. Raises TemplateError."""
        text = _compile(self.source).render(
            messages=messages, add_generation_prompt=False, tools=None, documents=None, **self.tokens
        )
        out: list[tuple[str, bool]] = []
        for i, piece in enumerate(re.split(f"{re.escape(_GEN_START)}|{re.escape(_GEN_END)}", text)):
            if piece:
                out.append((piece, i % 2 == 1))
        return out

    def render(self, messages: list[dict[str, Any]]) -> str:
        """What ``tokenizer.apply_chat_template(messages, tokenize=False)`` gives. Raises TemplateError."""
        return "".join(text for text, _ in self.segments(messages))


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping) and isinstance(v.get("content"), str):  # a serialised AddedToken
        return str(v["content"])
    return None


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def find_chat_template(model_dir: Path) -> ChatTemplate | None:
    """The chat template transformers would use for the model in ``model_dir``, or None.

    Looks where transformers does: ``chat_template.jinja`` first, then ``chat_template`` in
    tokenizer_config.json (a string, or a list of named templates of which "default" is used).
    """
    cfg = _read_json_object(model_dir / "tokenizer_config.json")
    tokens: dict[str, str] = {}
    for src in (_read_json_object(model_dir / "special_tokens_map.json"), cfg):
        for k, v in src.items():
            text = _token_text(v)
            if k.endswith("_token") and text is not None:
                tokens[k] = text
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), jinja_file.name, tokens)
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, Mapping)}
        tpl = named.get("default")
    if isinstance(tpl, str) and tpl:
        return ChatTemplate(tpl, "tokenizer_config.json", tokens)
    return None


# ------------------------------------------------------------------------------------ data preview


@dataclass
class PreviewRow:
    number: int  # the row's line (jsonl/csv) or position (json/parquet) in the file
    format: str
    example: dict[str, Any] | None = None  # {"messages": [...]} or {"text": ...}
    error: str | None = None
    segments: list[tuple[str, bool]] | None = None  # the chat template's rendering
    template_error: str | None = None


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
    spec, fmt = data.get("train"), data.get("format", "auto")
    note = None
    if isinstance(spec, list) and spec and isinstance(spec[0], Mapping):
        # Several sources: the first one's rows (the token-exact preview of the mix is %finetune preview).
        note = f"the first of {len(spec)} sources"
        fmt = spec[0].get("format") or fmt
        spec = spec[0].get("path")
    if not isinstance(spec, str) or not spec.strip():
        return Preview(note="set data.train to see its first rows here")
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
        use = fmt if fmt in FORMATS else (detect_format(row, objective) if isinstance(row, Mapping) else None)
        item = PreviewRow(number, use or "?")
        if use is None:
            item.error = "matches no known format"
        else:
            try:
                item.example = to_example(row, use)
            except RowError as e:
                item.error = str(e)
        msgs = item.example.get("messages") if item.example else None
        if msgs and out.template is not None:
            try:
                item.segments = out.template.segments(msgs)
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
    return (
        f"<div><span style='color:{colour};font-weight:bold'>{html.escape(m['role'])}</span>"
        f"<pre style='{_PRE};margin-left:1em'>{html.escape(_clip(m['content']))}</pre></div>"
    )


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
                else "; assistant_only_loss needs {% generation %} blocks, which this template lacks"
            )
        parts.append(f"<div><small>{caption}</small></div>")
    elif p.rows and p.template_note:
        parts.append(f"<div><small>{html.escape(p.template_note)}</small></div>")
    for r in p.rows:
        parts.append("<div style='border-left:3px solid #bbb;padding-left:8px;margin:6px 0'>")
        parts.append(f"<div><b>row {r.number}</b> <small>({html.escape(r.format)})</small></div>")
        if r.error:
            parts.append(f"<div style='color:#c62828'>{html.escape(r.error)}</div>")
        ex = r.example or {}
        if "text" in ex:
            parts.append(f"<pre style='{_PRE}'>{html.escape(_clip(str(ex['text'])))}</pre>")
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

_LABEL_STYLE: Final = {"description_width": "200px"}
_ERROR_STYLE = "color:#c62828;font-size:12px;line-height:1.3"
_CSS = (
    "<style>.nbtrain-invalid input, .nbtrain-invalid select, .nbtrain-invalid textarea "
    "{border-color:#c62828 !important}</style>"
)


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
        self.view: LiveView | None = None  # the live view of that run, shown in ``live``
        self._view_stop = threading.Event()
        self.status_message = ""
        self._set: set[str] = set()  # dropdowns the user (or the loaded config) set explicitly
        self._extra: dict[Any, Any] = {}  # keys the form has no field for, written back unchanged
        self._filling = False
        self._lock = threading.RLock()
        self._field_errors: dict[str, str] = {}
        self._general_errors: list[str] = []
        self._action_error: str | None = None
        self._background: list[threading.Thread] = []
        self._preview_key: Any = None
        self._debouncer = _Debouncer(debounce, self._check, self._job_failed)

        self.fields: dict[str, Any] = {f.path: self._make_widget(f) for f in self.spec}
        self.error_labels = {f.path: widgets.HTML("") for f in self.spec}
        self.yaml_view = widgets.HTML("")
        self.error_area = widgets.HTML("")
        self.status_area = widgets.HTML("")
        self.preview = widgets.HTML("")
        self.launch_button = widgets.Button(description="Launch", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="warning", icon="stop")
        self.to_cell_button = widgets.Button(description="To cell", icon="clipboard")
        self.load_ref = widgets.Text(placeholder="run id or name", layout=widgets.Layout(width="220px"))
        self.load_button = widgets.Button(description="Load", icon="folder-open")
        self.live = widgets.HTML("")
        self.launch_button.on_click(self._guard(self._launch))
        self.stop_button.on_click(self._guard(self._stop))
        self.to_cell_button.on_click(self._guard(self._to_cell))
        self.load_button.on_click(self._guard(self._load))
        for f in self.spec:
            self.fields[f.path].observe(self._changed_handler(f.path), names="value")
        self.data_help = widgets.HTML("")
        self.groups = {g: self._group(g) for g in GROUPS}
        self.groups["Data"].children = (*self.groups["Data"].children, self.data_help)
        self.preset_note = widgets.HTML(preset_note_html(self.preset))
        self.widget = self._layout()

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
        common: dict[str, Any] = {
            "description": f.path,
            "style": _LABEL_STYLE,
            "layout": widgets.Layout(width="560px"),
            "tooltip": f.help[:400] or None,
        }
        if f.kind == "choice":
            w = widgets.Dropdown(options=[(str(c), c) for c in f.choices], value=f.default, **common)
            w.disabled = len(f.choices) < 2
            return w
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
        rows = [
            widgets.VBox([self.fields[f.path], self.error_labels[f.path]])
            for f in self.spec
            if f.group == name
        ]
        return widgets.VBox([widgets.HTML(f"<b>{name}</b>"), *rows])

    def _layout(self) -> Any:
        form = widgets.VBox([self.groups[g] for g in GROUPS], layout=widgets.Layout(width="600px"))
        side = widgets.VBox(
            [widgets.HTML("<b>YAML</b> <small>(what a %%finetune cell would hold)</small>"), self.yaml_view],
            layout=widgets.Layout(min_width="320px", flex="1 1 auto"),
        )
        buttons = widgets.HBox(
            [self.launch_button, self.stop_button, self.to_cell_button, self.load_ref, self.load_button]
        )
        preview = widgets.VBox([widgets.HTML("<b>Data preview</b>"), self.preview])
        return widgets.VBox(
            [
                widgets.HTML(_CSS),
                self.preset_note,
                widgets.HBox([form, side]),
                self.error_area,
                buttons,
                self.status_area,
                self.live,
                preview,
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
        self._view_stop.set()
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
                w.options = [(str(c), c) for c in f.choices]
                w.value = f.default
                self._set.discard(f.path)
                return
            if not any(_same(value, c) for c in f.choices):
                # Keep a value the form does not offer, so it is shown, validated and written back.
                w.options = [*[(str(c), c) for c in f.choices], (f"{value!r} (not allowed)", value)]
            w.value = value
            self._set.add(f.path)
        elif f.kind == "text":
            w.value = "" if value is UNSET else value if isinstance(value, str) else str(value)
        elif f.kind == "targets":
            w.value = format_targets(value)
        elif f.kind == "names":
            is_names = isinstance(value, list) and all(isinstance(x, str) for x in value)
            w.value = ", ".join(value) if is_names else format_scalar(value)
        else:
            w.value = format_scalar(value)

    def _read(self, f: PanelField) -> Any:
        w = self.fields[f.path]
        if f.kind == "choice":
            v = w.value
            return v if f.path in self._set or not _same(v, f.default) else UNSET
        if f.kind == "text":
            return w.value.strip() or UNSET
        if f.kind == "targets":
            return parse_targets(w.value)
        if f.kind == "names":
            names = [part.strip() for part in w.value.split(",") if part.strip()]
            return names or UNSET
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
        they expect, and rewards: for grpo only."""
        objective = self.objective
        known = OBJECTIVES.get(objective) if isinstance(objective, str) else None
        self.fields["rewards"].layout.display = "" if objective == "grpo" else "none"
        if known is None:
            self.data_help.value = ""
            return
        f, w = self._by_path["data.format"], self.fields["data.format"]
        allowed = ["auto", *known.formats]
        options = [(c, c) for c in allowed]
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
            f"<div><code>{html.escape(k)}</code>: <code>{html.escape(FORMAT_HELP[k])}</code></div>"
            for k in known.formats
        )
        self.data_help.value = (
            f"<div style='font-size:12px;color:#555'>objective: {html.escape(objective)} trains on "
            f"rows like:{rows}</div>"
        )

    def settle(self, timeout: float | None = 30.0) -> bool:
        """Wait until inline errors and the preview reflect the latest change and a Stop has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self._debouncer.settle(timeout)
        for t in list(self._background):
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            ok = ok and not t.is_alive()
        return ok

    def _check(self, item: tuple[str, dict[str, Any], Path], gen: int) -> None:
        text, cfg, base = item
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
        self._field_errors = {k: "\n".join(v) for k, v in by_field.items()}
        self._general_errors = general
        for path, label in self.error_labels.items():
            msg = self._field_errors.get(path)
            label.value = f"<div style='{_ERROR_STYLE}'>{html.escape(msg)}</div>" if msg else ""
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
                self.status_message = status
                self.status_area.value = f"<div>{html.escape(status)}</div>"

    def _launch(self) -> None:
        text = self.to_yaml()
        try:
            prep = api.prepare(text)
        except ConfigError as e:
            with self._lock:
                self._apply_problems(e.problems)
            raise
        run = api.start(prep)
        self.run = run
        self._follow(run)
        self._action(None, f"started run {run.id} ({run.name})")

    def _follow(self, run: Run) -> None:
        """Show ``run``'s live view in the panel, kept current by a background thread until it ends.

        The view is an HTML widget rather than ``LiveView.show()`` in an ``Output`` widget: a click
        handler's display lands in the Output, but the view thread's ``update_display_data`` messages
        carry the click's parent header, and JupyterLab's Output model drops that message type, so
        the view would freeze at its first frame. Widget value changes travel over the widget's comm.
        """
        self._view_stop.set()  # the previous run keeps running; only its view here stops
        stop = threading.Event()
        self._view_stop = stop
        view = LiveView(run)
        self.view = view
        self.live.value = view.render(view.poll())
        threading.Thread(
            target=self._follow_loop, args=(view, stop), name=f"nbtrain-panel-live-{run.id}", daemon=True
        ).start()

    def _follow_loop(self, view: LiveView, stop: threading.Event) -> None:
        try:
            while not stop.wait(view.interval):
                st = view.poll()
                self.live.value = view.render(st)
                if st.done:
                    return
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._action(f"the live view of run {view.run.id} stopped updating:\n{traceback.format_exc()}")

    def _stop(self) -> None:
        run = self.run
        if run is None:
            raise NbtrainError("no run was launched from this panel yet; Launch one first")
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

    def _to_cell(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise NbtrainError("'To cell' needs IPython or Jupyter; copy the YAML shown above instead")
        shell.set_next_input("%%finetune\n" + self.to_yaml(), replace=False)
        # Jupyter delivers this with the reply of the next executed cell; say so, or it looks lost.
        self._action(None, "a new %%finetune cell with this config follows the next cell you run")

    def _load(self) -> None:
        ref = self.load_ref.value.strip()
        if not ref:
            raise NbtrainError("type a run id, id prefix or name next to Load")
        run = get_run(ref)
        self.set_config(config_from_run(run.config))
        self._action(None, f"loaded the config of run {run.id}")


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
    """The validator's problems with ``text`` (empty when it is valid)."""
    try:
        load_config(text, preset=find_preset())
    except ConfigError as e:
        return list(e.problems)
    return []


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
    "GenerationTag",
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
