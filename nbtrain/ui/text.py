"""Plain-text and table views shared by the magics and the CLI."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nbtrain.control.runs import registry
from nbtrain.control.runs.metrics import JsonlTail, MetricsTail
from nbtrain.control.runs.run import Run, RunStatus

if TYPE_CHECKING:
    import pandas as pd


# The last records of a metrics file: a step logs a few hundred bytes, so this holds the last ~1000 steps.
TAIL_BYTES = 256_000


def _last_value(reader: JsonlTail, key: str) -> float | None:
    last: float | None = None
    for rec in reader.records():
        value = rec.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            last = float(value)
        elif value is None and key in (rec.get("nonfinite") or ()):
            last = math.nan  # written as null, named in "nonfinite" (the loss went NaN or infinite)
    return last


def last_metric(run: Run, key: str = "loss") -> float | None:
    """The last logged value of ``key``, or None (never logged, or metrics.jsonl cannot be read: a FIFO or a
    link in its place). Read from the file's last ``TAIL_BYTES``, in bounded chunks; further back only when
    no record there has ``key``, still without holding more than a line (a ``max_line``) at a time."""
    try:
        reader = JsonlTail(run.paths.metrics, below=run.dir)
        reader.start_at_tail(TAIL_BYTES)
        from_start = reader.offset == 0
        found = _last_value(reader, key)
        if found is None and not from_start:
            found = _last_value(JsonlTail(run.paths.metrics, below=run.dir), key)
    except OSError:  # NotRegularFile, or a file this user may not read: the table still lists the run
        return None
    return found


def created_time(run: Run, registered: dict[str, float] | None = None) -> float | None:
    """When the run was created: the registry's time, else the time in its id (``20250101-093000-...``,
    local time, as ``new_run_id`` writes it); None when neither is known. Never a file's time: those change
    (a resume rewrites resolved.json; ctime is the last change of the directory)."""
    if registered is None:
        registered = {row.id: row.created for row in registry.find(run.id)}
    return registered.get(run.id) or registry.id_time(run.id)


def warm_line() -> str | None:
    """The warm processes this user keeps, under the runs list: how many and the memory they hold."""
    from nbtrain.control.launch import warm

    rows = warm.status(every_home=True)
    if not rows:
        return None
    held = sum(int(r["rss_bytes"]) for r in rows) / 2**20
    return (
        f"{len(rows)} warm process{'es' if len(rows) > 1 else ''} of yours, {held:,.0f} MiB held (idle ones "
        "exit when memory runs short): %finetune warm status, or warm stop"
    )


def runs_table(runs: list[Run]) -> pd.DataFrame:
    import pandas as pd

    registered = {row.id: row.created for row in registry.rows()} if runs else {}
    rows: list[dict[str, Any]] = []
    for r in runs:
        created = created_time(r, registered)
        st = r.status()
        rows.append(
            {
                "id": r.id,
                "name": r.name,
                "state": st.state,
                "step": f"{st.step}/{st.max_steps}" if st.max_steps else str(st.step),
                "loss": last_metric(r),
                "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if created else "",
                "dir": str(r.dir),
            }
        )
    return pd.DataFrame(rows, columns=["id", "name", "state", "step", "loss", "created", "dir"])


def status_text(run: Run, st: RunStatus | None = None, log_lines: int = 20) -> str:
    st = st or run.status()
    lines = [f"run {run.id} ({run.name}): {st.describe()}", f"  dir: {run.dir}"]
    loss = last_metric(run)
    if loss is not None:
        lines.append(f"  last loss: {loss:.4f}")
    if st.state == "completed":
        lines.append(f"  output: {run.output_dir}")
    if st.error:
        lines.append(f"  error: {st.error.get('type')}: {st.error.get('message')}")
        tail = st.error.get("log_tail") or run.logs(log_lines)
        lines.append(f"  last lines of {run.paths.rank_log(0)}:")
        lines += ["    " + ln for ln in tail.splitlines()[-log_lines:]]
    return "\n".join(lines)


def number(v: float | None) -> str:
    """A metric for a line of text: 4 decimals, or 3 significant digits when very small or large."""
    if v is None:
        return ""
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4):
        return f"{v:.3g}"
    return f"{v:.4f}".rstrip("0").rstrip(".")


def progress_line(run: Run, st: RunStatus, loss: float | None) -> str:
    """One line of a run's progress, as a terminal follows it."""
    return f"{run.id}: {st.describe()}" + (f" loss {number(loss)}" if loss is not None else "")


def compare_table(runs: Sequence[Run], key: str = "loss") -> pd.DataFrame:
    """``key`` of several runs side by side (first, last and lowest value, at which steps): what the
    compare chart of a notebook shows, for a terminal."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for r in runs:
        tail = MetricsTail(r)
        tail.poll()
        s = tail.series(key)
        lowest = None
        if s is not None:
            finite = np.flatnonzero(np.isfinite(s.y))  # a diverged run logs nan: not its lowest value
            lowest = int(finite[s.y[finite].argmin()]) if len(finite) else None
        rows.append(
            {
                "id": r.id,
                "name": r.name,
                "state": r.status().state,
                "steps": None if tail.last_step is None else int(tail.last_step),
                f"first {key}": tail.first.get(key),
                f"last {key}": tail.last.get(key),
                f"min {key}": None if s is None or lowest is None else float(s.y[lowest]),
                f"min {key} at step": None if s is None or lowest is None else int(s.x[lowest]),
            }
        )
    return pd.DataFrame(rows)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; anything else (lists included) is one value."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(runs: Sequence[Run]) -> pd.DataFrame:
    """The settings in which ``runs`` differ, one row a setting and a column a run: their resolved configs,
    with the trainer's arguments as the run used them (``train.*``, the plan's choices included) in place of
    what the config's train: section said. Empty when every setting is the same."""
    import pandas as pd

    def settings(r: Run) -> dict[str, Any]:
        resolved = r.resolved
        cfg = {k: v for k, v in (resolved.get("config") or {}).items() if k not in ("name", "train")}
        return _flat({**cfg, "train": resolved.get("train_args") or {}})

    names = [r.name for r in runs]
    labels = [n if names.count(n) == 1 else f"{n} ({r.id})" for n, r in zip(names, runs, strict=True)]
    flat = [settings(r) for r in runs]
    rows = []
    for key in sorted(set().union(*flat)):
        values = [f.get(key, "-") for f in flat]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            rows.append({"setting": key, **{lab: _shown(v) for lab, v in zip(labels, values, strict=True)}})
    return pd.DataFrame(rows, columns=["setting", *labels])


def _shown(v: Any) -> str:
    if isinstance(v, float):
        return number(v)
    if isinstance(v, list | dict):
        return json.dumps(v, default=str)
    return str(v)
