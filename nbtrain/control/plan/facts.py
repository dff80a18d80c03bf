"""The facts prepare gathers once about what a config names, for every stage after validation (the plan,
the memory estimate and fit rule, DeepSpeed's buffers, the vision check, the estimate table)."""

from __future__ import annotations

from typing import Any

from nbtrain.control.config.schema import Resolved
from nbtrain.control.memory import load_model_config


def model_config(res: Resolved) -> dict[str, Any] | None:
    """The model's config.json (a local folder, a GGUF file's header, or the Hub's, through its cache), read
    the first time a stage asks and kept on ``res``: None when it cannot be had here."""
    if not res.model_facts_read:
        cfg = res.config
        res.model_facts = load_model_config(cfg.model, cfg.revision, cfg.gguf_file)
        res.model_facts_read = True
    return res.model_facts
