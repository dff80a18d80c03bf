"""Evaluate a run (kernel side; the work is ``nbtrain.worker.jobs.evaluate`` in its own process).

    report = nbtrain.evaluate(run, compare_base=True)               # or run.evaluate(...)
    report.table(); report.figure()
    %finetune eval RUN [--compare-base] [--file DATA] [--tasks T ...] [--limit N]

Held-out loss and perplexity on the run's eval split (or a data file), for the tuned model and, with
``compare_base``, the base model; ``tasks`` adds lm-evaluation-harness tasks (names, or local task YAML
files / directories). Each evaluation is kept in ``<run>/eval/<time>.json`` (and ``latest.json``);
``latest_eval(run)`` reads the last one back without running anything.
"""

from __future__ import annotations

import html
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import read_json
from nbtrain.control.export import has_trained_weights
from nbtrain.control.process import run_job
from nbtrain.control.runs.run import Run, get_run

if TYPE_CHECKING:
    import pandas as pd

EVAL_DIR = "eval"
ORDER = ("base", "tuned")


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
        src = self.data.get("data", {}).get("source", "")
        title = f"evaluation of {self.data.get('run_id')} (step {self.data.get('step')}; {src})"
        fig.update_layout(title=title, height=360, width=max(420, 260 * len(panels)), bargap=0.3)
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
    compare_base: bool = False,
    file: str | Path | None = None,
    tasks: list[str] | str | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    timeout: float | None = None,
) -> EvalReport:
    """Measure the run's model (and with ``compare_base`` its base) in a separate process; the report is
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
    _, res = run_job("nbtrain.worker.jobs.evaluate", [*args, "--result", str(result_file)], log=log,
                     result=result_file, cwd=Path.cwd(), what=f"evaluation of run {r.id}",
                     timeout=timeout)  # fmt: skip
    if not res.get("ok"):
        raise NbtrainError(f"evaluation of run {r.id} failed: {res.get('error')}; see {log}")
    path = Path(res["path"])
    return EvalReport(path, read_json(path))
