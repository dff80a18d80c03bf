"""Loss on the assistant's turns only, with any chat template: ``train: assistant_only_loss: true``.

TRL finds the assistant's tokens through ``{% generation %}`` blocks in the chat template, and for templates
without them it knows a fixed list of patched ones (``trl.chat_template_utils.get_training_chat_template``);
any other model's template (SmolLM2's, most fine-tunes') is refused. nbtrain finds the same tokens from the
template itself: it renders the conversation up to each assistant turn (with the generation prompt) and up
to the end of that turn; the characters between are the turn, its end-of-turn token included (the model
must learn to stop), the whitespace after it not. That holds for any template that renders a conversation
as the prefix of its continuation, which is checked for each row: one that does not is refused by row.
The rows are then tokenised once here (``input_ids`` + ``assistant_masks``, as TRL's own preparation
would give them with generation blocks), and TRL builds the labels from the masks.

Per-message loss flags (ms-swift's ``"loss": false|true``, OpenAI's ``"weight": 0|1``; a message's
``train`` once ``contract/formats`` has read it): only the assistant turns marked to train are in the mask,
a turn with no flag trains as usual. A dataset whose rows carry such flags is trained on its assistant
turns only, with these masks whatever the template (``own_masks``): that is what the flags mean in ms-swift
and OpenAI's fine-tuning, where a user turn is never trained on either. A run whose ``train:`` says
``assistant_only_loss: false`` (every token) with flagged rows is refused: the two cannot both hold. The
kernel's data check refuses it before anything starts (``control/config/datacheck.flags_problem``, on the
rows it samples); ``own_masks`` refuses it here too, for flags only rows past that sample carry.
"""

from __future__ import annotations

import json
from typing import Any


class TemplateMaskError(ValueError):
    """The chat template does not render a conversation as the prefix of its continuation."""


def needs_own_masks(tok: Any) -> bool:
    """Whether the assistant masks must come from here: the template has no ``{% generation %}`` blocks
    and TRL has no training version of it."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = getattr(tok, "chat_template", None)
    if not template or has_generation_markers(template):
        return False
    try:
        get_training_chat_template(tok)
    except ValueError:
        return True
    return False


def _tools(tools: Any) -> Any:
    """A row's ``tools`` as ``apply_chat_template`` takes them (the loader stores a JSON string), or None."""
    if isinstance(tools, str):
        tools = json.loads(tools)
    return tools or None


def assistant_spans(
    tok: Any, messages: list[dict[str, Any]], tools: Any = None
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as the template renders it (with the row's ``tools``), and the character spans of
    its assistant turns."""
    tools = _tools(tools)
    full = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or m.get("train") is False:
            continue
        before = (
            tok.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            if i
            else ""
        )
        upto = tok.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise TemplateMaskError(
                f"the chat template does not render the conversation up to turn {i + 1} as the start of the "
                f"whole one, so its assistant turns cannot be found; give the template {{% generation %}} "
                f"blocks (tokenizer.chat_template) or train on every token (assistant_only_loss: false)"
            )
        end = len(upto.rstrip())
        if end > len(before):
            spans.append((len(before), end))
    return full, spans


def tokenise_with_masks(tok: Any, messages: list[dict[str, Any]], tools: Any = None) -> dict[str, list[int]]:
    full, spans = assistant_spans(tok, messages, tools)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s < b and e > a for a, b in spans)) for s, e in enc["offset_mapping"]]
    return {"input_ids": list(enc["input_ids"]), "assistant_masks": mask}


def with_assistant_masks(ds: Any, tok: Any) -> Any:
    """``ds`` (conversational rows, ``messages``) tokenised with its assistant masks; other columns dropped.
    Raises ValueError naming the row whose template rendering or content does not allow it."""
    if ds is None:
        return None
    names = list(ds.column_names or [])
    if "input_ids" in names and "assistant_masks" in names:
        return ds  # tokenised here already
    if "messages" not in names:
        raise ValueError(
            "assistant_only_loss: true needs conversational rows (messages); these rows have "
            f"{', '.join(names)}. For prompt/completion rows use completion_only_loss (the default there)"
        )

    def one(row: dict[str, Any], idx: int) -> dict[str, list[int]]:
        try:
            out = tokenise_with_masks(tok, row["messages"], row.get("tools"))
        except TemplateMaskError as e:
            raise ValueError(f"row {idx + 1}: {e}") from None
        if 1 not in out["assistant_masks"]:
            raise ValueError(f"row {idx + 1} has no assistant turn to train on (assistant_only_loss: true)")
        return out

    return ds.map(one, with_indices=True, remove_columns=names)


# The rows of a stream looked at for loss flags (a stream is read once, as it trains).
FLAG_ROWS = 1000


def has_turn_flags(ds: Any) -> bool:
    """Whether some row's message carries a loss flag (``train``): every row of a dataset, the first
    ``FLAG_ROWS`` of a stream."""
    import itertools

    import datasets

    if ds is None or "messages" not in (ds.column_names or []):
        return False
    streaming = isinstance(ds, datasets.IterableDataset)
    rows = itertools.islice(ds, FLAG_ROWS) if streaming else ds.select_columns(["messages"])
    return any(any(isinstance(m, dict) and "train" in m for m in row["messages"]) for row in rows)


def has_tools(ds: Any) -> bool:
    """Whether some row defines tools or calls one: every row of a dataset, the first ``FLAG_ROWS`` of a
    stream."""
    import itertools

    import datasets

    columns = ds.column_names or [] if ds is not None else []
    if "messages" not in columns:
        return False
    keep = [c for c in ("messages", "tools") if c in columns]
    streaming = isinstance(ds, datasets.IterableDataset)
    rows = itertools.islice(ds, FLAG_ROWS) if streaming else ds.select_columns(keep)
    return any(
        row.get("tools") or any(isinstance(m, dict) and m.get("tool_calls") for m in row["messages"])
        for row in rows
    )


def tools_template_problem(tok: Any, ds: Any) -> str | None:
    """Why rows that define or call tools cannot train with ``tok``'s chat template (it leaves the tools
    or the calls out, or fails on them), or None. The worker's check, for what the kernel could not see
    before the run started: a Hub model's template, a Hub dataset's rows."""
    from nbtrain.contract.tools import TEMPLATE_FIX, probe_conversation, tools_left_out

    if not has_tools(ds):
        return None
    messages, tools = probe_conversation()
    try:
        missing = tools_left_out(str(tok.apply_chat_template(messages, tools=tools, tokenize=False)))
    except Exception as e:  # noqa: BLE001 - any failure of the template on tool rows is the answer
        missing = f"a tool-calling conversation ({type(e).__name__}: {str(e)[:120]})"
    if missing is None:
        return None
    what = f"the model's chat template does not render {missing}"
    return f"the rows define or call tools, but {what}; {TEMPLATE_FIX}"


def own_masks(assistant_only_loss: bool, train_cfg: dict[str, Any], tok: Any, ds: Any) -> str | None:
    """Why an SFT run's masks come from here (the log's line), or None when TRL makes its own (or none).
    ValueError when the rows' loss flags contradict ``train: assistant_only_loss: false``."""
    if has_turn_flags(ds):
        if "assistant_only_loss" in train_cfg and not train_cfg["assistant_only_loss"]:
            raise ValueError(
                "the rows mark which turns to train (loss: true/false or weight: 0/1), but train: says "
                "assistant_only_loss: false (train on every token); remove that setting (flagged rows train "
                "on their assistant turns marked to train), or drop the flags from the rows"
            )
        return (
            "the rows mark which turns to train (loss / weight): loss on the assistant turns marked to train "
            "only (assistant_only_loss)"
        )
    if assistant_only_loss and needs_own_masks(tok):
        return (
            "assistant_only_loss: the chat template has no {% generation %} blocks; the assistant turns are "
            "found from its rendering instead"
        )
    return None


__all__ = [
    "TemplateMaskError",
    "assistant_spans",
    "has_tools",
    "has_turn_flags",
    "needs_own_masks",
    "own_masks",
    "tokenise_with_masks",
    "tools_template_problem",
    "with_assistant_masks",
]
