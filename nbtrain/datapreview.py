"""``nbtrain.preview(cfg)`` / ``%finetune preview CONFIG_OR_RUN``: the first examples exactly as the model
sees them, and token-length statistics.

Tokenising needs transformers, which the kernel never imports: the config is validated and planned here
(``prepare``), written to a temporary resolved.json, and ``python -m nbtrain.worker.preview`` tokenises
it in a subprocess with the run's own SFTConfig, writing JSON that the kernel renders (nbtrain.ui.preview).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.errors import NbtrainError
from nbtrain.runs import Run, get_run


@dataclass
class DataPreview:
    """What ``nbtrain.preview`` returns: ``data`` is the worker's JSON (examples as (text, trained)
    segments, ``stats``, ``lengths``); shown as HTML with a Plotly histogram of tokens per example."""

    data: dict[str, Any]
    source: str  # the run id, or "config"

    @property
    def examples(self) -> list[dict[str, Any]]:
        return list(self.data["examples"])

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.data["stats"])

    def text(self) -> str:
        from nbtrain.ui.preview import preview_text

        return preview_text(self.data)

    def html(self) -> str:
        from nbtrain.ui.preview import preview_html

        return preview_html(self.data)

    def figure(self) -> Any:
        from nbtrain.ui.preview import length_histogram

        return length_histogram(self.data)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return self.html()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        # HTML with the plain-text rendering as its fallback (a terminal, a plain-text export).
        display({"text/html": self.html(), "text/plain": self.text()}, raw=True)
        display(self.figure())


def _is_config(ref: Any) -> bool:
    if isinstance(ref, Mapping):
        return True
    text = str(ref)
    return "\n" in text or text.strip().endswith((".yaml", ".yml"))


def resolved_for(ref: str | Path | Mapping[str, Any] | Run) -> tuple[dict[str, Any], str]:
    """(resolved.json content, where it came from) for a config (YAML text, dict, .yaml path) or a run."""
    if isinstance(ref, Run) or not _is_config(ref):
        run = get_run(ref)  # type: ignore[arg-type]
        return run.resolved, run.id
    from nbtrain.api import prepare

    return prepare(ref, capture_rewards=False).to_dict(), "config"  # type: ignore[arg-type]


def preview(
    config: str | Path | Mapping[str, Any] | Run,
    n: int = 5,
    *,
    stats_rows: int = 2000,
    timeout: float = 600.0,
) -> DataPreview:
    """The first ``n`` training examples as the trainer tokenises them (trained tokens marked) and
    token-length statistics over the first ``stats_rows`` rows. ``config`` is YAML text, a dict, a
    .yaml path, or a run (id, name, directory). Raises ConfigError for a bad config, NbtrainError when
    the data cannot be tokenised (with the worker's message)."""
    if n < 1 or stats_rows < 1:
        raise NbtrainError("preview: n and stats_rows are positive numbers of rows")
    resolved, source = resolved_for(config)
    with tempfile.TemporaryDirectory(prefix="nbtrain-preview-") as tmp:
        src, out, log = Path(tmp) / "resolved.json", Path(tmp) / "preview.json", Path(tmp) / "preview.log"
        src.write_text(json.dumps(resolved), encoding="utf-8")
        argv = [sys.executable, "-m", "nbtrain.worker.preview", str(src), "--out", str(out), "-n", str(n),
                "--stats-rows", str(stats_rows)]  # fmt: skip
        # No GPU is needed to tokenise; hiding them keeps the preview off a card a run is using.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
        with open(log, "wb") as logf:
            try:
                proc = subprocess.run(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                      start_new_session=True, check=False)  # fmt: skip
            except subprocess.TimeoutExpired:
                msg = f"the preview took longer than {timeout:.0f} s; lower stats_rows"
                raise NbtrainError(msg) from None
        if proc.returncode != 0 or not out.exists():
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
            last = next((ln for ln in reversed(tail) if ln.strip()), "(no output)")
            raise NbtrainError(f"the preview failed: {last}\n" + "\n".join(tail))
        data = json.loads(out.read_text(encoding="utf-8"))
    return DataPreview(data, source)
