"""``nbtrain.preview(cfg)`` / ``%finetune preview CONFIG_OR_RUN``: the first examples exactly as the model
sees them, and token-length statistics.

Tokenising needs transformers, which the kernel never imports: the config is validated and planned here
(``prepare``), written to a temporary resolved.json, and ``python -m nbtrain.worker.jobs.preview`` tokenises
it in a subprocess with the run's own SFTConfig, writing JSON that nbtrain.ui.preview renders.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.hooks import HOOKS_FILE
from nbtrain.contract.notebook import notebook_namespace
from nbtrain.contract.pickles import read_trusted, write_private
from nbtrain.control.launch.process import run_job
from nbtrain.control.runs.run import Run, get_run


def _is_config(ref: Any) -> bool:
    if isinstance(ref, Mapping):
        return True
    text = str(ref)
    return "\n" in text or text.strip().endswith((".yaml", ".yml"))


def resolved_for(ref: str | Path | Mapping[str, Any] | Run) -> tuple[dict[str, Any], str, bytes | None]:
    """(resolved.json content, where it came from, its hooks: captured or None) for a config (YAML text,
    dict, .yaml path; ``hooks: preprocess`` taken from the notebook) or a run (its hooks.pkl)."""
    if isinstance(ref, Run) or not _is_config(ref):
        run = get_run(ref)  # type: ignore[arg-type]
        pickled = run.dir / HOOKS_FILE
        return run.resolved, run.id, read_trusted(pickled) if pickled.exists() else None
    from nbtrain.control.prepare import hooks_payload, prepare

    # GRPO's rewards are not looked up (a preview tokenises SFT rows); hooks: preprocess shapes the rows
    prep = prepare(ref, capture_notebook=False)  # type: ignore[arg-type]
    return prep.to_dict(), "config", hooks_payload(prep.resolved, notebook_namespace())


def preview_data(
    config: str | Path | Mapping[str, Any] | Run,
    n: int = 5,
    *,
    stats_rows: int = 2000,
    timeout: float = 600.0,
) -> tuple[dict[str, Any], str]:
    """The first ``n`` training examples as the trainer tokenises them (trained tokens marked) and
    token-length statistics over the first ``stats_rows`` rows. ``config`` is YAML text, a dict, a
    .yaml path, or a run (id, name, directory). Raises ConfigError for a bad config, NbtrainError when
    the data cannot be tokenised (with the worker's message). Returns (the worker's JSON: examples as
    (text, trained) segments, ``stats``, ``lengths``; where it came from: a run id or "config")."""
    if n < 1 or stats_rows < 1:
        raise NbtrainError("preview: n and stats_rows are positive numbers of rows")
    resolved, source, hooks = resolved_for(config)
    with tempfile.TemporaryDirectory(prefix="nbtrain-preview-") as tmp:
        src, out, log = Path(tmp) / "resolved.json", Path(tmp) / "preview.json", Path(tmp) / "preview.log"
        src.write_text(json.dumps(resolved), encoding="utf-8")
        if hooks is not None:  # the job applies hooks: preprocess as training does
            write_private(Path(tmp) / HOOKS_FILE, hooks)
        # No GPU is needed to tokenise; hiding them keeps the preview off a card a run is using.
        _, data = run_job("preview", [str(src), "-n", str(n), "--stats-rows", str(stats_rows)], log=log,
                          result=out, cwd=Path(tmp), env={"CUDA_VISIBLE_DEVICES": ""}, timeout=timeout,
                          timeout_hint="lower stats_rows")  # fmt: skip
    return data, source
