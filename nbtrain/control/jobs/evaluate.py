"""Evaluate a run (kernel side; the work is ``nbtrain.worker.jobs.evaluate`` in its own process).

    report = nbtrain.evaluate(run)               # or run.evaluate(...); compare_base=False: tuned only
    report.table(); report.figure()
    %finetune eval RUN [--no-compare-base] [--file DATA] [--tasks T ...] [--limit N]

Held-out loss and perplexity on the run's eval split (or a data file), for the tuned model and, unless
``compare_base=False``, the base model beside it; ``tasks`` adds lm-evaluation-harness tasks (names, or
local task YAML files / directories). Each evaluation is kept in ``<run>/eval/<time>.json`` (and
``latest.json``); ``latest_eval(run)`` reads the last one back without running anything.

    acc = nbtrain.accuracy(run, questions, answers)     # exact match of greedy answers, base and tuned
    acc.summary(); acc.table()                          # prompt, expected, before, after

``accuracy`` asks the model through ``run.generate`` (the run's server, else one-shot processes) and keeps
its last report in ``<run>/eval/accuracy.json`` (``latest_accuracy(run)``).
"""

from __future__ import annotations

import html
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import read_json
from nbtrain.control.launch.process import run_job
from nbtrain.control.runs.run import Run, get_run, has_trained_weights

if TYPE_CHECKING:
    import pandas as pd

EVAL_DIR = "eval"
ORDER = ("base", "tuned")
TEMPLATE_TOKEN = re.compile(r"<\|[\w.-]{1,32}\|>")  # <|end|>, <|im_start|>, <|user|>: a chat template's marks
_OPENING = re.compile(TEMPLATE_TOKEN.pattern + r"(?:(?:system|user|assistant|tool)\n)?")  # <|im_start|>user


def shown_answer(text: str) -> str:
    """An answer as a report's table shows it: its own turn only (a greedy answer runs on past the turn's
    end into template tokens and a next turn the model makes up: cut there, marked " …"), on one line."""
    rest = text
    while (head := _OPENING.match(rest.lstrip())) is not None:  # marks before any words: left out
        rest = rest.lstrip()[head.end() :]
    rest = re.sub(r"<\|[\w.-]*$", "", rest)  # a mark cut off by max_new_tokens
    mark = TEMPLATE_TOKEN.search(rest)
    own = rest[: mark.start()] if mark else rest
    cut = mark is not None and bool(TEMPLATE_TOKEN.sub("", rest[mark.start() :]).strip())
    shown = " ".join(own.split()) + (" …" if cut else "")
    return shown or ("(template tokens only)" if text.strip() else "")


@dataclass
class EvalReport:
    """One evaluation of a run, as stored in ``<run>/eval/``."""

    path: Path
    data: dict[str, Any]

    @property
    def models(self) -> dict[str, dict[str, float]]:
        models: dict[str, dict[str, float]] = self.data["models"]
        return models

    @property
    def tasks(self) -> dict[str, dict[str, dict[str, float]]] | None:
        tasks: dict[str, dict[str, dict[str, float]]] | None = self.data.get("tasks")
        return tasks

    def rows(self) -> list[tuple[str, str, str, float]]:
        """(group, metric, model, value) for every number in the report."""
        out: list[tuple[str, str, str, float]] = []
        for who, m in self.models.items():
            out += [("held-out", "loss", who, m["loss"]), ("held-out", "perplexity", who, m["perplexity"])]
        for who, per_task in (self.tasks or {}).items():
            for task, metrics in per_task.items():
                out += [(task, metric, who, value) for metric, value in metrics.items()]
        return out

    def table(self) -> pd.DataFrame:
        """Metrics as rows, base and tuned side by side (and their difference when both are there)."""
        import pandas as pd

        frame = pd.DataFrame(self.rows(), columns=["group", "metric", "model", "value"])
        wide = frame.pivot_table(index=["group", "metric"], columns="model", values="value", sort=False)
        wide = wide[[c for c in ORDER if c in wide.columns]]
        if {"base", "tuned"} <= set(wide.columns):
            wide["change"] = wide["tuned"] - wide["base"]
        wide.columns.name = None
        return wide

    def figure(self) -> Any:
        """A Plotly bar chart: one panel per metric, base and tuned bars side by side."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        rows = self.rows()
        panels = list(dict.fromkeys((g, m) for g, m, _, _ in rows))
        titles = [m if g == "held-out" else f"{g}: {m}" for g, m in panels]
        fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles)
        colors = {"base": "#9e9e9e", "tuned": "#1f77b4"}
        for col, (group, metric) in enumerate(panels, start=1):
            for who in ORDER:
                vals = [v for g, m, w, v in rows if (g, m, w) == (group, metric, who)]
                if vals:
                    fig.add_trace(
                        go.Bar(x=[who], y=vals, name=who, marker_color=colors[who], showlegend=col == 1,
                               text=[f"{vals[0]:.4g}"], textposition="auto"),
                        row=1, col=col,
                    )  # fmt: skip
        src = str(self.data.get("data", {}).get("source", ""))
        src = src if len(src) <= 70 else src[:30] + "…" + src[-39:]  # a long path would run off the figure
        title = f"evaluation of {self.data.get('run_id')} at step {self.data.get('step')}<br><sup>{src}</sup>"
        fig.update_layout(title=title, height=380, width=max(560, 260 * len(panels)), bargap=0.3,
                          margin={"t": 90})  # fmt: skip
        return fig

    def __repr__(self) -> str:
        return f"<EvalReport {self.path}>\n{self.table().to_string()}"

    def _repr_html_(self) -> str:
        head = f"<b>evaluation</b> of <code>{html.escape(str(self.data.get('run_id')))}</code>"
        src = html.escape(str(self.data.get("data", {}).get("source", "")))
        table = self.table().to_html(float_format=lambda v: f"{v:.4f}")
        return f"{head} ({src}, {self.data['data']['rows']} rows)<br>{table}"


def latest_eval(run: str | Path | Run) -> EvalReport:
    """The run's last evaluation, read from ``<run>/eval/latest.json``."""
    r = get_run(run)
    path = r.dir / EVAL_DIR / "latest.json"
    if not path.exists():
        raise NbtrainError(f"run {r.id} has not been evaluated yet; run nbtrain.evaluate({r.id!r}) first")
    return EvalReport(path, read_json(path))


def evaluate(
    run: str | Path | Run,
    *,
    compare_base: bool = True,
    file: str | Path | None = None,
    tasks: list[str] | str | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    timeout: float | None = None,
) -> EvalReport:
    """Measure the run's model and (``compare_base``, the default) its base, side by side, in a separate
    process (``compare_base=False``: the tuned model alone, half the time); the report is
    also stored in the run directory. ``limit``: rows of data and of each task (N, or a fraction < 1)."""
    r = get_run(run)
    problems = []
    if not has_trained_weights(r):
        problems.append(f"run {r.id} has no trained weights yet (no output/ and no complete checkpoint)")
    args = [str(r.dir), "--batch-size", str(batch_size)]
    if file is not None:
        p = Path(file).expanduser().resolve()
        if not p.exists():
            problems.append(f"data file not found: {p}")
        args += ["--file", str(p)]
    if compare_base:
        args.append("--compare-base")
    if limit is not None:
        if limit <= 0:
            problems.append(f"limit must be positive (a number of rows, or a fraction below 1), not {limit}")
        args += ["--limit", str(limit)]
    if batch_size < 1:
        problems.append(f"batch_size must be at least 1, not {batch_size}")
    if tasks:
        specs = [tasks] if isinstance(tasks, str) else list(tasks)
        if importlib.util.find_spec("lm_eval") is None:
            problems.append("tasks need lm-evaluation-harness: pip install lm-eval")
        resolved_specs = []
        for spec in specs:
            p = Path(spec).expanduser()
            looks_like_path = p.suffix in (".yaml", ".yml") or "/" in spec
            if looks_like_path and not p.exists():
                problems.append(f"task file or directory not found: {p.resolve()}")
            resolved_specs.append(str(p.resolve()) if p.exists() else spec)
        args += ["--tasks", *resolved_specs]
    if problems:
        raise NbtrainError("not evaluated: " + "; ".join(problems))
    result_file = r.paths.logs / "eval.result.json"
    log = r.paths.logs / "eval.log"
    # The notebook's directory as working directory: relative paths in task YAMLs mean what they say there.
    _, res = run_job("evaluate", args, log=log,
                     result=result_file, cwd=Path.cwd(), what=f"evaluation of run {r.id}",
                     timeout=timeout)  # fmt: skip
    if not res.get("ok"):
        raise NbtrainError(f"evaluation of run {r.id} failed: {res.get('error')}; see {log}")
    path = Path(res["path"])
    return EvalReport(path, read_json(path))


# ------------------------------------------------------------------ exact match on held-out prompts

ACCURACY_FILE = "accuracy.json"  # in EVAL_DIR: the run's last accuracy check


@dataclass
class AccuracyReport:
    """Greedy answers to prompts the run did not train on, each checked against its expected answer:
    ``after`` (the tuned model) and ``before`` (the base), as stored in ``<run>/eval/accuracy.json``."""

    path: Path
    data: dict[str, Any]

    @property
    def match(self) -> str:
        return str(self.data.get("match", "exact"))

    def right(self, answer: str, expected: str) -> bool:
        """``exact``: the answer is the expected one (surrounding white space aside); ``contains``: the
        expected text appears in the answer, case aside (a name, a keyword)."""
        if self.match == "contains":
            return expected.strip().casefold() in answer.casefold()
        return answer.strip() == expected.strip()

    def _share(self, answers: list[str], expected: list[str]) -> float:
        return sum(self.right(a, e) for a, e in zip(answers, expected, strict=True)) / len(expected)

    @property
    def accuracy(self) -> float:
        """The share of prompts the tuned model answers exactly right."""
        return self._share(self.data["after"], self.data["expected"])

    @property
    def accuracy_before(self) -> float | None:
        """The same share for the base model (None when it was not asked)."""
        before = self.data.get("before")
        return None if before is None else self._share(before, self.data["expected"])

    def table(self) -> pd.DataFrame:
        """One row per prompt: the question, the expected answer, the base's and the tuned model's."""
        import pandas as pd

        def question(p: Any) -> str:  # a list of messages shows its last one
            return p if isinstance(p, str) else str(p[-1]["content"])

        cols: dict[str, list[str]] = {
            "prompt": [question(p) for p in self.data["prompts"]],
            "expected": self.data["expected"],
        }
        if self.data.get("before") is not None:
            cols["before"] = [shown_answer(a) for a in self.data["before"]]
        cols["after"] = [shown_answer(a) for a in self.data["after"]]
        return pd.DataFrame(cols)

    def summary(self) -> str:
        n, before = len(self.data["expected"]), self.accuracy_before
        change = "" if before is None else f"{before:.2f} -> "
        how = "exact match" if self.match == "exact" else "answer contains the expected text"
        return f"accuracy on {n} held-out prompts: {change}{self.accuracy:.2f} ({how}, greedy)"

    def __repr__(self) -> str:
        return f"{self.summary()}\n{self.table().to_string()}"

    def _repr_html_(self) -> str:
        return f"<b>{html.escape(self.summary())}</b><br>{self.table().to_html(index=False)}"


def accuracy(
    run: str | Path | Run,
    prompts: Sequence[Any],
    expected: Sequence[str],
    *,
    compare_base: bool = True,
    max_new_tokens: int = 32,
    timeout: float = 600.0,
    match: str = "exact",
) -> AccuracyReport:
    """Ask the run's model (and with ``compare_base`` its base) each prompt, greedily, and count the
    answers equal to the expected ones (surrounding white space aside). Prompts are user messages (or
    lists of messages) put through the chat template, as ``run.generate`` sends them; the answers come
    from the run's server when one is up, else from one-shot processes. The report, with every answer,
    is also kept in ``<run>/eval/accuracy.json``. ``match="contains"``: an answer is right when it holds
    the expected text (case aside), for answers whose wording may vary around a name or a fact."""
    from nbtrain.control.jobs.serve import generate

    problems = []
    if not prompts:
        problems.append("no prompts given")
    if len(prompts) != len(expected):
        problems.append(f"{len(prompts)} prompts but {len(expected)} expected answers: give one per prompt")
    if match not in ("exact", "contains"):
        problems.append(f"match is 'exact' or 'contains', not {match!r}")
    if max_new_tokens < 1:
        problems.append(f"max_new_tokens must be at least 1, not {max_new_tokens}")
    if problems:
        raise NbtrainError("accuracy not measured: " + "; ".join(problems))
    r = get_run(run)
    prompts, expected = list(prompts), [str(e) for e in expected]
    after = generate(r, prompts, max_new_tokens=max_new_tokens, timeout=timeout)
    before = None
    if compare_base:  # a LoRA run's base is the same weights with the adapter off
        before = generate(r, prompts, base=True, max_new_tokens=max_new_tokens, timeout=timeout)
    data = {"run_id": r.id, "step": r.status().step, "prompts": prompts, "expected": expected,
            "before": before, "after": after, "match": match}  # fmt: skip
    return AccuracyReport(save_check(r, ACCURACY_FILE, data), data)


def latest_accuracy(run: str | Path | Run) -> AccuracyReport:
    """The run's last accuracy check (``nbtrain.accuracy``), read back without asking the model again."""
    r = get_run(run)
    return AccuracyReport(
        *read_check(r, ACCURACY_FILE, f"accuracy check yet; run nbtrain.accuracy({r.id!r}, ...)")
    )


def save_check(r: Run, name: str, data: dict[str, Any]) -> Path:
    """A check's report (accuracy, tool calls) written whole as ``<run>/eval/NAME``; its path."""
    from nbtrain.contract.rundir import atomic_write_json

    path = r.dir / EVAL_DIR / name
    path.parent.mkdir(exist_ok=True)
    atomic_write_json(path, data)
    return path


def read_check(r: Run, name: str, missing: str) -> tuple[Path, Any]:
    """(path, report) of the run's last ``name`` check; NbtrainError "run ID has no MISSING first"."""
    path = r.dir / EVAL_DIR / name
    if not path.exists():
        raise NbtrainError(f"run {r.id} has no {missing} first")
    return path, read_json(path)
