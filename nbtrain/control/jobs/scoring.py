"""Before/after log-probabilities of preference pairs, for a DPO (or ORPO/KTO) run, from the kernel.

    scores = nbtrain.preference_scores(run, "data/heldout.jsonl", n=32)   # a pandas DataFrame
    (scores.margin_after > 0).mean()      # how often the trained model prefers the chosen answer

The model is loaded in a separate process (``python -m nbtrain.worker.jobs.score``), so the kernel never
imports torch; its log goes to ``logs/score.log`` in the run directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.control.launch.process import run_job
from nbtrain.control.runs.run import Run, get_run

if TYPE_CHECKING:
    import pandas as pd


def preference_scores(
    run: str | Path | Run, pairs: str | Path, n: int = 32, timeout: float = 900
) -> pd.DataFrame:
    """One row per pair (the first ``n`` of the JSONL file ``pairs``): the summed log-probability of the
    chosen and the rejected completion under the reference model (``*_before``: the base, adapter
    disabled) and the trained model (``*_after``), and ``margin_before`` / ``margin_after`` (chosen minus
    rejected). ``df.attrs["beta"]`` is the run's DPO beta: ``beta * (after - before)`` is DPO's implicit
    reward."""
    import pandas as pd

    r = get_run(run)
    src = Path(pairs).expanduser().resolve()
    if not src.is_file():
        raise NbtrainError(
            f"preference pairs not found: {src}; give a JSONL file of {{prompt, chosen, rejected}}"
        )
    if r.status().state != "completed":
        raise NbtrainError(
            f"run {r.id} is {r.status().state}; scoring needs a completed run (run.wait() first)"
        )
    out = r.dir / "preference_scores.json"
    log = r.paths.logs / "score.log"
    log.unlink(missing_ok=True)  # the log of this scoring only
    _, data = run_job("score", [str(r.dir), str(src), "-n", str(n)], log=log, result=out, cwd=r.dir,
                      what=f"scoring run {r.id}", timeout=timeout)  # fmt: skip
    df = pd.DataFrame(data["rows"])
    # the pairs' other columns (a split, an id, ...) come along, to group the scores by
    extra = pd.DataFrame(_first_rows(src, n)).drop(columns=["prompt", "chosen", "rejected"], errors="ignore")
    df = pd.concat([extra.reset_index(drop=True), df], axis=1)
    df["margin_before"] = df["logp_chosen_before"] - df["logp_rejected_before"]
    df["margin_after"] = df["logp_chosen_after"] - df["logp_rejected_after"]
    df.attrs["beta"] = data["beta"]
    return df


def _first_rows(path: Path, n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) >= n:
                break
    return rows


__all__ = ["preference_scores"]
