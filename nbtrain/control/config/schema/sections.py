"""The sections of a run config as pydantic models (strict: unknown keys and wrong types refused):
lora:, vision:, quantization:, data:, distributed: (slurm:), hooks:, a reward model. Types and the
checks of one value only; what looks at several keys or at the world is in ``config/rules/``."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from nbtrain.contract.formats import CANONICAL_COLUMNS
from nbtrain.control.config import trainargs
from nbtrain.control.config.choices import Launcher, Offload, Strategy
from nbtrain.control.config.schema.engines import RaySettings, SlurmSettings
from nbtrain.control.config.schema.strict import Strict

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # \Z: "$" also matches before a final newline


class LoraSettings(BaseModel):
    # nbtrain's names below, and any field of peft's LoraConfig (use_dora, use_rslora, init_lora_weights,
    # modules_to_save, layers_to_transform, target_parameters, ...) and loraplus_lr_ratio, checked against
    # peft's dataclass in method_sections (trainargs.check_lora_key / check_lora_value)
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    r: int = Field(
        8,
        gt=0,
        le=4096,
        description="The rank of the adapter matrices: higher learns more and costs more memory.",
        examples=[8, 16, 64],
    )
    alpha: float = Field(
        16, gt=0, description="The adapters' scale: alpha / r multiplies their output.", examples=[16, 32]
    )
    dropout: float = Field(
        0.05, ge=0, lt=1, description="Dropout on the adapters' input (0 to 1).", examples=[0.05]
    )
    target_modules: str | list[str] = Field(
        "auto",
        description=(
            "Which layers get adapters: 'auto' (the model's usual attention projections), 'all-linear', or a "
            "list of module names."
        ),
        examples=["auto", "all-linear", ["q_proj", "v_proj"]],
    )
    bias: Literal["none", "all", "lora_only"] = Field(
        "none", description="Which biases train besides the adapters: none, all, or lora_only."
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _targets_ok(cls, v: Any) -> Any:
        ok = v in ("auto", "all-linear") or (
            isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
        )
        if not ok:
            raise ValueError(
                "target_modules is 'auto' (the model's usual attention projections), "
                "'all-linear', or a list of module names such as [q_proj, v_proj]"
            )
        return v


class VisionSettings(Strict):
    """A vision-language model's parts besides the language model: what stays frozen. By default the image
    encoder and the projector into the language model both do (LoRA then trains the language model only);
    ``encoder`` trains the projector too, ``none`` the encoder as well."""

    freeze: Literal["encoder+projector", "encoder", "none"] = Field(
        "encoder+projector",
        description=(
            "What stays frozen: encoder+projector (LoRA trains the language model only), encoder (the "
            "projector trains too), or none."
        ),
    )
    # For the memory estimate: the most images one row holds (default: counted in the data's first rows)
    # and the tokens each image becomes (default: from the model's config and image processor).
    images_per_row: int | None = Field(
        None,
        ge=0,
        le=1024,
        description=(
            "For the memory estimate: the most images one row holds (default: counted in the data's first "
            "rows)."
        ),
    )
    image_tokens: int | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description=(
            "For the memory estimate: the tokens each image becomes (default: from the model's config and "
            "image processor)."
        ),
    )


class QuantSettings(Strict):
    bits: Literal[4, 8] = Field(4, description="The bits each frozen weight is stored in: 4 or 8.")
    quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit: nf4 (normal float, the usual choice) or fp4."
    )
    double_quant: bool = Field(
        True, description="Quantise the quantisation constants too (saves ~0.4 bits a weight)."
    )


def checked_columns(v: dict[str, str]) -> dict[str, str]:
    problem = columns_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def columns_problem(v: dict[str, str]) -> str | None:
    for canonical, column in v.items():
        if canonical not in CANONICAL_COLUMNS:
            close = difflib.get_close_matches(canonical, list(CANONICAL_COLUMNS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return (
                f"columns: maps nbtrain's names to your dataset's columns; {canonical!r} is not one of "
                f"{', '.join(CANONICAL_COLUMNS)}{hint}"
            )
        if not column:
            return f"columns: {canonical}: needs the name of a column in your data"
    sources = list(v.values())
    if len(set(sources)) != len(sources):
        return "columns: maps two names to the same column"
    return None


# data: columns: and a source's columns: (canonical name -> the dataset's column), checked the same way.
Columns = Annotated[dict[str, str], AfterValidator(checked_columns)]

DataFormat = Literal["auto", "messages", "alpaca", "sharegpt", "text", "preference", "unpaired", "prompt"]


class DataSourceSettings(Strict):
    """One entry of ``data: train:`` as a list: several datasets mixed (by weight, or concatenated)."""

    path: str = Field(
        min_length=1,
        description=(
            "A data file (.jsonl, .json, .csv, .parquet), a save_to_disk() folder, a Hub dataset id, or a "
            "dataset_info.json."
        ),
        examples=["data/train.jsonl", "org/dataset"],
    )
    weight: float | None = Field(
        None,
        gt=0,
        le=1e9,  # relative shares: bounded, so their sum stays a number (1e308 + 1e308 is infinite)
        description=(
            "The source's share when sources are mixed (relative; normalised over the list). Give every "
            "source one, or none (concatenated)."
        ),
        examples=[0.7],
    )
    format: DataFormat | None = Field(None, description="This source's layout (default: data: format:).")
    columns: Columns | None = Field(
        None,
        description="This source's column names, {nbtrain's name: its column} (default: data: columns:).",
    )
    split: str | None = Field(
        None, min_length=1, description="A Hub or save_to_disk() dataset's split.", examples=["train"]
    )
    data_files: str | list[str] | None = Field(
        None, description="A Hub dataset: which of its files (glob patterns).", examples=["data/*.parquet"]
    )
    # a dataset named in the LLaMA-Factory dataset_info.json that path names (or its folder)
    dataset: str | None = Field(
        None,
        min_length=1,
        description=(
            "A dataset named in the LLaMA-Factory dataset_info.json that path: names (or its folder)."
        ),
    )


STOPPING_STRATEGIES = ("all_exhausted", "first_exhausted", "all_exhausted_without_replacement")


class DataSettings(Strict):
    # a path or hub id, or a list of sources [{path, weight?, format?, columns?, split?}, ...]
    train: str | list[DataSourceSettings] = Field(
        description=(
            "The training rows: a path or Hub id, or a list of sources [{path, weight?, format?, columns?, "
            "split?}, ...]."
        ),
        examples=[
            "data/train.jsonl",
            [{"path": "a.jsonl", "weight": 0.7}, {"path": "b.jsonl", "weight": 0.3}],
        ],
    )
    format: DataFormat = Field(
        "auto",
        description=(
            "How the rows are laid out: auto (told from the first rows), messages, alpaca, sharegpt, text, "
            "preference, unpaired or prompt."
        ),
    )
    # a fraction of the training rows (0.1), or a number of rows (200; the only choice when streaming)
    eval_split: float | int | None = Field(
        None,
        description=(
            "Rows held out for evaluation: a fraction (0.1) or a number of rows (200; the only choice when "
            "streaming)."
        ),
        examples=[0.1, 200],
    )
    eval: str | None = Field(
        None,
        description="A separate evaluation file or Hub id (instead of eval_split).",
        examples=["data/eval.jsonl"],
    )
    max_samples: int | None = Field(
        None, gt=0, description="Use at most this many training rows.", examples=[1000]
    )
    # {nbtrain's name: the dataset's column}, e.g. {prompt: question, chosen: good, rejected: bad}
    columns: Columns | None = Field(
        None,
        description=(
            "{nbtrain's name: your dataset's column}, e.g. {prompt: question, chosen: good, rejected: bad}."
        ),
        examples=[{"prompt": "question", "completion": "answer"}],
    )
    # a dataset named in the LLaMA-Factory dataset_info.json that train: names (or the folder holding it):
    # data: {train: data/dataset_info.json, dataset: my_set}; a train: list takes dataset: per source
    dataset: str | None = Field(
        None,
        min_length=1,
        description=(
            "A dataset named in the LLaMA-Factory dataset_info.json that train: names (or the folder holding "
            "it)."
        ),
        examples=["my_set"],
    )
    # read the data as it trains (datasets' IterableDataset): for data larger than memory
    streaming: bool = Field(
        False,
        description=(
            "Read the data as it trains (an IterableDataset), for data larger than memory; needs train: "
            "max_steps."
        ),
    )
    # LLaMA-Factory's mask_history: a conversation trains on its last assistant turn only (SFT)
    mask_history: bool = Field(
        False,
        description=(
            "SFT conversations: train on each conversation's last assistant turn only (LLaMA-Factory's "
            "mask_history)."
        ),
    )
    # how weighted sources are mixed (datasets.interleave_datasets): all_exhausted = until every source
    # has been seen once (smaller ones repeat), first_exhausted = until one runs out
    stopping_strategy: Literal["all_exhausted", "first_exhausted", "all_exhausted_without_replacement"] = (
        Field(
            "all_exhausted",
            description=(
                "How weighted sources are mixed: all_exhausted (until every source was seen once; smaller "
                "ones repeat), first_exhausted (until one runs out), or all_exhausted_without_replacement."
            ),
        )
    )

    @field_validator("train")
    @classmethod
    def _train_ok(cls, v: str | list[DataSourceSettings]) -> str | list[DataSourceSettings]:
        if isinstance(v, str) and not v.strip():
            raise ValueError("train: needs a data file, a save_to_disk() directory or a hub dataset id")
        if isinstance(v, list):
            if not v:
                raise ValueError("train: lists at least one source ({path: ..., weight: ...})")
            weighted = [s.weight is not None for s in v]
            if any(weighted) and not all(weighted):
                raise ValueError(
                    "train: give every source a weight (they are mixed in those proportions) or none "
                    "(the sources are concatenated)"
                )
        return v

    @field_validator("eval_split", mode="before")
    @classmethod
    def _eval_split_number(cls, v: Any) -> Any:
        # Before the float | int union: one message, not one per branch it fails.
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            hint = trainargs.yaml_number_hint(v)
            raise ValueError(
                f"eval_split is a fraction between 0 and 1 (0.1) or a number of rows (200){hint}"
            )
        return v

    @field_validator("eval_split")
    @classmethod
    def _eval_split_ok(cls, v: float | int | None) -> float | int | None:
        if v is None:
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ValueError("eval_split is a fraction between 0 and 1 (0.1) or a number of rows (200)")
        elif not 0 < v < 1:
            raise ValueError("eval_split is a fraction between 0 and 1 (0.1) or a number of rows (200)")
        return v

    @model_validator(mode="after")
    def _one_eval_source(self) -> DataSettings:
        if self.eval is not None and self.eval_split is not None:
            raise ValueError("give either eval (a path) or eval_split (a fraction), not both")
        if self.dataset is not None and isinstance(self.train, list):
            raise ValueError(
                "dataset: names one dataset of a dataset_info.json; with a train: list give each source "
                "its own ({path: data/dataset_info.json, dataset: my_set})"
            )
        return self

    def sources(self) -> list[DataSourceSettings]:
        """``train:`` as a list of sources (a plain string is one source)."""
        if isinstance(self.train, str):
            return [DataSourceSettings.model_validate({"path": self.train})]
        return list(self.train)


def python_name(v: str) -> str:
    if not v.isidentifier():
        raise ValueError(f"{v!r} is not a Python name; hooks: names a function or class of the notebook")
    return v


_HookName = Annotated[str, AfterValidator(python_name)]


class HooksSettings(Strict):
    """``hooks:``: notebook objects the worker calls (nbtrain.contract.hooks says how each is called)."""

    callbacks: list[_HookName] | None = Field(
        None, description="Notebook TrainerCallback classes to add to the trainer.", examples=[["MyCallback"]]
    )
    compute_metrics: _HookName | None = Field(
        None,
        description=(
            "A notebook function computing evaluation metrics from predictions (the Trainer's "
            "compute_metrics)."
        ),
        examples=["exact_match"],
    )
    loss: _HookName | None = Field(
        None, description="A notebook function computing the training loss (the Trainer's compute_loss_func)."
    )
    preprocess: _HookName | None = Field(
        None, description="A notebook function applied to each row before formatting."
    )
    preprocess_logits_for_metrics: _HookName | None = Field(
        None, description="A notebook function reducing the logits before compute_metrics."
    )

    @field_validator("callbacks", mode="before")
    @classmethod
    def _one_callback(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v  # callbacks: MyCallback is a list of one

    @field_validator("callbacks")
    @classmethod
    def _callbacks_ok(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("callbacks: lists a callback twice; name each once")
        return v


class DistributedSettings(Strict):
    strategy: Literal["auto", Strategy] = Field(
        "auto",
        description=(
            "auto (one process per GPU, DDP when several), none, ddp, zero1/zero2/zero3 (DeepSpeed ZeRO), or "
            "fsdp."
        ),
    )
    offload: Offload = Field(
        "none",
        description=(
            "DeepSpeed: where optimizer state (and with zero3, parameters) live: none, cpu or nvme "
            "(ZeRO-Infinity, with nvme_path)."
        ),
    )
    num_processes: Literal["auto"] | int = Field(
        "auto", description="Processes per node: auto (one per GPU) or a number.", examples=["auto", 2]
    )
    launcher: Literal["auto", Launcher] = Field(
        "auto",
        description=(
            "What starts the processes: auto, torchrun, deepspeed, accelerate, or notebook (accelerate's "
            "notebook_launcher)."
        ),
    )
    nodes: int = Field(
        1, ge=1, description="Machines the run spans (with hostfile: or slurm:).", examples=[2]
    )
    hostfile: str | None = Field(
        None,
        description="Multi-node without SLURM: a file listing the hosts (one per line, 'host slots=N').",
        examples=["hosts.txt"],
    )
    slurm: SlurmSettings | None = Field(
        None,
        description="Submit the run as an sbatch job (one node or several), with these settings.",
        examples=[{"partition": "gpu", "time": "06:00:00", "gpus_per_node": 4}],
    )
    ray: RaySettings | None = Field(
        None,
        description="Run on a Ray cluster: a Ray job whose workers train through Ray Train.",
        examples=[{"address": "http://head:8265", "num_workers": 4}],
    )
    deepspeed_config: str | None = Field(
        None,
        description="Your own DeepSpeed JSON file (checked; its 'auto' values filled in).",
        examples=["ds_config.json"],
    )
    nvme_path: str | None = Field(
        None,
        description="offload: nvme: a folder on a fast local disk for ZeRO-Infinity's swap files.",
        examples=["/local/nvme"],
    )
    master_addr: str | None = Field(
        None, description="Multi-node: the address of node 0 as the other nodes reach it."
    )
    master_port: int | None = Field(
        None, gt=0, lt=65536, description="Multi-node: the rendezvous port on node 0."
    )

    @field_validator("num_processes")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("num_processes is 'auto' or a positive integer (processes per node)")
        return v


class RewardModelRef(Strict):
    """A reward model in ``rewards:``: ``{model: <run id, run directory, model folder or Hub id>}`` (checked
    and made absolute by ``nbtrain.control.config.rewardmodels``)."""

    model: str = Field(
        min_length=1,
        description=(
            "A reward model: an objective: reward run (its id, name or folder), a model folder, or a Hub id."
        ),
    )


# ``sweep: space:``: a range is a mapping of one of these kinds to [low, high] (int kinds: [low, high, step]
# too); a list is a set of choices (the only form grid search takes).
SPACE_RANGES = ("uniform", "log_uniform", "int", "log_int")
# Keys a sweep cannot vary: what names the runs and the sweep itself.
SPACE_FIXED = ("sweep", "name", "resume")
_SPACE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def _space_entry(key: str, spec: Any) -> Any:
    """One ``space:`` entry checked: ``[choices]`` or ``{KIND: [low, high]}``; a message naming the key."""
    if not isinstance(key, str) or not _SPACE_KEY.match(key):
        raise ValueError(
            f"space key {key!r} is not a dotted config key (train.learning_rate, lora.r, data.eval_split)"
        )
    if key.split(".")[0] in SPACE_FIXED:
        top = key.split(".")[0]
        raise ValueError(f"space: {key} cannot be swept: each trial's {top}: is the sweep's own")
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"space: {key}: an empty list of choices; give at least one value")
        texts = [repr(v) for v in spec]
        if len(set(texts)) != len(texts):
            raise ValueError(f"space: {key}: a choice is listed twice ({spec})")
        return spec
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError(
            f"space: {key}: give a list of choices ([4, 8, 16]) or one range ({{log_uniform: [1e-5, 1e-3]}}; "
            f"kinds: {', '.join(SPACE_RANGES)}), not {spec!r}"
        )
    ((kind, bounds),) = spec.items()
    if kind not in SPACE_RANGES:
        close = difflib.get_close_matches(str(kind), SPACE_RANGES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"space: {key}: unknown range {kind!r}{hint}; kinds: {', '.join(SPACE_RANGES)}")
    integer = kind in ("int", "log_int")
    size = (2, 3) if integer else (2,)
    ok = (int,) if integer else (int, float)
    if (
        not isinstance(bounds, list)
        or len(bounds) not in size
        or not all(isinstance(b, ok) and not isinstance(b, bool) for b in bounds)
    ):
        want = "[low, high] or [low, high, step] of whole numbers" if integer else "[low, high] of numbers"
        raise ValueError(f"space: {key}: {kind} takes {want}, not {bounds!r}")
    low, high = bounds[0], bounds[1]
    if not low < high:
        raise ValueError(f"space: {key}: {kind} [{low}, {high}]: low must be below high")
    if kind.startswith("log") and low <= 0:
        raise ValueError(f"space: {key}: {kind} needs a low above 0 (a log scale), not {low}")
    if len(bounds) == 3 and (bounds[2] < 1 or kind == "log_int"):
        raise ValueError(f"space: {key}: int's step is a whole number of at least 1 (log_int takes none)")
    if not all(abs(b) < 1e15 for b in bounds):
        raise ValueError(f"space: {key}: {kind} {bounds}: bounds beyond 1e15 are no setting")
    return spec


class SweepSettings(Strict):
    """``sweep:``: a search over config keys; each trial is an ordinary run (nbtrain.control.sweep)."""

    space: dict[str, Any] = Field(
        min_length=1,
        description=(
            "What to vary, by dotted config key: a list of choices ([4, 8, 16]) or a range "
            "({log_uniform: [1e-5, 1e-3]}, {uniform: [0, 0.1]}, {int: [1, 4]}, {log_int: [4, 64]})."
        ),
        examples=[{"train.learning_rate": {"log_uniform": [1e-5, 1e-3]}, "lora.r": [4, 8, 16]}],
    )
    method: Literal["grid", "random", "tpe"] = Field(
        "tpe",
        description=(
            "How trials are chosen: tpe (Optuna's TPE, learns from finished trials), random, or grid (every "
            "combination of the lists)."
        ),
    )
    trials: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="How many trials to run (grid: every combination unless fewer are asked).",
        examples=[12],
    )
    metric: str = Field(
        "eval_loss",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z_][A-Za-z0-9_./-]*$",
        description=(
            "The logged metric a trial is judged by, its last value (eval_loss; any metric a run logs, "
            "e.g. the eval_exact of hooks: compute_metrics)."
        ),
        examples=["eval_loss", "eval_exact"],
    )
    direction: Literal["minimize", "maximize"] | None = Field(
        None, description="minimize or maximize the metric (default: minimize a loss; say it for others)."
    )
    prune: Literal["none", "median", "hyperband"] = Field(
        "none",
        description=(
            "Stop bad trials at evaluation points: median (worse than the median of earlier trials at that "
            "step) or hyperband (successive halving); none runs every trial to its end."
        ),
    )
    at_once: int | Literal["auto"] = Field(
        "auto",
        description="Trials that run side by side: auto (what memory and cores allow), or a number.",
        examples=["auto", 2],
    )
    seed: int = Field(0, description="The sampler's seed: the same seed proposes the same trials.")

    @field_validator("space")
    @classmethod
    def _space_ok(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, spec in v.items():
            _space_entry(key, spec)
        keys = sorted(v)
        nested = [(a, b) for a in keys for b in keys if b.startswith(a + ".")]
        if nested:
            a, b = nested[0]
            raise ValueError(f"space: {a} and {b}: one key inside the other; vary one of them")
        return v

    @field_validator("at_once")
    @classmethod
    def _at_once_ok(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError("at_once is auto or a number of trials from 1 to 64")
        return v

    @model_validator(mode="after")
    def _shape_ok(self) -> SweepSettings:
        ranges = sorted(k for k, s in self.space.items() if isinstance(s, dict))
        if self.method == "grid" and ranges:
            raise ValueError(
                f"method: grid takes lists of values; {ranges[0]} is a range: list the values, or use "
                "method: random or tpe"
            )
        if self.method != "grid" and self.trials is None:
            raise ValueError(f"method: {self.method} needs trials: (how many trials to run, e.g. 12)")
        if self.direction is None and "loss" not in self.metric:
            raise ValueError(
                f"say whether {self.metric} is better high or low: direction: maximize (or minimize)"
            )
        return self

    @property
    def goal(self) -> str:
        """minimize or maximize: a loss is minimised unless ``direction:`` says otherwise."""
        return self.direction or "minimize"

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the lists, in order (method: grid)."""
        combos: list[dict[str, Any]] = [{}]
        for key, choices in self.space.items():
            combos = [{**c, key: v} for c in combos for v in choices]
        return combos
