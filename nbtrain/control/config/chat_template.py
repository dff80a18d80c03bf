"""A model's chat template, read and rendered without transformers (plain jinja2, the way transformers
renders it): the panel's data preview shows the rendering, and the config check asks whether the template
renders ``tools`` before a run that trains on tool calls starts (``tools_problem``).

jinja2 only: nothing here imports torch or transformers (the kernel stays light).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nbtrain.contract.tools import TEMPLATE_FIX, probe_conversation, tools_left_out

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

    def segments(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[str, bool]]:
        """The rendered conversation as (text, inside a generation block) pieces. Raises TemplateError."""
        text = _compile(self.source).render(
            messages=messages, add_generation_prompt=False, tools=tools, documents=None, **self.tokens
        )
        out: list[tuple[str, bool]] = []
        for i, piece in enumerate(re.split(f"{re.escape(_GEN_START)}|{re.escape(_GEN_END)}", text)):
            if piece:
                out.append((piece, i % 2 == 1))
        return out

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """What ``tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)`` gives. Raises
        TemplateError."""
        return "".join(text for text, _ in self.segments(messages, tools))

    def tools_missing(self) -> str | None:
        """What of a tool-calling conversation this template leaves out of its rendering ("the tools'
        definitions", "the assistant's tool calls", or its error), or None when it renders both."""
        messages, tools = probe_conversation()
        try:
            text = self.render(messages, tools)
        except Exception as e:  # noqa: BLE001 - any failure of a user's template is the answer
            return f"a tool-calling conversation ({type(e).__name__}: {str(e)[:120]})"
        return tools_left_out(text)


def template_for(model: str, train: Mapping[str, Any] | None) -> ChatTemplate | None:
    """The template a run of ``model`` renders its chats with: ``train: chat_template_path`` (TRL's: a
    template file, or a folder holding one) when set, else the model folder's own. None when there is none
    to read here (a Hub id not downloaded: the worker then checks)."""
    path = (train or {}).get("chat_template_path")
    p = _path(path) if isinstance(path, str) and path else None
    if p is not None:
        if p.is_file():
            return ChatTemplate(p.read_text(encoding="utf-8"), p.name)
        return find_chat_template(p) if p.is_dir() else None
    p = _path(model)
    return find_chat_template(p) if p is not None and p.is_dir() else None


def _path(text: str) -> Path | None:
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "~name" of an unknown user: the model check names it
        return None


def tools_problem(files: list[str], model: str, train: Mapping[str, Any] | None) -> str | None:
    """Why a run whose rows (of ``files``) define or call tools cannot start with ``model``'s template:
    it renders no template at all, or leaves the tools or the calls out (they would not be trained or
    seen). None when it renders both, or when no rows have tools."""
    if not files:
        return None
    template = template_for(model, train)
    if template is None:
        folder = _path(model)
        if (train or {}).get("chat_template_path") or (folder is not None and folder.is_dir()):
            what = "no chat template"
        else:
            return None  # a Hub model not here yet: its template is checked once it is downloaded
    else:
        missing = template.tools_missing()
        if missing is None:
            return None
        what = f"a chat template ({template.origin}) that does not render {missing}"
    return f"the rows of {', '.join(files)} define or call tools, but {model} has {what}; {TEMPLATE_FIX}"


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
