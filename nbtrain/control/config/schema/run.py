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
    SweepSettings,
    VisionSettings,
)


class RunConfig(Strict):
    model: str = Field(
        min_length=1,
        description=(
            "The model to fine-tune: a local folder saved with save_pretrained(), a Hub id (org/name), or a "
            ".gguf file (converted once into a model folder)."
        ),
        examples=[
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "./models/my-model",
            "./SmolLM2-135M-Instruct.Q4_1.gguf",
        ],
    )
    revision: str | None = Field(
        None,
        min_length=1,
        description="A Hub model's branch, tag or commit (default: main).",
        examples=["main", "v1.0"],
    )
    # which .gguf file of a Hub repo (or of a folder holding several) model: means; nbtrain converts it
    gguf_file: str | None = Field(
        None,
        min_length=1,
        pattern=r"(?i)^[^/\\]+\.gguf$",
        description=(
            "Which .gguf file of a Hub repo (or of a folder holding several) model: means; nbtrain converts "
            "it once."
        ),
        examples=["model.Q4_1.gguf"],
    )
    method: Literal["auto", Method] = Field(
        "lora",
        description=(
            "Which weights train: lora (small adapters), qlora (adapters on a 4/8-bit model: least memory), "
            "full (every weight), or auto (chosen for the hardware found)."
        ),
    )
    # objective: what the training optimises; method: (above) which weights train. Orthogonal.
    objective: ObjectiveName = Field(
        "sft",
        description=(
            "What training optimises: sft (imitate answers), dpo / orpo (prefer chosen over rejected), kto "
            "(desirable / undesirable completions), reward (a reward model from chosen / rejected pairs), "
            "grpo / rloo (online RL from reward functions or a reward model)."
        ),
    )
    # grpo / rloo: notebook functions, built-ins (nbtrain.contract.rewards) or reward models {model: ...}
    rewards: list[str | RewardModelRef] | None = Field(
        None,
        description=(
            "objective: grpo / rloo: reward functions defined in the notebook, built-ins (format_reward, "
            "length_reward), or a reward model {model: RUN} (an objective: reward run's id or folder, a "
            "model folder or a Hub id)."
        ),
        examples=[["length_reward"], [{"model": "my-reward-run"}]],
    )
    hooks: HooksSettings | None = Field(
        None,
        description=(
            "Notebook functions and classes the training calls: callbacks, compute_metrics, loss, preprocess."
        ),
    )
    batch_size: int | None = Field(
        None,
        gt=0,
        description=(
            "The effective batch (rows per optimizer step); nbtrain splits it into a per-device batch and "
            "gradient accumulation that fit."
        ),
        examples=[32],
    )
    data: DataSettings = Field(
        description=(
            "The training data (data: train:) and how to read it: format, columns, evaluation split, mixing."
        )
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Any field of the objective's TRL config (SFTConfig, DPOConfig, ...): learning_rate, "
            "num_train_epochs, max_steps, max_length, ... checked against the installed TRL."
        ),
        examples=[{"learning_rate": 0.0002, "num_train_epochs": 1}],
    )
    lora: LoraSettings | None = Field(
        None,
        description=(
            "The LoRA adapters (method: lora / qlora): r, alpha, dropout, target_modules, and any field of "
            "peft's LoraConfig."
        ),
    )
    quantization: QuantSettings | None = Field(
        None, description="method: qlora: how the frozen model is quantised (bitsandbytes)."
    )
    vision: VisionSettings | None = Field(
        None,
        description=(
            "A vision-language model: which of its parts stay frozen, and the image numbers for the memory "
            "estimate."
        ),
    )
    precision: Literal["auto", Precision] = Field(
        "auto",
        description=(
            "The number format of weights and activations in training: auto (bf16 where the hardware has it, "
            "else fp16 or fp32), bf16, fp16 or fp32."
        ),
    )
    resume: Literal["never", "auto"] = Field(
        "never",
        description=(
            "auto: a run of this name that stopped goes on from its last complete checkpoint; never: always a"
            " new run."
        ),
    )
    distributed: DistributedSettings = Field(
        default_factory=lambda: DistributedSettings.model_validate({}),
        description=(
            "How the run spreads over GPUs and machines: strategy (DDP, DeepSpeed ZeRO, FSDP), offload, "
            "processes, nodes, SLURM."
        ),
    )
    trust_remote_code: bool = Field(
        False,
        description=(
            "Run the model repository's own Python code (models transformers does not ship). Off unless you "
            "trust the repository."
        ),
    )
    # A training loss or gradient norm that turns NaN/inf: fail the run at that step (no checkpoint of the
    # broken weights), or go on (the Trainer's own behaviour; the metrics flag the steps).
    on_nan: Literal["fail", "continue"] = Field(
        "fail",
        description=(
            "A loss or gradient norm that turns NaN/inf: fail the run at that step (no checkpoint of the "
            "broken weights), or continue."
        ),
    )
    checkpoint_minutes: float = Field(
        10.0,
        ge=0,
        le=10080,
        description=(
            "Also save a checkpoint after the step that ends each this many minutes of training (besides "
            "train: save_steps), so a stop, a crash or running out of memory loses at most that much; 0: "
            "by steps only."
        ),
        examples=[10, 30, 0],
    )
    init_from: str | None = Field(
        None,
        description=(
            "Start from the weights of an earlier run of the same method: its checkpoint folder "
            "(RUN/checkpoints/checkpoint-N) or output folder. LoRA: its adapter (the same r and target "
            "modules); full: its model. The optimizer and schedule start afresh (SFT runs)."
        ),
        examples=["runs/my-run/checkpoints/checkpoint-40"],
    )
    sweep: SweepSettings | None = Field(
        None,
        description=(
            "Run this config as a sweep: trials that vary the keys of space:, chosen by grid, random or TPE "
            "search, judged by a metric, pruned at evaluation points; each trial is a run."
        ),
    )
    name: str | None = Field(
        None,
        description="The run's name (1-64 letters, digits, '.', '_' or '-'); the run id adds a time stamp.",
        examples=["smollm2-lora"],
    )

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
    # The model's config.json, read once for every stage after validation (nbtrain.control.plan.facts); None
    # when it is not on this machine. ``model_facts_read`` says whether it was looked for yet.
    model_facts: dict[str, Any] | None = None
    model_facts_read: bool = False
