"""Rows made for other fine-tuning tools, read as nbtrain's own (stdlib only; used by ``formats``).

What each peer writes, and what it becomes here:

- LLaMA-Factory: alpaca rows with ``system`` and ``history`` (``[[query, response], ...]``: earlier turns);
  sharegpt ``conversations`` with roles human / gpt / system / function_call / observation (other names
  through ``tags``); preference rows (``ranking``) with ``chosen`` / ``rejected`` as ONE message each after
  a sharegpt ``conversations`` (or an alpaca instruction); KTO rows with ``kto_tag`` (bool).
- ms-swift: ``messages`` with an optional top-level ``system``; ``rejected_response`` (DPO / ORPO: the last
  assistant message is the chosen answer); ``label`` (KTO); roles ``tool_call`` / ``tool_response``; its
  AutoPreprocessor's ``conversation`` as ``[{"human": ..., "assistant": ...}, ...]`` and
  query / response / history rows.
- OpenAI: chat rows with ``tools`` (or legacy ``functions``); preference rows ``{"input": {"messages"},
  "preferred_output": [message], "non_preferred_output": [message]}``.

Names that mean one thing (precedence). A row is read by the first of these that fits, for the objective:
``messages`` > ``conversations`` > ``conversation`` (two of them in one row are refused: ambiguous), then
alpaca ``instruction`` + ``output``, then ``text``, then the aliases of a single turn, for ``objective:
sft`` only and only when the row is not already another objective's data: the prompt from one of
``query | instruction | prompt | question | problem``, the answer from one of ``response | output | answer
| completion | solution`` (two of either in a row are refused). So ``{prompt, completion, label}`` stays
KTO's unpaired row, ``{prompt}`` GRPO's prompt row, and ``{prompt, completion}`` is an SFT turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbtrain.contract.errors import RowError

CONVERSATION_KEYS = ("messages", "conversations", "conversation")
QUERY_KEYS = ("query", "instruction", "prompt", "question", "problem")
RESPONSE_KEYS = ("response", "output", "answer", "completion", "solution")

# sharegpt's names for the roles (LLaMA-Factory's and others'), and the one they become (tool calls as
# ``tool_call`` turns, read by ``tools.conversation``).
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "system": "system",
    "function_call": "tool_call",
    "tool_call": "tool_call",
    "observation": "tool",
    "tool": "tool",
    "tool_response": "tool",
}
# LLaMA-Factory's dataset_info.json ``tags`` (these are its defaults).
DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
_TAG_ROLES = {
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "tool_call",
    "system_tag": "system",
}


def conversation_key(row: Mapping[str, Any]) -> str | None:
    """Which of messages / conversations / conversation holds the row's turns; RowError for two."""
    found = [k for k in CONVERSATION_KEYS if row.get(k) is not None]
    if len(found) > 1:
        raise RowError(
            f"it has both {found[0]!r} and {found[1]!r}, so which conversation to train on is ambiguous; "
            f"drop one column, or choose one with data: columns: {{messages: {found[1]}}}"
        )
    return found[0] if found else None


def first_conversation_key(row: Mapping[str, Any]) -> str | None:
    """``conversation_key`` without the check (detection; the check comes with the row's normalisation)."""
    return next((k for k in CONVERSATION_KEYS if row.get(k) is not None), None)


def _flag(turn: Mapping[str, Any], where: str) -> dict[str, bool]:
    """ms-swift's ``"loss": true|false`` and OpenAI's ``"weight": 0|1`` on a turn, as ``{"train": bool}``."""
    out: dict[str, bool] = {}
    for key, ok in (("loss", (True, False)), ("weight", (0, 1))):
        v = turn.get(key)
        if v is None:
            continue
        if isinstance(v, bool) if key == "loss" else (v in ok and not isinstance(v, float | str)):
            if "train" in out:
                raise RowError(f"{where} has both 'loss' and 'weight'; keep one")
            out["train"] = bool(v)
        else:
            raise RowError(
                f"{where}.{key} must be {'true or false' if key == 'loss' else '0 or 1'} (whether the turn "
                f"is trained on), got {v!r}"
            )
    return out


def sharegpt_turns(conv: Any, key: str, tags: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A sharegpt conversation (``{from, value}`` turns, or other names given by ``tags``) as role/content
    turns; tool calls stay ``tool_call`` turns for ``tools.conversation``."""
    if not isinstance(conv, list) or not conv:
        raise RowError(f"field {key!r} must be a non-empty list")
    t = {**DEFAULT_TAGS, **(tags or {})}
    roles = dict(SHAREGPT_ROLES)
    roles.update({t[tag]: role for tag, role in _TAG_ROLES.items()})
    out = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, Mapping) or t["role_tag"] not in turn or t["content_tag"] not in turn:
            raise RowError(f"{key}[{i}] must have {t['role_tag']!r} and {t['content_tag']!r}")
        name = turn[t["role_tag"]]
        role = roles.get(str(name)) or roles.get(str(name).lower())
        if role is None:
            raise RowError(
                f"{key}[{i}].{t['role_tag']}={name!r} is not one of {sorted(roles)}; rename it, or for a "
                f"LLaMA-Factory dataset give its tags in dataset_info.json"
            )
        value = turn[t["content_tag"]]
        if role != "tool_call" and role != "tool" and not isinstance(value, str):
            raise RowError(f"{key}[{i}].{t['content_tag']} must be a string")
        out.append({"role": role, "content": value, **_flag(turn, f"{key}[{i}]")})
    return out


def pairs_turns(conv: Any, key: str) -> list[dict[str, Any]]:
    """ms-swift's ``conversation``: ``[{"human": ..., "assistant": ...}, ...]`` as alternating turns."""
    if not isinstance(conv, list) or not conv:
        raise RowError(f"field {key!r} must be a non-empty list of {{human, assistant}} pairs")
    out = []
    for i, pair in enumerate(conv):
        if not isinstance(pair, Mapping) or not isinstance(pair.get("human"), str):
            raise RowError(f'{key}[{i}] must be {{"human": "...", "assistant": "..."}}')
        out.append({"role": "user", "content": pair["human"]})
        if pair.get("assistant") is not None:
            if not isinstance(pair["assistant"], str):
                raise RowError(f"{key}[{i}].assistant must be a string")
            out.append({"role": "assistant", "content": pair["assistant"]})
    return out


def role_turns(items: Any, key: str) -> list[Any]:
    """OpenAI / ms-swift turns as given, with their loss flags read as ``train``."""
    if not isinstance(items, list) or not items:
        raise RowError(f"field {key!r} must be a non-empty list of {{role, content}} objects")
    out: list[Any] = []
    for i, m in enumerate(items):
        if isinstance(m, Mapping):
            flag = _flag(m, f"{key}[{i}]")
            m = {k: v for k, v in m.items() if k not in ("loss", "weight")} | flag
        out.append(m)
    return out


def turns_of(row: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> tuple[str, list[Any]]:
    """(key, turns) of a conversational row, in whatever style it is written, with its top-level system."""
    key = conversation_key(row)
    if key is None:
        raise RowError(f"it has no conversation ({', '.join(CONVERSATION_KEYS)})")
    value = row[key]
    if key == "conversation":
        turns = pairs_turns(value, key)
    elif _sharegpt(value, tags):
        turns = sharegpt_turns(value, key, tags)
    else:
        turns = role_turns(value, key)
    return key, with_system(turns, row.get("system"), key)


def _sharegpt(value: Any, tags: Mapping[str, str] | None) -> bool:
    """Whether turns are sharegpt's: ``{from, value}`` turns, or any turns when a dataset gives ``tags``."""
    return (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[0], Mapping)
        and (bool(tags) or "role" not in value[0])
    )


def with_system(turns: list[Any], system: Any, key: str) -> list[Any]:
    """A row's top-level ``system`` (ms-swift, LLaMA-Factory) as the first turn."""
    if system is None or (isinstance(system, str) and not system.strip()):
        return turns
    if not isinstance(system, str):
        raise RowError(f"field 'system' must be a string, got {type(system).__name__}")
    if turns and isinstance(turns[0], Mapping) and turns[0].get("role") == "system":
        raise RowError(f"it has a 'system' field and {key} starts with a system turn too; keep one of them")
    return [{"role": "system", "content": system}, *turns]


def single_turn_keys(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """(prompt key, answer key) of a single-turn row by the aliases; RowError when two names compete."""
    queries = [k for k in QUERY_KEYS if row.get(k) is not None]
    answers = [k for k in RESPONSE_KEYS if row.get(k) is not None]
    if not queries or not answers:
        return None
    for found, what in ((queries, "prompt"), (answers, "answer")):
        if len(found) > 1:
            raise RowError(
                f"it has both {found[0]!r} and {found[1]!r}, so which is the {what} is ambiguous; drop one "
                f"of the two columns from the data (or in a hooks: preprocess function)"
            )
    return queries[0], answers[0]


def history_turns(history: Any) -> list[dict[str, str]]:
    """LLaMA-Factory's / ms-swift's ``history``: ``[[query, response], ...]``, the turns before."""
    if history is None:
        return []
    if not isinstance(history, list):
        raise RowError("field 'history' must be a list of [query, response] pairs")
    out = []
    for i, pair in enumerate(history):
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise RowError(f"history[{i}] must be a [query, response] pair of strings")
        out += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return out


def _text(row: Mapping[str, Any], key: str) -> str:
    v = row.get(key)
    if v is None:  # datasets fills a field some rows lack with null
        raise RowError(f"field {key!r} is missing or null")
    if not isinstance(v, str):
        raise RowError(f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def single_turn(row: Mapping[str, Any], keys: tuple[str, str]) -> list[dict[str, str]]:
    """An alpaca or query/response row as turns: system, history, the prompt (+ alpaca's input), answer."""
    query, answer = keys
    prompt = _text(row, query)
    extra = row.get("input")
    if isinstance(extra, str) and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    elif extra is not None and not isinstance(extra, str):
        raise RowError(f"field 'input' must be a string, got {type(extra).__name__}")
    turns = [*history_turns(row.get("history")), {"role": "user", "content": prompt}]
    turns.append({"role": "assistant", "content": _text(row, answer)})
    return with_system(turns, row.get("system"), "history")


def looks_preference(row: Mapping[str, Any]) -> bool:
    return (
        ("chosen" in row and "rejected" in row)
        or ("rejected_response" in row and "messages" in row)
        or ("preferred_output" in row and "non_preferred_output" in row)
    )


def looks_unpaired(row: Mapping[str, Any]) -> bool:
    if "completion" in row and "label" in row:
        return True
    if "kto_tag" in row and "instruction" in row and "output" in row:  # LLaMA-Factory's alpaca KTO rows
        return True
    conv = first_conversation_key(row) is not None
    return conv and ("kto_tag" in row or "label" in row)


def _one_answer(value: Any, key: str, tags: Mapping[str, str] | None = None) -> list[Any]:
    """A preference answer given as one message, a list of them, or a string, as a list of turns."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RowError(f"field {key!r} must be one assistant message, a list of them, or a string")
    if _sharegpt(value, tags):
        return sharegpt_turns(value, key, tags)
    return value


def _no_tools(row: Mapping[str, Any], where: Mapping[str, Any] | None = None) -> None:
    for src in (row, where or {}):
        if src.get("tools") or src.get("functions"):
            raise RowError(
                "preference and KTO rows with tools are not trained here yet; train the tool use with "
                "objective: sft, or drop the tools column"
            )


def preference_row(row: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """nbtrain's ``{prompt?, chosen, rejected}`` from a peer's preference row; other rows as they are.
    ``tags``: a LLaMA-Factory dataset's names of the sharegpt keys and roles (its dataset_info.json)."""
    if "preferred_output" in row or "non_preferred_output" in row:  # OpenAI's preference JSONL
        inp = row.get("input")
        if not isinstance(inp, Mapping) or not isinstance(inp.get("messages"), list):
            raise RowError(
                "field 'input' must be {\"messages\": [...]} (OpenAI's preference format: input, "
                "preferred_output, non_preferred_output)"
            )
        _no_tools(row, inp)
        return {
            "prompt": role_turns(inp["messages"], "input.messages"),
            "chosen": _one_answer(row.get("preferred_output"), "preferred_output"),
            "rejected": _one_answer(row.get("non_preferred_output"), "non_preferred_output"),
        }
    if "rejected_response" in row:  # ms-swift: the last assistant message is the chosen one
        _no_tools(row)
        key, turns = turns_of(row)
        if not turns or not isinstance(turns[-1], Mapping) or turns[-1].get("role") != "assistant":
            raise RowError(
                f"{key} must end with the chosen assistant turn (rejected_response is the other answer to "
                f"the turns before it)"
            )
        rejected = row["rejected_response"]
        if not isinstance(rejected, str) or not rejected.strip():
            raise RowError("field 'rejected_response' must be a non-empty string")
        return {"prompt": turns[:-1], "chosen": turns[-1:], "rejected": _one_answer(rejected, "rejected")}
    if "chosen" not in row or "rejected" not in row or "prompt" in row:
        return row
    if first_conversation_key(row) is not None:  # LLaMA-Factory's sharegpt ranking rows
        _no_tools(row)
        _key, turns = turns_of(row, tags)
        return {
            "prompt": turns,
            "chosen": _one_answer(row["chosen"], "chosen", tags),
            "rejected": _one_answer(row["rejected"], "rejected", tags),
        }
    if "instruction" in row:  # LLaMA-Factory's alpaca ranking rows
        turns = single_turn({**row, "output": ""}, ("instruction", "output"))[:-1]
        if len(turns) == 1:
            return {"prompt": turns[0]["content"], "chosen": row["chosen"], "rejected": row["rejected"]}
        return {
            "prompt": turns,
            "chosen": _one_answer(row["chosen"], "chosen"),
            "rejected": _one_answer(row["rejected"], "rejected"),
        }
    return row


def unpaired_row(row: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """nbtrain's ``{prompt, completion, label}`` from a conversation with ``kto_tag`` (LLaMA-Factory) or
    ``label`` (ms-swift): the last assistant turn is the completion judged, the turns before the prompt;
    and from LLaMA-Factory's alpaca rows with ``kto_tag`` (the output is the completion)."""
    if "completion" in row:
        return row
    if first_conversation_key(row) is None:
        if "kto_tag" in row and "instruction" in row and "output" in row:
            turns = single_turn(row, ("instruction", "output"))
            return {"prompt": turns[:-1], "completion": turns[-1:], "label": row["kto_tag"]}
        return row
    tag = "kto_tag" if "kto_tag" in row else "label"
    if tag not in row:
        return row
    _no_tools(row)
    key, turns = turns_of(row, tags)
    if not turns or not isinstance(turns[-1], Mapping) or turns[-1].get("role") != "assistant":
        raise RowError(f"{key} must end with the assistant turn that {tag} judges")
    if len(turns) < 2:
        raise RowError(f"{key} needs a user turn before the answer {tag} judges")
    return {"prompt": turns[:-1], "completion": turns[-1:], "label": row[tag]}
