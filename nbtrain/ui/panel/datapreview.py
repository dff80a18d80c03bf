"""The panel's data preview: the first rows of the data as the model will see them (each row's format,
its messages, images and tools, and which tokens the chat template marks as trained), as HTML."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from nbtrain.contract.formats import (
    FILE_KINDS,
    FORMATS,
    RowError,
    apply_columns,
    detect_format,
    to_example,
)
from nbtrain.contract.ggufcache import is_gguf
from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import datasetinfo
from nbtrain.control.config.chat_template import ChatTemplate, find_chat_template
from nbtrain.control.config.datacheck import DataProblem, read_rows
from nbtrain.ui.preview import CHIP_STYLE, THUMB_STYLE, segments_html

PREVIEW_CHARS = 2000  # per message / rendered row, so one huge row cannot flood the notebook


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


def resolve_path(spec: str, base: Path) -> Path:
    p = Path(spec).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def section_of(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, Mapping) else {}


def data_preview(cfg: Mapping[str, Any], base: Path, n: int = 3) -> Preview:
    """The first ``n`` training rows of ``cfg`` normalised as the worker will, and chat-templated."""
    data = section_of(cfg, "data")
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
    if "\0" in spec:  # the field's own problem says so; Path's lookups raise a bare ValueError on one
        return Preview(note="no preview: the path holds a NUL byte (\\0)")
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
    path = resolve_path(spec, base)
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

    out = Preview(mark_trained=bool(section_of(cfg, "train").get("assistant_only_loss")), note=note)
    model = cfg.get("model")
    if isinstance(model, str) and model.strip() and "\0" not in model:
        mdir = resolve_path(model, base)
        if is_gguf(mdir.name) and mdir.is_file():
            out.template, out.template_note = gguf_template(mdir)
        elif mdir.is_dir():
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


def gguf_template(file: Path) -> tuple[ChatTemplate | None, str | None]:
    """A GGUF file's chat template, read from its header (``tokenizer.chat_template``, as llama.cpp and
    transformers read it), or why there is none."""
    from nbtrain.control.models import gguf

    try:
        info = gguf.read(file)
    except gguf.GgufProblem as e:
        return None, f"could not read the chat template of {file.name}: {e}"
    if not info.chat_template:
        return None, f"{file.name} has no chat template in its header (conversational data needs one)"
    return ChatTemplate(info.chat_template, f"{file.name}'s header"), None


_ROLE_COLOURS = {"system": "#6a1b9a", "user": "#1565c0", "assistant": "#2e7d32", "tool": "#ef6c00"}
PRE_STYLE = "white-space:pre-wrap;margin:0;font-family:monospace;font-size:12px"


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
        f"<pre style='{PRE_STYLE};margin-left:1em'>{body}</pre></div>"
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
        f"<pre style='{PRE_STYLE};margin-left:1em'>{'<br>'.join(lines)}</pre></details>"
    )


def thumbnails(refs: list[Any], base: Path, most: int = 4) -> list[str]:
    """Small PNG data: URIs of a row's first images that are on this machine (paths, bytes); Pillow only."""
    import base64
    import io

    from PIL import Image

    from nbtrain.contract.images import ImageRowError, image_source, too_many_pixels

    out = []
    for ref in refs[:most]:
        try:
            kind, value = image_source(ref, base)
            if kind not in ("path", "bytes"):
                continue
            with Image.open(value if kind == "path" else io.BytesIO(value)) as im:
                if too_many_pixels(*im.size):  # from the header: never decoded (the row's check says so)
                    continue
                im.thumbnail((64, 64))  # shrunk while decoding where the format allows (JPEG's draft)
                small = im.convert("RGB")
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
            parts.append(f"<pre style='{PRE_STYLE}'>{html.escape(_clip(str(ex['text'])))}</pre>")
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
                parts.append(
                    f"<pre style='{PRE_STYLE};margin-left:1em'>{html.escape(_clip(str(value)))}</pre>"
                )
        if r.segments is not None:
            body = segments_html(r.segments, p.mark_trained)
            parts.append(
                f"<details open><summary><small>as the model sees it</small></summary>"
                f"<pre style='{PRE_STYLE};background:#f6f6f6;padding:4px'>{body}</pre></details>"
            )
        if r.template_error:
            parts.append(
                f"<div style='color:#c62828'>the chat template failed: {html.escape(r.template_error)}</div>"
            )
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def preview_inputs(cfg: Mapping[str, Any], base: Path) -> tuple[Any, ...]:
    """What the preview depends on (including file times), so other edits do not re-read the data."""
    data, train = section_of(cfg, "data"), section_of(cfg, "train")
    stamps: list[Any] = []
    for spec in (data.get("train"), cfg.get("model")):
        if isinstance(spec, str) and spec.strip() and "\0" not in spec:
            p = resolve_path(spec, base)
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
