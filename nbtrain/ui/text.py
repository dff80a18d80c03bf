"""Plain-text and table views shared by the magics and the CLI."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nbtrain.rundir import read_jsonl
from nbtrain.runs import Run, RunStatus

if TYPE_CHECKING:
    import pandas as pd


def last_metric(run: Run, key: str = "loss") -> float | None:
    for rec in reversed(read_jsonl(run.paths.metrics)):
        if key in rec:
            return float(rec[key])
    return None


def runs_table(runs: list[Run]) -> pd.DataFrame:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for r in runs:
        st = r.status()
        rows.append(
            {
                "id": r.id,
                "name": r.name,
                "state": st.state,
                "step": f"{st.step}/{st.max_steps}" if st.max_steps else str(st.step),
                "loss": last_metric(r),
                "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.paths.root.stat().st_ctime)),
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
