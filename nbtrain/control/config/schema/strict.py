"""The base of every config section: unknown keys refused, no coercion, no .inf / .nan."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # .inf / .nan are never a setting: a LoRA alpha of .inf trains to nothing and reports "completed"
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
