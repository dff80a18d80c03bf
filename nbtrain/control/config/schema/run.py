"""``RunConfig``, a run's whole config, and ``Resolved``: a validated config with what validation
learned about the world."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from nbtrain.control.config.choices import Method, ObjectiveName, Precision
from nbtrain.control.config.datacheck import DataSource
from nbtrain.control.config.schema.sections import (
    NAME_RE,
    DataSettings,
    DistributedSettings,
    HooksSettings,
    LoraSettings,
    QuantSettings,
    RewardModelRef,
    Strict,
    VisionSettings,
)


class RunConfig(Strict):
    model: str = Field(min_length=1)
    revision: str | None = Field(None, min_length=1)  # a Hub model's branch, tag or commit (default: main)
    # which .gguf file of a Hub repo (or of a folder holding several) model: means; nbtrain converts it
    gguf_file: str | None = Field(None, min_length=1, pattern=r"(?i)^[^/\\]+\.gguf$")
    method: Literal["auto", Method] = "lora"
    # objective: what the training optimises; method: (above) which weights train. Orthogonal.
    objective: ObjectiveName = "sft"
    # grpo / rloo: notebook functions, built-ins (nbtrain.contract.rewards) or reward models {model: ...}
    rewards: list[str | RewardModelRef] | None = None
    hooks: HooksSettings | None = None  # notebook functions and classes (nbtrain.contract.hooks)
    batch_size: int | None = Field(None, gt=0)  # effective batch; with per_device_train_batch_size: auto
    data: DataSettings
    train: dict[str, Any] = Field(default_factory=dict)
    lora: LoraSettings | None = None
    quantization: QuantSettings | None = None
    vision: VisionSettings | None = None  # a vision-language model's (filled in when the model is one)
    precision: Literal["auto", Precision] = "auto"
    resume: Literal["never", "auto"] = "never"
    distributed: DistributedSettings = Field(default_factory=lambda: DistributedSettings.model_validate({}))
    trust_remote_code: bool = False
    # A training loss or gradient norm that turns NaN/inf: fail the run at that step (no checkpoint of the
    # broken weights), or go on (the Trainer's own behaviour; the metrics flag the steps).
    on_nan: Literal["fail", "continue"] = "fail"
    name: str | None = None

    @field_validator("rewards", mode="before")
    @classmethod
    def _reward_models_ok(cls, v: Any) -> Any:
        """A mapping in ``rewards:`` is a reward model, ``{model: ...}`` and nothing else (said plainly,
        not as pydantic's union of a string and a mapping)."""
        for entry in v if isinstance(v, list) else []:
            if not isinstance(entry, dict):
                continue
            what = "a reward model is {model: RUN} (a reward run's id or folder, a model folder, a Hub id)"
            other = sorted(str(k) for k in entry if k != "model")
            if other:
                close = difflib.get_close_matches(other[0], ["model"], n=1, cutoff=0.6)
                hint = " (did you mean 'model'?)" if close else ""
                raise ValueError(f"unknown key {other[0]!r} in {entry}{hint}: {what}")
            if not isinstance(entry.get("model"), str) or not entry["model"].strip():
                raise ValueError(f"{entry} names no model: {what}")
        return v

    @field_validator("rewards")
    @classmethod
    def _rewards_ok(cls, v: list[str | RewardModelRef] | None) -> list[str | RewardModelRef] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("rewards: lists at least one reward function")
        for name in v:
            if isinstance(name, str) and not name.isidentifier():
                raise ValueError(
                    f"{name!r} is not a function name; rewards: lists Python function names, and reward "
                    f"models as {{model: {name}}} (an objective: reward run, a model folder or a Hub id)"
                )
        seen = [name if isinstance(name, str) else f"{{model: {name.model}}}" for name in v]
        twice = sorted({s for s in seen if seen.count(s) > 1})
        if twice:
            raise ValueError(
                f"rewards: lists {', '.join(twice)} twice; use train: reward_weights to weigh one more"
            )
        return v

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError(
                "a run name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return v


@dataclass
class Resolved:
    """A validated config plus what validation learned about the world (paths made absolute)."""

    config: RunConfig
    text: str  # the config as the user wrote it (YAML)
    model_kind: str  # "local" | "hub" | "gguf" (a local .gguf file, converted by the worker)
    train_data: DataSource
    eval_data: DataSource | None
    notes: list[str] = field(default_factory=list)
    user_deepspeed: dict[str, Any] | None = None  # the JSON of distributed.deepspeed_config, checked
    # every data: train: source (train_data is the first)
    train_sources: list[DataSource] = field(default_factory=list)
