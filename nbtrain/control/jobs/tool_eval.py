"""How well a run calls tools: held-out tool-calling conversations, each answered greedily by the tuned
model (and its base) with the conversation's tools offered, scored as OpenAI's API returns the answer.

    report = nbtrain.tool_accuracy(run, rows)      # rows: tool-calling conversations, any accepted format
    report.metrics / report.metrics_before        # name_accuracy, arguments_exact, called_when_should, ...

Each row ends with the assistant turn to be measured: its calls (expected: a call to that function with
those arguments, JSON-equal) or its text (expected: an answer, no call). The scores:

- ``name_accuracy``: of the rows that should call, the share whose first call names the right function;
- ``arguments_exact``: of those, the share whose calls (names and arguments) are exactly the expected ones;
- ``called_when_should`` / ``answered_when_should``: the rows that should call (answer) and do;
- ``malformed``: the answers holding a call the server could not read (not JSON, an unknown function).

The answers come from the run's server when one is up, else from one-shot processes
(``control/serve.chat_with_tools``); the report, with every answer, is kept in ``<run>/eval/tool_calls.json``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError, RowError
from nbtrain.control.jobs.evaluate import read_check, save_check, shown_answer
from nbtrain.control.runs.run import Run, get_run

if TYPE_CHECKING:
    import pandas as pd

TOOL_CALLS_FILE = "tool_calls.json"
METRICS = ("name_accuracy", "arguments_exact", "called_when_should", "answered_when_should", "malformed")


def held_out_case(row: Mapping[str, Any], n: int) -> dict[str, Any]:
    """A row as (conversation before its last assistant turn, tools, what that turn does); RowError
    naming row ``n`` when it is no tool-calling conversation ending with an assistant turn."""
    from nbtrain.contract.formats import detect_format, to_example

    fmt = detect_format(row) if isinstance(row, Mapping) else None
    if fmt not in ("messages", "sharegpt"):
        raise RowError(f"row {n} is not a conversation (messages or sharegpt rows with tools)")
    example = to_example(row, fmt)
    msgs, tools = example["messages"], example.get("tools") or []
    if not tools:
        raise RowError(f"row {n} offers no tools: give the conversation's tools (a 'tools' list of schemas)")
    if msgs[-1]["role"] != "assistant":
        raise RowError(f"row {n} does not end with the assistant turn to measure")
    last = msgs[-1]
    calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in last.get("tool_calls") or []
    ]
    return {"messages": [_plain(m) for m in msgs[:-1]], "tools": tools, "calls": calls,
            "text": "" if calls else str(last.get("content") or "")}  # fmt: skip


def _plain(m: Mapping[str, Any]) -> dict[str, Any]:
    """A message as a chat request carries it (the call's arguments as a JSON string, no training flag)."""
    out = {k: v for k, v in m.items() if k != "train"}
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "id": c.get("id") or f"call{i}",
             "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
            for i, c in enumerate(out["tool_calls"])
        ]  # fmt: skip
    return out


def answered_calls(message: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The calls of an answer (arguments parsed), or None when one could not be read as JSON."""
    out = []
    for c in message.get("tool_calls") or []:
        try:
            args = json.loads(c["function"]["arguments"])
        except (ValueError, KeyError, TypeError):
            return None
        out.append({"name": c["function"]["name"], "arguments": args})
    return out


def score(
    cases: Sequence[Mapping[str, Any]], answers: Sequence[Mapping[str, Any]]
) -> dict[str, float | None]:
    """The METRICS of ``answers`` to ``cases`` (None where no case is of that kind)."""
    should = [(c, a) for c, a in zip(cases, answers, strict=True) if c["calls"]]
    should_not = [(c, a) for c, a in zip(cases, answers, strict=True) if not c["calls"]]

    def share(pairs: list[Any], right: Any) -> float | None:
        return (
            sum(1 for c, a in pairs if right(c, answered_calls(a) or [], a)) / len(pairs) if pairs else None
        )

    return {
        "name_accuracy": share(
            should, lambda c, got, a: bool(got) and got[0]["name"] == c["calls"][0]["name"]
        ),
        "arguments_exact": share(should, lambda c, got, a: got == c["calls"]),
        "called_when_should": share(should, lambda c, got, a: bool(got)),
        "answered_when_should": share(
            should_not, lambda c, got, a: not got and not a.get("nbtrain_tool_call_error")
        ),
        "malformed": sum(1 for a in answers if a.get("nbtrain_tool_call_error")) / len(answers)
        if answers
        else None,
    }


@dataclass
class ToolCallReport:
    """The tuned model's (``after``) and the base's (``before``) answers to held-out tool-calling rows, with
    their scores, as stored in ``<run>/eval/tool_calls.json``."""

    path: Path
    data: dict[str, Any]

    @property
    def metrics(self) -> dict[str, float | None]:
        return dict(self.data["metrics"]["after"])

    @property
    def metrics_before(self) -> dict[str, float | None] | None:
        before = self.data["metrics"].get("before")
        return None if before is None else dict(before)

    def summary(self) -> str:
        after, before = self.metrics, self.metrics_before

        def one(key: str) -> str:
            a = after.get(key)
            if a is None:
                return ""
            b = None if before is None else before.get(key)
            return f"{key.replace('_', ' ')} {'' if b is None else f'{b:.2f} -> '}{a:.2f}"

        parts = [p for p in (one(k) for k in METRICS) if p]
        return f"tool calls on {len(self.data['cases'])} held-out conversations: " + "; ".join(parts)

    def table(self) -> pd.DataFrame:
        """One row per conversation: its last message, the expected calls or text, and each model's answer
        (its own turn, on one line: ``shown_answer``)."""
        import pandas as pd

        def shown(message: Mapping[str, Any] | None) -> str:
            if message is None:
                return ""
            calls = answered_calls(message)
            if calls:
                return "; ".join(
                    f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})" for c in calls
                )
            return shown_answer(str(message.get("content") or ""))

        cases = self.data["cases"]
        cols: dict[str, list[str]] = {
            "asked": [str(c["messages"][-1].get("content") or "") for c in cases],
            "expected": [_described(c["calls"]) if c["calls"] else c["text"] for c in cases],
        }
        if self.data.get("before") is not None:
            cols["before"] = [shown(m) for m in self.data["before"]]
        cols["after"] = [shown(m) for m in self.data["after"]]
        return pd.DataFrame(cols)

    def figure(self) -> Any:
        """The scores, base against tuned, as grouped bars (Plotly)."""
        import plotly.graph_objects as go

        keys = [k for k in METRICS if self.metrics.get(k) is not None]
        fig = go.Figure()
        if self.metrics_before is not None:
            fig.add_bar(
                name="base", x=keys, y=[self.metrics_before.get(k) for k in keys], marker_color="#9aa5b1"
            )
        fig.add_bar(name="tuned", x=keys, y=[self.metrics[k] for k in keys], marker_color="#2f6fdf")
        fig.update_layout(
            barmode="group", yaxis={"range": [0, 1], "title": "share of conversations"},
            title="Tool calls on held-out conversations", height=320, margin={"t": 40, "b": 40},
        )  # fmt: skip
        return fig

    def __repr__(self) -> str:
        return f"{self.summary()}\n{self.table().to_string()}"

    def _repr_html_(self) -> str:
        return f"<b>{html.escape(self.summary())}</b><br>{self.table().to_html(index=False)}"


def _described(calls: list[dict[str, Any]]) -> str:
    return "; ".join(f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})" for c in calls)


def tool_accuracy(
    run: str | Path | Run,
    rows: Sequence[Mapping[str, Any]],
    *,
    compare_base: bool = True,
    max_new_tokens: int = 64,
    stop: str | list[str] | None = None,
    timeout: float = 600.0,
) -> ToolCallReport:
    """Ask the run's model (and with ``compare_base`` its base) to answer each held-out tool-calling
    conversation, greedily, with its tools offered; score the calls (module doc). Every row is checked
    before anything is asked."""
    from nbtrain.control.jobs.serve import chat_with_tools

    if not rows:
        raise NbtrainError("tool calls not measured: no rows given")
    try:
        cases = [held_out_case(row, i + 1) for i, row in enumerate(rows)]
    except RowError as e:
        raise NbtrainError(f"tool calls not measured: {e}") from None
    r = get_run(run)

    def ask(base: bool) -> list[dict[str, Any]]:
        answers: list[dict[str, Any] | None] = [None] * len(cases)
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(cases):  # one request batch per set of tools
            groups.setdefault(json.dumps(c["tools"], sort_keys=True), []).append(i)
        for idx in groups.values():
            got = chat_with_tools(r, [cases[i]["messages"] for i in idx], cases[idx[0]]["tools"], base=base,
                                  max_new_tokens=max_new_tokens, stop=stop, timeout=timeout)  # fmt: skip
            for i, message in zip(idx, got, strict=True):
                answers[i] = message
        return [a for a in answers if a is not None]

    after = ask(False)
    before = ask(True) if compare_base else None
    metrics = {"after": score(cases, after), "before": None if before is None else score(cases, before)}
    data = {"run_id": r.id, "step": r.status().step, "cases": cases, "after": after, "before": before,
            "metrics": metrics}  # fmt: skip
    return ToolCallReport(save_check(r, TOOL_CALLS_FILE, data), data)


def latest_tool_accuracy(run: str | Path | Run) -> ToolCallReport:
    """The run's last tool-call check, read back without asking the model again."""
    r = get_run(run)
    missing = f"tool-call check yet; run nbtrain.tool_accuracy({r.id!r}, rows)"
    return ToolCallReport(*read_check(r, TOOL_CALLS_FILE, missing))
