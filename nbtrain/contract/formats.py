"""Training-data formats: detect, check and normalise rows (stdlib only).

The kernel uses this to reject bad data before anything starts; the worker uses the same functions to
turn every row into what the TRL trainer of the objective takes:

- sft: conversational ``messages`` or plain ``text`` (from messages / alpaca / sharegpt / text rows)
- dpo, orpo, reward (and kto): ``preference`` rows ``{prompt?, chosen, rejected}``
- kto: ``unpaired`` rows ``{prompt, completion, label}`` (label true = desirable)
- grpo, rloo: ``prompt`` rows ``{prompt, ...}``; the other columns go to the reward functions

Preference, unpaired and prompt rows hold either plain strings or conversational lists of
``{role, content}`` messages (one style per dataset). ``data: columns:`` renames odd column names to
these before anything else looks at a row (see ``apply_columns``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from nbtrain.contract import formats_peers as peers
from nbtrain.contract.errors import RowError
from nbtrain.contract.images import ImageRowError, flatten, has_images, to_parts
from nbtrain.contract.objectives import OBJECTIVES, rewards_objectives
from nbtrain.contract.tools import conversation, normalise_tools

# Data files by suffix -> the `datasets` builder that reads them (the one table; the check, the loader and
# the eval job all look here).
FILE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}

SFT_FORMATS = ("messages", "alpaca", "sharegpt", "text")
ALIGNMENT_FORMATS = ("preference", "unpaired", "prompt")
FORMATS = (*SFT_FORMATS, *ALIGNMENT_FORMATS)
# The column names data: columns: may map to (canonical name -> what it holds).
CANONICAL_COLUMNS = {
    "prompt": "the prompt (a string, or a list of messages)",
    "chosen": "the preferred answer",
    "rejected": "the dispreferred answer",
    "completion": "the answer KTO judges",
    "label": "whether the completion is desirable (true/false)",
    "messages": "a conversation (list of {role, content})",
    "conversations": "a sharegpt conversation",
    "conversation": "ms-swift's conversation ([{human, assistant}, ...])",
    "history": "earlier turns of an alpaca / query-response row ([[query, response], ...])",
    "query": "a single turn's prompt (ms-swift)",
    "response": "a single turn's answer (ms-swift)",
    "tools": "the functions a conversation may call (JSON schemas, a list or a JSON string)",
    "kto_tag": "whether a conversation's last answer is desirable (KTO)",
    "rejected_response": "the other answer to a conversation's last turn (ms-swift DPO)",
    "text": "plain text",
    "instruction": "an alpaca instruction",
    "input": "an alpaca input",
    "output": "an alpaca output",
    "system": "a system prompt",
    "images": "the row's images (paths, URLs, base64, or an Image column) for a vision-language model",
    "image": "the row's one image",
}

_ROLES = ("system", "user", "assistant", "tool")

FORMAT_HELP = {
    "messages": '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}',
    "alpaca": '{"instruction": "...", "input": "(optional)", "output": "..."}',
    "sharegpt": '{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}',
    "text": '{"text": "..."}',
    "preference": '{"prompt": "...", "chosen": "...", "rejected": "..."} (strings or lists of messages)',
    "unpaired": '{"prompt": "...", "completion": "...", "label": true} (label false = undesirable)',
    "prompt": '{"prompt": "..."} or {"prompt": [{"role": "user", "content": "..."}]}, plus any columns '
    "your reward functions read",
}


# The longest line of a JSON-lines file nbtrain reads (the kernel's check and the worker's loader): a longer
# one is refused by name before it can cost a process its memory; no training row is near this size.
MAX_ROW_BYTES = 32 * 2**20


def jsonl_lines(path: str | os.PathLike[str], max_row_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a JSON-lines file, read in binary with a bounded readline.

    A line over ``max_row_bytes`` or not UTF-8 raises :class:`RowError` naming the line and the fix; a line
    is never read whole past the bound. The JSON of each line is the caller's to parse."""
    name = os.path.basename(path)
    if max_row_bytes is None:
        max_row_bytes = MAX_ROW_BYTES
    with open(path, "rb") as f:
        lineno = 0
        while raw := f.readline(max_row_bytes + 1):
            lineno += 1
            if len(raw) > max_row_bytes and not raw.endswith(b"\n"):  # its newline may be the extra byte
                raise RowError(
                    f"line {lineno} of {name} is over {max_row_bytes / 2**20:g} MiB: one row that large "
                    f"cannot be trained on; split it, or check the file is JSON lines"
                )
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RowError(
                    f"line {lineno} of {name} is not UTF-8 text (byte {e.start + 1} of the line is "
                    f"{raw[e.start : e.start + 1]!r}); save the file as UTF-8"
                ) from None


def detect_format(row: Mapping[str, Any], objective: str = "sft") -> str | None:
    """The format a single row is in for ``objective``, judged by its keys, or None."""
    if objective != "sft":
        for fmt in OBJECTIVES[objective].formats:
            if _looks_like(row, fmt):
                return fmt
        return None
    key = peers.first_conversation_key(row)
    if key == "messages":
        return "messages"
    if key == "conversations":
        conv = row["conversations"]
        if isinstance(conv, list) and conv and isinstance(conv[0], Mapping) and "role" in conv[0]:
            return "messages"
        return "sharegpt"
    if key == "conversation":
        return "sharegpt"
    if "instruction" in row and "output" in row:
        return "alpaca"
    if "text" in row:
        return "text"
    # The aliases of a single turn, only for rows that are no other objective's data (formats_peers).
    if not (peers.looks_preference(row) or peers.looks_unpaired(row)):
        try:
            if peers.single_turn_keys(row) is not None:
                return "alpaca"
        except RowError:
            return "alpaca"  # two names compete: to_example says which
    return None


def _looks_like(row: Mapping[str, Any], fmt: str) -> bool:
    if fmt == "preference":
        return peers.looks_preference(row)
    if fmt == "unpaired":
        return peers.looks_unpaired(row)
    if fmt == "prompt":
        return "prompt" in row
    return detect_format(row) == fmt


def _other_kind(row: Mapping[str, Any], objective: str) -> tuple[str, str] | None:
    """(what the row is, which objectives train on it) when it is data for another objective."""
    sft = detect_format(row)
    if sft is not None and objective != "sft" and not any(_looks_like(row, f) for f in ALIGNMENT_FORMATS):
        return f"SFT data ({sft})", "objective: sft"
    if objective == "sft" or objective in rewards_objectives():
        if _looks_like(row, "preference"):
            return "preference data (chosen/rejected)", "objective: dpo, orpo, kto or reward"
        if _looks_like(row, "unpaired"):
            return "unpaired preference data (completion/label)", "objective: kto"
    if objective == "sft" and _looks_like(row, "prompt"):
        return "prompt-only data (no answer to learn from)", "objective: grpo or rloo (with rewards:)"
    return None


def apply_columns(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> Mapping[str, Any]:
    """Rename a row's columns as ``data: columns: {canonical: column}`` says; RowError if one is missing."""
    if not columns:
        return row
    out = dict(row)
    for canonical, column in columns.items():
        if column not in row:
            raise RowError(
                f"it has no column {column!r} (data: columns: maps {canonical}: {column}); "
                f"its columns are {sorted(row)}"
            )
        if column != canonical:
            out.pop(canonical, None)  # the mapped column wins over one already called that
            out[canonical] = out.pop(column)
    return out


def _str_field(row: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    v = row.get(key)
    if v is None and not required:
        return ""
    if key not in row:
        raise RowError(f"field {key!r} is missing (its fields: {sorted(row)})")
    if v is None:  # datasets fills a field some rows lack with null
        raise RowError(f"field {key!r} is missing or null")
    if not isinstance(v, str):
        raise RowError(f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def to_example(
    row: Mapping[str, Any],
    fmt: str,
    *,
    vision: bool | None = False,
    tags: Mapping[str, str] | None = None,
    mask_history: bool = False,
) -> dict[str, Any]:
    """Normalise one row to ``{"messages": [...]}`` or ``{"text": ...}``; RowError if not ``fmt``.

    ``mask_history`` (``data: mask_history``, LLaMA-Factory's name): a conversation trains on its last
    assistant turn only; the earlier ones are marked not to train (a turn's own flag wins).

    ``tags``: a LLaMA-Factory dataset's sharegpt key and role names (its dataset_info.json ``tags``, as
    ``formats_peers.DEFAULT_TAGS`` names them), for the turns of its conversations.

    ``vision`` (a vision-language model's run): every conversational row in TRL's vision layout
    (``{"messages": [content parts], "images": [...]}``, nbtrain.contract.images), text-only rows too;
    None: only rows that name images (the kernel's check, before the model is known); False: a row with
    images is refused, and content given as text parts is joined into a string."""
    if not isinstance(row, Mapping):
        raise RowError(f"row must be an object, got {type(row).__name__}")
    named = has_images(row)
    with_images = vision if vision is not None else named
    if not with_images and not named and not _has_parts(row):
        return masked_history(_to_example(row, fmt, tags)) if mask_history else _to_example(row, fmt, tags)
    try:
        flat, refs, leading = flatten(row)
    except ImageRowError as e:
        raise RowError(str(e)) from None
    if refs and not with_images:
        raise RowError(
            f"it has {len(refs)} image(s), which only a vision-language model trains on (a model whose "
            f"config.json has a vision_config, e.g. Qwen2.5-VL, LLaVA, SmolVLM)"
        )
    example = _to_example(flat, fmt, tags)
    if mask_history:
        example = masked_history(example)
    if not with_images:
        return example
    if "tools" in example:
        raise RowError("rows with tools are trained on text models only here; drop the tools or the images")
    if "text" in example:
        raise RowError(
            f"{fmt} rows cannot hold images; a vision-language model trains on conversations (messages, "
            f"alpaca or sharegpt rows) or preference pairs"
        )
    try:
        return to_parts(example, refs, leading)
    except ImageRowError as e:
        raise RowError(str(e)) from None


def masked_history(example: dict[str, Any]) -> dict[str, Any]:
    """``example`` with every assistant turn but the last marked not to train, where the row did not mark
    it itself (``train``); anything but a conversation is returned as it is."""
    msgs = example.get("messages")
    if not isinstance(msgs, list):
        return example
    answers = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    for i in answers[:-1]:
        msgs[i].setdefault("train", False)
    if answers and msgs[answers[-1]].get("train") is False:
        raise RowError(
            "mask_history trains a conversation's last assistant turn only, and this row marks that one "
            "not to train (loss: false / weight: 0); drop the flag or mask_history"
        )
    return example


def _has_parts(row: Mapping[str, Any]) -> bool:
    """Whether some message's content is a list of parts (OpenAI's text parts, or images)."""
    for key in ("messages", "conversations"):
        turns = row.get(key)
        if isinstance(turns, list) and any(
            isinstance(t, Mapping) and isinstance(t.get("content"), list) for t in turns
        ):
            return True
    return False


def _to_example(row: Mapping[str, Any], fmt: str, tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    if fmt == "text":
        text = _str_field(row, "text")
        if not text.strip():
            raise RowError("field 'text' is empty")
        return {"text": text}
    if fmt == "alpaca":
        keys = peers.single_turn_keys(row)
        if keys is None:  # the field that is missing is named
            keys = (next((k for k in peers.QUERY_KEYS if row.get(k) is not None), "instruction"), "output")
        return {"messages": _check_messages(peers.single_turn(row, keys), "messages")}
    if fmt in ("sharegpt", "messages"):
        key = peers.conversation_key(row)
        if key is None:
            want = "messages" if fmt == "messages" else "conversations"
            raise RowError(f"field {want!r} is missing (its fields: {sorted(row)})")
        _key, turns = peers.turns_of(row, tags)
        return _with_tools(row, _check_messages(turns, key, tools=_row_tools(row)))
    if fmt == "preference":
        return _preference(row, tags)
    if fmt == "unpaired":
        return _unpaired(row, tags)
    if fmt == "prompt":
        return {"prompt": _prompt(row, "prompt", required=True)}
    raise RowError(f"unknown format {fmt!r}")


def _turns(value: Any, key: str, *, last_assistant: bool | None = None) -> list[dict[str, str]]:
    """A non-empty list of valid messages; ``last_assistant`` True/False demands the last role."""
    if not isinstance(value, list) or not value:
        raise RowError(f"field {key!r} must be a non-empty string or list of {{role, content}} messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise RowError(f"{key}[{i}] must have 'role' and 'content'")
        if m["role"] not in _ROLES:
            raise RowError(
                f"{key}[{i}].role={m['role']!r} is not one of {list(_ROLES)}; rename the role, or drop "
                f"the turn"
            )
        if m.get("tool_calls") or m.get("function_call"):
            raise RowError(
                f"{key}[{i}] calls a tool; preference and KTO rows with tool calls are not trained here yet "
                f"(train the tool use with objective: sft)"
            )
        if not isinstance(m["content"], str):
            raise RowError(f"{key}[{i}].content must be a string")
        out.append({"role": str(m["role"]), "content": m["content"]})
    if last_assistant is True and out[-1]["role"] != "assistant":
        raise RowError(f"{key} must end with an assistant turn (the answer being judged)")
    if last_assistant is False and out[-1]["role"] == "assistant":
        raise RowError(
            f"{key} ends with an assistant turn; the prompt is what the model answers, so end it with a "
            f"user (or system) turn"
        )
    return out


def _answer(row: Mapping[str, Any], key: str, conversational: bool) -> str | list[dict[str, str]]:
    v = row.get(key)
    if v is None:
        raise RowError(f"field {key!r} is missing or null")
    if conversational:
        if not isinstance(v, list):
            raise RowError(f"field {key!r} is a {type(v).__name__} but the row is conversational (lists)")
        return _turns(v, key, last_assistant=True)
    if not isinstance(v, str):
        raise RowError(
            f"field {key!r} must be a string or a list of messages, got {type(v).__name__}"
            if not isinstance(v, list)
            else f"field {key!r} is a list of messages but the row is plain text (strings); use one style"
        )
    if not v.strip():
        raise RowError(f"field {key!r} is empty")
    return v


def _prompt(row: Mapping[str, Any], key: str, *, required: bool) -> Any:
    v = row.get(key)
    if v is None:
        if required:
            raise RowError(f"field {key!r} is missing or null")
        return None
    if isinstance(v, list):
        return _turns(v, key, last_assistant=False)
    if not isinstance(v, str):
        raise RowError(f"field {key!r} must be a string or a list of messages, got {type(v).__name__}")
    if required and not v.strip():
        raise RowError(f"field {key!r} is empty")
    return v


def _preference(row: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    row = peers.preference_row(row, tags)
    # TRL extracts an implicit prompt (the shared start of chosen and rejected) when there is no prompt.
    prompt = _prompt(row, "prompt", required=False) if "prompt" in row else None
    if "prompt" in row and row["prompt"] is None:
        raise RowError("field 'prompt' is null (leave the column out entirely for an implicit prompt)")
    conversational = isinstance(prompt, list) if prompt is not None else isinstance(row.get("chosen"), list)
    out: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
    out["chosen"] = _answer(row, "chosen", conversational)
    out["rejected"] = _answer(row, "rejected", conversational)
    return out


_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _label(v: Any) -> bool:
    # JSON gives a bool; CSV gives text and parquet may give 0/1, so those spellings are accepted too.
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in (*_TRUE, *_FALSE):
        return v.strip().lower() in _TRUE
    raise RowError(f"field 'label' must be true (desirable) or false (undesirable), got {v!r}")


def _unpaired(row: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    row = peers.unpaired_row(row, tags)
    prompt = _prompt(row, "prompt", required=True)
    completion = _answer(row, "completion", isinstance(prompt, list))
    return {"prompt": prompt, "completion": completion, "label": _label(row.get("label"))}


def is_conversational(example: Mapping[str, Any]) -> bool:
    """Whether a normalised example holds messages (and so needs the tokenizer's chat template)."""
    return any(isinstance(example.get(k), list) for k in ("messages", "prompt", "chosen", "completion"))


def _row_tools(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    if row.get("tools") and row.get("functions"):
        raise RowError("it has both 'tools' and 'functions' (OpenAI's older name for them); keep one")
    key = "functions" if row.get("functions") else "tools"
    return normalise_tools(row.get(key), key)


def _with_tools(row: Mapping[str, Any], msgs: list[dict[str, Any]]) -> dict[str, Any]:
    tools = _row_tools(row)
    return {"messages": msgs, "tools": tools} if tools else {"messages": msgs}


def _check_messages(
    msgs: list[Any], key: str, *, tools: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    out = conversation(msgs, key, tools or [])
    for i, m in enumerate(out):
        if m.get("train") and m["role"] != "assistant":
            raise RowError(
                f"{key}[{i}] is a {m['role']} turn marked to train (loss: true / weight: 1); only assistant "
                f"turns are trained on, so drop the flag"
            )
    if any(m["role"] == "assistant" for m in out) and all(
        m.get("train") is False for m in out if m["role"] == "assistant"
    ):
        raise RowError(
            f"every assistant turn of {key} is marked not to train (loss: false / weight: 0), so there is "
            f"nothing to learn; mark one to train or drop the row"
        )
    if not any(m["role"] == "assistant" for m in out):
        raise RowError(f"{key} has no assistant turn, so there is nothing to learn")
    return out


def show_row(row: Any, limit: int = 300) -> str:
    text = json.dumps(row, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _no_format(n: int, row: Any, objective: str) -> str:
    keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
    formats = OBJECTIVES[objective].formats
    expected = "; ".join(f"{k}: {FORMAT_HELP[k]}" for k in formats)
    if objective == "sft":
        head = f"row {n} matches no known format (keys: {keys}): {show_row(row)}."
    else:
        head = f"row {n} is not data objective: {objective} trains on (keys: {keys}): {show_row(row)}."
    other = _other_kind(row, objective) if isinstance(row, Mapping) else None
    if other is not None:
        head += f" It looks like {other[0]}, which {other[1]} trains on."
    elif objective != "sft":
        head += " Map other column names with data: columns: {prompt: your_column, ...}."
    return f"{head} Expected one of: {expected}"


def check_rows(
    rows: Iterable[tuple[int, Any]],
    fmt: str,
    objective: str = "sft",
    columns: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
) -> tuple[str, str | None]:
    """Check numbered rows against ``fmt`` (or detect it when 'auto') for ``objective`` (``tags``: see
    ``to_example``).

    Returns ``(format, problem)``: problem is None when every row fits, else one sentence naming the
    first offending row (its number and content) and the formats that were expected.
    """
    resolved = fmt
    shape: tuple[Any, ...] | None = None  # the first row's normalised keys and style, for preference data
    for n, row in rows:
        if columns and isinstance(row, Mapping):
            try:
                row = apply_columns(row, columns)
            except RowError as e:
                return resolved, f"row {n} does not fit data: columns ({e}): {show_row(row)}"
        if resolved == "auto":
            detected = detect_format(row, objective) if isinstance(row, Mapping) else None
            if detected is None:
                return fmt, _no_format(n, row, objective)
            resolved = detected
        try:
            # images checked as such (the kernel's look)
            example = to_example(row, resolved, vision=None, tags=tags)
        except RowError as e:
            return resolved, f"row {n} is not valid {resolved} data ({e}): {show_row(row)}"
        if resolved in ("preference", "unpaired"):
            # A dataset column has one type: a row that drops the prompt, or switches between strings
            # and message lists, fails to load in the worker, so say which row it is now.
            this = (tuple(sorted(example)), is_conversational(example))
            if shape is None:
                shape = this
            elif this != shape:
                what = "conversational (lists)" if this[1] else "plain text"
                first = "conversational (lists)" if shape[1] else "plain text"
                return resolved, (
                    f"row {n} does not match the first row: it has fields {list(this[0])} and is {what}, "
                    f"the first row has {list(shape[0])} and is {first}: {show_row(row)}"
                )
    return resolved, None
