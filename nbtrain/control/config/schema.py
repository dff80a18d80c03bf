"""Run config: YAML (or a dict) -> validated, typed ``RunConfig``; every problem collected into one error.

Validation is in two passes: the schema (pydantic, strict types, unknown keys rejected) and the checks
that look at the world (model path, data files, TRL key names, bitsandbytes). Problems from both are
reported together with the key path as written, its YAML line, allowed values and a close match.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from nbtrain.contract.adapters import converts_init
from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.contract.formats import CANONICAL_COLUMNS, FORMATS, SFT_FORMATS
from nbtrain.contract.gguf import is_gguf
from nbtrain.contract.objectives import OBJECTIVES, UNAVAILABLE, rewards_objectives
from nbtrain.control import tracking
from nbtrain.control.config import datasetinfo, rewardmodels, trainargs
from nbtrain.control.config.choices import (
    ZERO_STAGES,
    Launcher,
    Method,
    ObjectiveName,
    Offload,
    Precision,
    Strategy,
)
from nbtrain.control.config.datacheck import DataProblem, DataSource, RowHook, flags_problem, inspect_data
from nbtrain.control.config.yamlsafe import MAX_BYTES as MAX_YAML_BYTES
from nbtrain.control.config.yamlsafe import DuplicateKeys, YamlProblem, YamlSyntax, load_yaml

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HUB_MODEL = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class _Strict(BaseModel):
    # .inf / .nan are never a setting: a LoRA alpha of .inf trains to nothing and reports "completed"
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class LoraSettings(BaseModel):
    # nbtrain's names below, and any field of peft's LoraConfig (use_dora, use_rslora, init_lora_weights,
    # modules_to_save, layers_to_transform, target_parameters, ...) and loraplus_lr_ratio, checked against
    # peft's dataclass in _method_sections (trainargs.check_lora_key / check_lora_value)
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    r: int = Field(8, gt=0, le=4096)
    alpha: float = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = "auto"
    bias: Literal["none", "all", "lora_only"] = "none"

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


class VisionSettings(_Strict):
    """A vision-language model's parts besides the language model: what stays frozen. By default the image
    encoder and the projector into the language model both do (LoRA then trains the language model only);
    ``encoder`` trains the projector too, ``none`` the encoder as well."""

    freeze: Literal["encoder+projector", "encoder", "none"] = "encoder+projector"
    # For the memory estimate: the most images one row holds (default: counted in the data's first rows)
    # and the tokens each image becomes (default: from the model's config and image processor).
    images_per_row: int | None = Field(None, ge=0, le=1024)
    image_tokens: int | None = Field(None, gt=0, le=1_000_000)


class QuantSettings(_Strict):
    bits: Literal[4, 8] = 4
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True


def _checked_columns(v: dict[str, str]) -> dict[str, str]:
    problem = _columns_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _columns_problem(v: dict[str, str]) -> str | None:
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
Columns = Annotated[dict[str, str], AfterValidator(_checked_columns)]

DataFormat = Literal["auto", "messages", "alpaca", "sharegpt", "text", "preference", "unpaired", "prompt"]


class DataSourceSettings(_Strict):
    """One entry of ``data: train:`` as a list: several datasets mixed (by weight, or concatenated)."""

    path: str = Field(min_length=1)
    weight: float | None = Field(None, gt=0)  # relative; normalised to probabilities over the list
    format: DataFormat | None = None  # default: data: format:
    columns: Columns | None = None  # default: data: columns:
    split: str | None = Field(None, min_length=1)  # hub / save_to_disk datasets with several splits
    data_files: str | list[str] | None = None  # a hub dataset: which of its files (glob patterns)
    # a dataset named in the LLaMA-Factory dataset_info.json that path names (or its folder)
    dataset: str | None = Field(None, min_length=1)


STOPPING_STRATEGIES = ("all_exhausted", "first_exhausted", "all_exhausted_without_replacement")


class DataSettings(_Strict):
    # a path or hub id, or a list of sources [{path, weight?, format?, columns?, split?}, ...]
    train: str | list[DataSourceSettings]
    format: DataFormat = "auto"
    # a fraction of the training rows (0.1), or a number of rows (200; the only choice when streaming)
    eval_split: float | int | None = None
    eval: str | None = None
    max_samples: int | None = Field(None, gt=0)
    # {nbtrain's name: the dataset's column}, e.g. {prompt: question, chosen: good, rejected: bad}
    columns: Columns | None = None
    # a dataset named in the LLaMA-Factory dataset_info.json that train: names (or the folder holding it):
    # data: {train: data/dataset_info.json, dataset: my_set}; a train: list takes dataset: per source
    dataset: str | None = Field(None, min_length=1)
    # read the data as it trains (datasets' IterableDataset): for data larger than memory
    streaming: bool = False
    # LLaMA-Factory's mask_history: a conversation trains on its last assistant turn only (SFT)
    mask_history: bool = False
    # how weighted sources are mixed (datasets.interleave_datasets): all_exhausted = until every source
    # has been seen once (smaller ones repeat), first_exhausted = until one runs out
    stopping_strategy: Literal["all_exhausted", "first_exhausted", "all_exhausted_without_replacement"] = (
        "all_exhausted"
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


class SlurmSettings(_Strict):
    """``distributed: slurm:``: the run is an sbatch job (any number of nodes, one too)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str = "04:00:00"
    mem: str | None = None  # per node, as sbatch takes it: "32G"
    gpus_per_node: int | None = Field(None, gt=0)
    cpus_per_task: int | None = Field(None, gt=0)
    exclusive: bool = False
    # auto: a job that nears its time limit stops at a checkpoint signal_before s before it, is requeued and
    # goes on from that checkpoint, at most max_requeues times; a job SLURM preempts or whose node fails is
    # requeued by SLURM and goes on from the last complete checkpoint. never: it stops there (resume by hand)
    requeue: Literal["auto", "never"] = "auto"
    max_requeues: int = Field(10, ge=0)
    # seconds before the job's time limit the run stops at a checkpoint; 0: not at all, SLURM ends the job at
    # its limit (TIMEOUT) and resume goes on from the last complete checkpoint
    signal_before: int = Field(120, ge=0)
    extra: list[str] = Field(default_factory=list)  # more "#SBATCH ..." options, written as given

    @field_validator("partition", "account", "qos", "constraint", "time", "mem")
    @classmethod
    def _one_word(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c.isspace() for c in v) or v.startswith("-")):
            raise ValueError(f"{v!r} is not one sbatch value (no spaces, not an option)")
        return v

    @field_validator("extra")
    @classmethod
    def _one_line_each(cls, v: list[str]) -> list[str]:
        for line in v:
            if "\n" in line or "\r" in line or not line.strip().startswith("-"):
                raise ValueError(f"{line!r}: each extra line is one sbatch option, e.g. --gres=gpu:2")
        return v


def _python_name(v: str) -> str:
    if not v.isidentifier():
        raise ValueError(f"{v!r} is not a Python name; hooks: names a function or class of the notebook")
    return v


_HookName = Annotated[str, AfterValidator(_python_name)]


class HooksSettings(_Strict):
    """``hooks:``: notebook objects the worker calls (nbtrain.contract.hooks says how each is called)."""

    callbacks: list[_HookName] | None = None
    compute_metrics: _HookName | None = None
    loss: _HookName | None = None
    preprocess: _HookName | None = None
    preprocess_logits_for_metrics: _HookName | None = None

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


class DistributedSettings(_Strict):
    strategy: Literal["auto", Strategy] = "auto"
    offload: Offload = "none"
    num_processes: Literal["auto"] | int = "auto"  # per node
    launcher: Literal["auto", Launcher] = "auto"
    nodes: int = Field(1, ge=1)
    hostfile: str | None = None
    slurm: SlurmSettings | None = None
    deepspeed_config: str | None = None
    nvme_path: str | None = None  # offload: nvme: a folder on a fast local disk for ZeRO-Infinity's swaps
    master_addr: str | None = None  # multi-node: the address of node 0 as the others reach it
    master_port: int | None = Field(None, gt=0, lt=65536)

    @field_validator("num_processes")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("num_processes is 'auto' or a positive integer (processes per node)")
        return v


class RewardModelRef(_Strict):
    """A reward model in ``rewards:``: ``{model: <run id, run directory, model folder or Hub id>}`` (checked
    and made absolute by ``nbtrain.control.config.rewardmodels``)."""

    model: str = Field(min_length=1)


class RunConfig(_Strict):
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


# ----------------------------------------------------------------------------------------- YAML lines


def _line_map(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in a YAML document to the 1-based line of its key."""
    out: dict[tuple[str, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = (*path, str(k.value))
                out[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = (*path, str(i))
                out[p] = v.start_mark.line + 1
                walk(v, p)

    if root is not None:
        walk(root, ())
    return out


class _Problems:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.map = _line_map(text) if text else {}
        self.items: list[Problem] = []
        # Secrets found in the config: never repeated in a problem (its YAML line is shown masked), and
        # their keys get the secret's problem only (not also "unknown key").
        self.secrets: set[str] = set()
        self.secret_paths: set[str] = set()

    def add(self, path: tuple[str | int, ...], message: str, *, secret: str | None = None) -> None:
        shown = ".".join(str(x) for x in path)
        if secret is not None:
            self.secrets.add(secret)
            self.secret_paths.add(shown)
        elif shown in self.secret_paths:
            return
        p = tuple(str(x) for x in path)
        line = None
        while p and line is None:
            line = self.map.get(p)
            if line is None:
                p = p[:-1]
        src = self.lines[line - 1] if line and line <= len(self.lines) else None
        for s in (s for s in self.secrets if len(s) >= 4):  # shorter would mask ordinary words
            src = src.replace(s, "***") if src is not None else None
            message = message.replace(s, "***")
        self.items.append(Problem(shown, message, line, src))


# ------------------------------------------------------------------------------------- schema errors


def _fields_of(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at ``loc`` (for did-you-mean on unknown keys)."""
    cur: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list of sub-models (data: train: [{path: ...}, ...])
        f = cur.model_fields.get(str(part))
        if f is None:
            return []
        ann = f.annotation
        args = [x for a in getattr(ann, "__args__", (ann,)) for x in getattr(a, "__args__", (a,))]
        sub = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not sub:
            return []
        cur = sub[0]
    return list(cur.model_fields)


# pydantic names the branch of a union in an error's location (eval_split.float, train.str, ...); these
# are those names for the plain types, the others hold brackets (list[...], function-after[...]).
_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _is_branch_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _BRANCH_TAGS or "[" in part or "(" in part)


def _clean_loc(loc: tuple[Any, ...], raw: Any) -> tuple[Any, ...]:
    """Drop pydantic's union-branch tags from an error location, keeping the keys the user wrote (and a
    missing key, which is a real location too)."""
    out: list[Any] = []
    cur, missing = raw, False
    for part in loc:
        if _is_branch_tag(part) and not (isinstance(cur, dict) and part in cur):
            continue  # the tag of a union's branch
        if missing or (isinstance(cur, dict) and part not in cur):
            out.append(part)  # a key the config lacks (or one below it)
            missing = True
        elif isinstance(cur, dict) or (
            isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        ):
            cur = cur[part]
            out.append(part)
    return tuple(out)


def _other_branch(loc: tuple[Any, ...], raw: Any) -> bool:
    """An error from the ``str`` branch of a union (``train: str | list[...]``) when the user wrote a
    list there: the list branch's own errors say what is wrong, this one only adds noise."""
    cur = raw
    for part in loc:
        if part == "str" and isinstance(cur, list | dict):
            return True
        if (isinstance(cur, dict) and part in cur) or (
            isinstance(cur, list) and isinstance(part, int) and part < len(cur)
        ):
            cur = cur[part]
    return False


# What a type error's kind expects, in words (a union's branches are joined: "'auto' or an integer").
_EXPECTS = {
    "float_type": "a number",
    "int_type": "an integer",
    "string_type": "text",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "none_required": "null",
}


def _literal_choices(e: Any) -> tuple[list[str], str]:
    """The choices of a ``literal_error``: the names (for did-you-mean) and pydantic's text of them."""
    expected = str(e.get("ctx", {}).get("expected", ""))
    return re.findall(r"'([^']*)'", expected), expected


def _choice_message(value: Any, e: Any) -> str:
    names, expected = _literal_choices(e)
    close = trainargs.closest(value, names) if isinstance(value, str) and names else []
    hint = f"; did you mean {trainargs.one_of([repr(c) for c in close])}?" if close else "."
    return f"{value!r} is not allowed{hint} Choose one of {expected}"


def _union_message(errors: list[Any], value: Any) -> str:
    """One message for a value no branch of a union accepts: what each branch expects, joined."""
    expects: list[str] = []
    names: list[str] = []
    for e in errors:
        if e["type"] == "literal_error":
            names += _literal_choices(e)[0]
            expects.append(_literal_choices(e)[1])
        elif e["type"] in _EXPECTS and _EXPECTS[e["type"]] not in expects:
            expects.append(_EXPECTS[e["type"]])
    if "a number" in expects and "an integer" in expects:
        expects.remove("an integer")  # a number may be whole
    close = trainargs.closest(value, names) if isinstance(value, str) and names else []
    hint = trainargs.yaml_number_hint(value) if {"a number", "an integer"} & set(expects) else ""
    msg = f"{value!r} is not valid here: expected {trainargs.one_of(expects)}{hint}"
    return msg + (f"; did you mean {trainargs.one_of([repr(c) for c in close])}?" if close else "")


# Keys written in the wrong section, or by another tool's name: where nbtrain takes them.
_ELSEWHERE = {
    "lora_r": "lora.r",
    "rank": "lora.r",
    "lora_rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
    "lora_target": "lora.target_modules",
    "bnb_4bit_quant_type": "quantization.quant_type",
    "bnb_4bit_use_double_quant": "quantization.double_quant",
    "quant_bits": "quantization.bits",
    "dataset": "data.train",
    "datasets": "data.train",
    "train_file": "data.train",
    "train_data": "data.train",
    "dataset_path": "data.train",
    "eval_file": "data.eval",
    "eval_dataset": "data.eval",
    "val_set_size": "data.eval_split",
    "model_name": "model",
    "model_name_or_path": "model",
    "model_id": "model",
    "base_model": "model",
    "pretrained_model_name_or_path": "model",
    "num_gpus": "distributed.num_processes",
    "nproc_per_node": "distributed.num_processes",
    "num_nodes": "distributed.nodes",
    "zero_stage": "distributed.strategy",
}


def _sections() -> dict[tuple[str, ...], type[BaseModel]]:
    return {
        (): RunConfig,
        ("data",): DataSettings,
        ("lora",): LoraSettings,
        ("quantization",): QuantSettings,
        ("distributed",): DistributedSettings,
        ("distributed", "slurm"): SlurmSettings,
    }


def _home_of(key: str, section: tuple[str, ...], objective: str) -> tuple[str, ...] | None:
    """Where ``key``, unknown in ``section``, belongs: its full path in another section, or None."""
    if section not in _sections() and section != ("train",):
        return None  # an entry of a list (data: train: [{path: ...}]): its own keys only
    if key in _ELSEWHERE:
        home = tuple(_ELSEWHERE[key].split("."))
        return home if home[:-1] != section else None
    for where, model in _sections().items():
        if where != section and key in model.model_fields and key not in ("train", "data"):
            return (*where, key)
    if section != ("train",) and objective in OBJECTIVES:
        fields = trainargs.fields_for(objective)
        name = key if key in fields else trainargs.RENAMED.get(key)
        if name in fields and name not in trainargs.MANAGED:
            return ("train", name)
    return None


def elsewhere_message(key: str, section: tuple[str, ...], home: tuple[str, ...]) -> str:
    """``epochs`` at the top level: 'put it under train: as train.num_train_epochs'."""
    here = "at the top level" if not section else f"in the {': '.join(section)}: section"
    dotted = ".".join(home)
    if len(home) == 1:
        return f"'{key}' is not a key {here}: put it at the top level, as {home[0]}: (not indented)"
    tail = " (the TRL/transformers name)" if home[0] == "train" and home[-1] != key else ""
    return f"'{key}' is not a key {here}: put it under {': '.join(home[:-1])}: as {dotted}{tail}"


def _schema_problems(err: ValidationError, raw: Any, probs: _Problems) -> None:
    objective = raw.get("objective", "sft") if isinstance(raw, dict) else "sft"
    objective = objective if isinstance(objective, str) and objective in OBJECTIVES else "sft"
    # A union reports once per branch (eval_split: abc is neither a float nor an int): the errors are
    # grouped by the location the user wrote, and each location gets one message.
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for e in err.errors():
        if not _other_branch(tuple(e["loc"]), raw):
            groups.setdefault(_clean_loc(tuple(e["loc"]), raw), []).append(e)
    for loc, errors in groups.items():
        typed = [e for e in errors if e["type"] in _EXPECTS or e["type"] == "literal_error"]
        # A validator's own message (or a range) says more than "wrong type" from a branch it left.
        specific = [e for e in errors if e not in typed]
        e = specific[0] if specific else errors[0]
        kind, value = e["type"], e.get("input")
        if len(typed) > 1 and not specific:
            probs.add(loc, _union_message(typed, value))
        elif kind == "extra_forbidden":
            key, section = str(loc[-1]), tuple(str(x) for x in loc[:-1] if not isinstance(x, int))
            home = _home_of(key, section, objective)
            if home is not None:
                probs.add(loc, elsewhere_message(key, section, home))
                continue
            allowed = _fields_of(RunConfig, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else "."
            probs.add(loc, f"unknown key '{key}'{hint} Allowed here: {', '.join(allowed)}")
        elif kind == "missing":
            probs.add(loc, "required key is missing")
        elif kind == "literal_error":
            probs.add(loc, _choice_message(value, e))
        elif kind.endswith("_type") or kind in {"model_type", "dict_type"}:
            hint = trainargs.yaml_number_hint(value) if kind in ("float_type", "int_type") else ""
            probs.add(loc, f"{value!r} has the wrong type: {e['msg'].lower()}{hint}")
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            probs.add(loc, f"{msg} (got {value!r})" if not isinstance(value, dict) else msg)


# ----------------------------------------------------------------------------------------- secrets

# Keys whose text value is a credential. Tokenizer settings (pad_token, eos_token, ...) are not.
_SECRET_KEYS = frozenset(
    {
        "token", "hub_token", "hf_token", "use_auth_token", "auth_token", "access_token", "api_key",
        "apikey", "password", "passwd", "secret", "secret_key", "private_key", "client_secret",
    }
)  # fmt: skip
_SECRET_SUFFIXES = ("_api_key", "_apikey", "_password", "_secret", "_secret_key", "_access_token",
                    "_auth_token", "_hub_token", "_hf_token")  # fmt: skip
_HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")  # what a Hugging Face access token looks like
SECRET_ADVICE = (
    "a config is kept in plain text (config.yaml and resolved.json in the run directory, the run record "
    "in the saved notebook), so nbtrain takes no secrets in it. Remove it and set it in the environment, "
    "which the training process inherits: HF_TOKEN (or run `hf auth login` once) for the Hugging Face "
    "Hub, WANDB_API_KEY (or `wandb login`) for Weights & Biases"
)


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return k in _SECRET_KEYS or k.endswith(_SECRET_SUFFIXES)


def _secret_problems(raw: dict[str, Any], probs: _Problems) -> None:
    """Refuse credentials anywhere in the config (a secret-named key with a text value, or a value that
    is a Hugging Face token), without repeating them."""
    seen: set[int] = set()  # a shared (aliased) value is looked at once
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict | list):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, str) and v.strip() and _is_secret_key(str(k)):
                    probs.add((*path, str(k)), f"'{k}' holds a secret: {SECRET_ADVICE}", secret=v)
                else:
                    stack.append(((*path, str(k)), v))
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))
        elif isinstance(value, str) and (m := _HF_TOKEN_VALUE.search(value)):
            probs.add(path, f"this value holds a Hugging Face token: {SECRET_ADVICE}", secret=m.group(0))


# ------------------------------------------------------------------------------------ world checks


@lru_cache(maxsize=4)
def bitsandbytes_problem(sys_path: tuple[str, ...]) -> str | None:
    """Why bitsandbytes cannot load here, or None. Checked in a subprocess: the kernel never imports it."""
    del sys_path  # part of the cache key only
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed; install it (`pip install bitsandbytes`) or use method: lora"
    probe = subprocess.run(
        [sys.executable, "-c", "import bitsandbytes, torch; print(bitsandbytes.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return (
            f"bitsandbytes is installed but cannot load: {last}. Fix the install "
            f"(`pip install -U bitsandbytes`) or use method: lora"
        )
    return None


def _check_model(spec: str, base: Path, probs: _Problems, gguf_file: Any = None) -> str:
    gguf_name = gguf_file if isinstance(gguf_file, str) else None
    if not spec.startswith((".", "/", "~")) and ".." in re.split(r"[/\\]", spec):
        # Qwen/Qwen2.5-0.5B/../../../other reads as a Hub id (and passes a preset's 'Qwen/*') but is a
        # path to a folder elsewhere on this machine.
        probs.add(
            ("model",),
            f"{spec!r} has a '..' part: a Hub id is 'org/name' and never holds '..'. For a folder on this "
            f"machine write its path (./models/name or /abs/path/name)",
        )
        return "hub"
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # "~name" of a user this machine does not know
        probs.add(("model",), f"{spec!r}: no home folder is known for that user here; write the full path")
        return "local"
    if not path.is_absolute():
        path = (base / path).resolve()
    if path.exists():
        kind = _check_gguf(path, gguf_name, probs)
        if kind is not None:
            return kind
    if path.is_dir():
        if not (path / "config.json").exists():
            probs.add(
                ("model",),
                f"{path} is not a model directory (no config.json); point model: at "
                f"a directory saved with save_pretrained() or a .gguf file, or give a hub id",
            )
        return "local"
    looks_like_path = spec.startswith((".", "/", "~")) or "\\" in spec or spec.count("/") > 1
    if path.exists():
        probs.add(
            ("model",),
            f"{path} is a file; model: takes a directory saved with save_pretrained(), a .gguf file or a "
            f"hub id",
        )
    elif looks_like_path or not _HUB_MODEL.match(spec) or is_gguf(spec):
        try:
            names = [p.name for p in path.parent.iterdir() if p.is_dir() or is_gguf(p.name)]
        except OSError:
            names = []
        close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
        hint = f"; did you mean '{path.parent / close[0]}'?" if close else ""
        probs.add(("model",), f"model path not found: {path}{hint}")
    return "hub"


def _check_gguf(path: Path, gguf_file: str | None, probs: _Problems) -> str | None:
    """``model:`` as a .gguf file, or a folder holding one: its header read (not dequantised), a file
    that is not GGUF, damaged, or of an architecture transformers cannot load refused. None when ``path``
    is no GGUF model."""
    from nbtrain.control import gguf  # the gguf reader (numpy) only when a .gguf is in play

    try:
        found = gguf.find(path, gguf_file)
        if found is None:
            if gguf_file is not None:
                probs.add(("gguf_file",), f"gguf_file: {gguf_file} is for a Hub repo or a folder of .gguf "
                          f"files; {path} is a model folder with its own config.json")  # fmt: skip
            return None
        gguf.read(found)
    except gguf.GgufProblem as e:
        probs.add(("model",), str(e))
    return "gguf"


def _check_train(train: dict[str, Any], precision: Any, probs: _Problems, objective: str = "sft") -> None:
    for key, value in train.items():
        key = str(key)
        if key in ("bf16", "fp16"):
            if not isinstance(value, bool):
                probs.add(("train", key), f"{value!r} is not valid for {key}: expected true/false")
            elif value and precision not in ("auto", key):
                probs.add(("train", key), f"conflicts with precision: {precision}; set only precision: {key}")
            continue
        if key in ("per_device_train_batch_size", "gradient_checkpointing") and value == "auto":
            continue  # the planner picks the largest micro-batch that fits / checkpointing when needed
        msg = trainargs.check_key(key, objective)
        home = _home_of(key, ("train",), objective) if msg and key not in trainargs.RENAMED else None
        if home is not None:
            msg = elsewhere_message(key, ("train",), home)
        elif msg is None:
            msg = trainargs.check_value(key, value, objective)
        if msg is None and key == "report_to":
            msg = tracking.report_to_problem(value)
        if msg:
            probs.add(("train", key), msg)
        elif isinstance(value, dict | list):  # lr_scheduler_kwargs: {eta_min: .nan}, ...
            for where, bad in trainargs.non_finite(value):
                probs.add(
                    ("train", key, *where), f"{bad!r} is not a number a trainer can use: give a finite number"
                )


def _check_distributed(cfg: RunConfig, base: Path, probs: _Problems) -> dict[str, Any] | None:
    """Combinations that cannot work, rejected before launch. Returns a user DeepSpeed config, if any."""
    d = cfg.distributed
    where = ("distributed",)
    zero = d.strategy in ZERO_STAGES
    if d.offload != "none" and not (zero or d.strategy == "auto"):
        probs.add(
            (*where, "offload"),
            f"offload needs a DeepSpeed ZeRO strategy (zero1, zero2 or zero3), not strategy: {d.strategy}",
        )
    if d.offload == "optimizer+params" and d.strategy not in ("zero3", "auto"):
        probs.add(
            (*where, "offload"),
            "offloading parameters needs strategy: zero3 (ZeRO-1/2 keep every "
            "parameter on each device); use offload: optimizer, or zero3",
        )
    _check_nvme(cfg, base, probs)
    if cfg.method == "qlora" and d.strategy == "zero3":
        probs.add(
            (*where, "strategy"),
            "method: qlora cannot combine with zero3 here: ZeRO-3 partitions "
            "parameters, and bitsandbytes 4-bit weights cannot be partitioned. "
            "Use strategy: ddp or zero2, or method: lora with zero3",
        )
    if cfg.method == "qlora" and d.strategy == "fsdp":
        # FSDP2 can shard 4-bit weights only when bitsandbytes stores them in the compute dtype
        # (bnb_4bit_quant_storage), and bitsandbytes needs a GPU: nothing here could show that it works.
        probs.add(
            (*where, "strategy"),
            "method: qlora with strategy: fsdp is not offered: sharding 4-bit weights needs "
            "bitsandbytes on a GPU, and nbtrain could not test it. Use method: qlora with strategy: "
            "ddp, or method: lora with strategy: fsdp",
        )
    if d.strategy == "none" and isinstance(d.num_processes, int) and d.num_processes > 1:
        probs.add(
            (*where, "num_processes"),
            f"{d.num_processes} processes need a strategy that uses them: ddp, zero1, zero2, zero3 or fsdp",
        )
    if d.launcher == "notebook" and d.nodes > 1:
        probs.add(
            (*where, "launcher"),
            "launcher: notebook runs on this machine only; use torchrun or deepspeed for nodes > 1",
        )
    if d.launcher == "deepspeed" and d.strategy in ("fsdp",):
        probs.add((*where, "launcher"), "fsdp runs under accelerate or torchrun, not the deepspeed launcher")
    if d.nodes > 1 and d.hostfile is None and d.slurm is None:
        probs.add(
            (*where, "nodes"),
            f"nodes: {d.nodes} needs hostfile: PATH (one 'host slots=N' line per "
            f"node) or slurm: {{partition: ...}}",
        )
    if d.hostfile is not None:
        hf = (base / Path(d.hostfile).expanduser()).resolve()
        if not hf.is_file():
            probs.add((*where, "hostfile"), f"hostfile not found: {hf}")
        else:
            try:
                with hf.open(encoding="utf-8", errors="replace") as f:
                    hosts = [ln for ln in f.read(2**20).splitlines() if ln.split("#", 1)[0].strip()]
            except OSError as e:
                probs.add((*where, "hostfile"), f"cannot read the hostfile {hf}: {e.strerror}")
            else:
                if len(hosts) < d.nodes:
                    probs.add(
                        (*where, "nodes"),
                        f"nodes: {d.nodes} but {hf} lists {len(hosts)} host(s); list one 'host slots=N' "
                        f"line per node, or lower nodes",
                    )
    user_ds: dict[str, Any] | None = None
    if d.deepspeed_config is not None:
        if d.strategy not in ("auto", *ZERO_STAGES):
            probs.add(
                (*where, "deepspeed_config"),
                f"a DeepSpeed config needs strategy zero1/zero2/zero3 or auto, not {d.strategy}",
            )
        path = (base / Path(d.deepspeed_config).expanduser()).resolve()
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            probs.add((*where, "deepspeed_config"), f"DeepSpeed config not found: {path}")
        except (OSError, ValueError) as e:
            probs.add((*where, "deepspeed_config"), f"{path.name} is not valid JSON: {e}")
        else:
            problem = deepspeed_config_problem(loaded)
            if problem:
                probs.add((*where, "deepspeed_config"), f"{path.name}: {problem}")
            else:
                user_ds = loaded
                stage = loaded.get("zero_optimization", {}).get("stage", 0)
                if d.strategy in ZERO_STAGES and ZERO_STAGES[d.strategy] != stage:
                    probs.add(
                        (*where, "strategy"),
                        f"strategy {d.strategy} but {path.name} has ZeRO "
                        f"stage {stage}; make them agree or use strategy: auto",
                    )
    return user_ds


def _check_nvme(cfg: RunConfig, base: Path, probs: _Problems) -> None:
    """offload: nvme (DeepSpeed ZeRO-Infinity) needs ZeRO-3, a folder for its swap files on a filesystem
    that takes O_DIRECT (DeepSpeed's async I/O opens them so), and the async_io op (libaio)."""
    d, where = cfg.distributed, ("distributed",)
    if d.offload != "nvme":
        if d.nvme_path is not None:
            probs.add((*where, "nvme_path"), "nvme_path is used only with offload: nvme; add offload: nvme "
                                             "(strategy: zero3) or remove nvme_path")  # fmt: skip
        return
    if d.strategy in ("zero1", "zero2"):
        probs.add((*where, "offload"), "offload: nvme swaps parameters and optimizer state to disk, which "
                                       "needs strategy: zero3 (or auto)")  # fmt: skip
    if cfg.method == "qlora":
        probs.add((*where, "offload"), "offload: nvme needs ZeRO-3, which cannot partition bitsandbytes' "
                                       "4-bit weights; use method: lora or full")  # fmt: skip
    if d.nvme_path is None:
        probs.add((*where, "offload"), "offload: nvme needs nvme_path: a folder on a fast local disk "
                                       "(NVMe SSD) for the swap files, under distributed:")  # fmt: skip
        return
    problem = nvme_path_problem((base / Path(d.nvme_path).expanduser()).resolve())
    if problem is None:
        problem = async_io_problem(tuple(sys.path))
    if problem is not None:
        probs.add((*where, "nvme_path"), problem)


def nvme_path_problem(path: Path) -> str | None:
    """Why ZeRO-Infinity cannot swap to files in ``path``, or None: it must be a folder this user can write,
    on a filesystem that opens files with O_DIRECT, as DeepSpeed's async I/O does (its aio common code)."""
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        return f"nvme_path {path} {what}: create it on a fast local disk (mkdir -p {path}) or give another"
    try:
        fd, name = tempfile.mkstemp(prefix=".nbtrain-nvme-", dir=path)
    except OSError as e:
        return f"nvme_path {path} is not writable ({e.strerror}): give a folder you can write"
    os.close(fd)
    try:
        os.close(os.open(name, os.O_WRONLY | getattr(os, "O_DIRECT", 0)))
    except OSError as e:
        return (
            f"nvme_path {path}: its filesystem refuses O_DIRECT ({e.strerror}), which DeepSpeed's async I/O "
            f"opens the swap files with (tmpfs before Linux 6.6 does); give a folder on a local disk (ext4)"
        )
    finally:
        os.unlink(name)
    return None


@lru_cache(maxsize=4)
def async_io_problem(sys_path: tuple[str, ...]) -> str | None:
    """Why DeepSpeed's async_io op (ZeRO-Infinity's disk I/O) cannot build here, or None. Asked of
    DeepSpeed itself (``AsyncIOBuilder().is_compatible()``: libaio's header and library link) in a
    subprocess: the kernel never imports torch."""
    del sys_path  # part of the cache key only
    if importlib.util.find_spec("deepspeed") is None:
        return "offload: nvme needs DeepSpeed (`pip install deepspeed`)"
    code = "from deepspeed.ops.op_builder import AsyncIOBuilder; print(AsyncIOBuilder().is_compatible())"
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    if probe.returncode == 0 and probe.stdout.strip().endswith("True"):
        return None
    return (
        "DeepSpeed's async_io op cannot build here: it needs libaio's header and library (Debian/Ubuntu: "
        "apt-get install libaio-dev; Fedora: dnf install libaio-devel). Install it, or use offload: "
        "optimizer+params (CPU RAM)"
    )


def deepspeed_config_problem(ds: Any) -> str | None:
    if not isinstance(ds, dict):
        return "a DeepSpeed config is a JSON object"
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return "zero_optimization must be an object"
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        return f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}"
    for key in ("offload_optimizer", "offload_param"):
        sub = zero.get(key)
        ok = isinstance(sub, dict) and sub.get("device") in ("cpu", "nvme", "none")
        if sub is not None and not ok:
            return f"zero_optimization.{key}.device must be cpu, nvme or none"
    if zero.get("offload_param") and zero["offload_param"].get("device") not in (None, "none") and stage != 3:
        return "offload_param needs zero_optimization.stage 3"
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        v = ds.get(key)
        if v is not None and v != "auto" and not (isinstance(v, int) and v > 0):
            return f'{key} must be a positive integer or "auto", got {v!r}'
    return None


def unavailable_objective(name: str) -> str:
    """Why ``objective: name`` cannot run with the installed TRL."""
    try:
        from importlib.metadata import version

        trl_version = version("trl")
    except Exception:  # noqa: BLE001 - the version only decorates the message
        trl_version = "1.x"
    return f"objective: {name} is not available in TRL {trl_version}: {UNAVAILABLE[name]}"


def _objective_sections(cfg: RunConfig, probs: _Problems) -> None:
    """Combinations of objective, data format, rewards and train: keys that TRL would reject later."""
    obj = cfg.objective
    if obj not in OBJECTIVES:
        return  # reported as unavailable already
    fmt = cfg.data.format
    if fmt != "auto" and fmt not in OBJECTIVES[obj].formats:
        kind = "SFT data" if fmt in SFT_FORMATS else f"{fmt} data"
        usable = ", ".join(OBJECTIVES[obj].formats)
        probs.add(
            ("data", "format"),
            f"format: {fmt} is {kind}, which objective: {obj} does not train on; use format: auto or "
            f"{usable}",
        )
    online = rewards_objectives()
    if obj in online and not cfg.rewards:
        probs.add(
            ("objective",),
            f"objective: {obj} learns from rewards: add rewards: [my_reward] naming a function defined in "
            "the notebook (def my_reward(completions, **kwargs) -> list[float]), a built-in "
            "(format_reward, length_reward), or a reward model: rewards: [{model: <an objective: reward "
            "run's id or folder>}]",
        )
    if obj not in online and cfg.rewards:
        if obj == "reward":
            why = (
                "a reward model learns from the chosen/rejected pairs themselves; once it is trained, "
                "name its run in a grpo or rloo run: rewards: [{model: <this run's id>}]"
            )
        else:
            why = f"objective is {obj}"
        probs.add(("rewards",), f"rewards: applies to objective: {' or '.join(online)} only ({why})")
    if obj in online and cfg.rewards:
        weights = cfg.train.get("reward_weights")
        if isinstance(weights, list) and len(weights) != len(cfg.rewards):
            probs.add(
                ("train", "reward_weights"),
                f"{len(weights)} reward_weights for {len(cfg.rewards)} rewards; give one weight per reward",
            )
        gens = cfg.train.get("num_generations")
        if isinstance(gens, int) and not isinstance(gens, bool) and gens < 2:
            probs.add(
                ("train", "num_generations"),
                f"{obj.upper()} compares completions of a prompt: num_generations >= 2",
            )


def _reward_models(cfg: RunConfig, base: Path, probs: _Problems) -> list[str | RewardModelRef] | None:
    """``rewards:`` with each ``{model: ...}`` resolved to what the worker loads (a run's or a folder's
    absolute directory, or a Hub id); a reference that cannot be used is a problem naming the fix."""
    if not cfg.rewards or cfg.objective not in rewards_objectives():
        return cfg.rewards
    out: list[str | RewardModelRef] = []
    for i, entry in enumerate(cfg.rewards):
        if isinstance(entry, RewardModelRef):
            source, problem = rewardmodels.resolve(entry.model, base)
            if problem is not None:
                probs.add(("rewards", i, "model"), problem)
            entry = RewardModelRef(model=source or entry.model)
        out.append(entry)
    return out


def _hooks_sections(cfg: RunConfig, probs: _Problems) -> None:
    """``hooks:`` against the objective, the data and the launcher (the names themselves are looked up in
    the notebook by prepare, nbtrain.contract.hooks)."""
    h = cfg.hooks
    if h is None:
        return
    obj = cfg.objective
    if h.loss is not None and obj != "sft":
        probs.add(
            ("hooks", "loss"),
            f"hooks: loss applies to objective: sft (TRL's {obj} trainer computes its objective's own loss); "
            f"remove it, or use objective: sft",
        )
    if h.loss is not None and cfg.train.get("loss_type") == "dft":
        probs.add(("hooks", "loss"), "hooks: loss replaces the loss, as train: loss_type: dft does; give one")
    if h.compute_metrics is not None:
        if obj == "grpo":
            probs.add(
                ("hooks", "compute_metrics"),
                "hooks: compute_metrics runs in the trainer's evaluation, which TRL's GRPO trainer does not "
                "have; score completions with rewards: instead",
            )
        elif cfg.data.eval is None and cfg.data.eval_split is None:
            probs.add(
                ("hooks", "compute_metrics"),
                "hooks: compute_metrics runs when the model is evaluated, and this run has no eval data: add "
                "data: eval_split: 0.1 (a share of the training rows) or data: eval: FILE",
            )
    if h.preprocess_logits_for_metrics is not None and h.compute_metrics is None:
        probs.add(
            ("hooks", "preprocess_logits_for_metrics"),
            "hooks: preprocess_logits_for_metrics prepares the logits for compute_metrics; add "
            "compute_metrics, or remove it",
        )
    if cfg.distributed.launcher == "notebook" and any(v is not None for v in h.model_dump().values()):
        probs.add(
            ("hooks",),
            "hooks: run inside nbtrain's training worker, and launcher: notebook runs a training function "
            "of yours instead (nbtrain.launch_function): call your functions from that function, or remove "
            "launcher: notebook",
        )


def planned_problems(res: Resolved, args: dict[str, Any], world_size: int) -> None:
    """Checks that need the plan: the number of processes and the batch sizes (the planner may choose
    them). Raises ConfigError; called by prepare() before anything starts."""
    cfg = res.config
    if cfg.objective not in OBJECTIVES:
        return
    defaults = trainargs.fields_for(cfg.objective)

    def value(key: str) -> Any:
        """As the TRL config will see it: the planned args, else the config's default."""
        return args[key] if key in args else (defaults[key].default if key in defaults else None)

    items: list[tuple[tuple[str | int, ...], str]] = []
    bs = value("per_device_train_batch_size")
    if cfg.objective == "kto" and value("loss_type") == "kto" and isinstance(bs, int) and bs <= 1:
        items.append(
            (
                ("train", "per_device_train_batch_size"),
                "KTO estimates its KL term from the other completions in a batch, so it needs "
                "per_device_train_batch_size of 2 or more",
            )
        )
    if cfg.objective in rewards_objectives():  # GRPO and RLOO sample groups of completions alike
        items += _grpo_batch_problems(cfg, value, world_size)
    if items:
        raise problems_error(res.text, items)


def _grpo_batch_problems(
    cfg: RunConfig, value: Callable[[str], Any], world_size: int
) -> list[tuple[tuple[str | int, ...], str]]:
    # GRPO samples num_generations completions per prompt, and each generation batch holds whole groups.
    gens, bs = value("num_generations"), value("per_device_train_batch_size")
    steps = value("steps_per_generation") or value("gradient_accumulation_steps")
    items: list[tuple[tuple[str | int, ...], str]] = []
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (gens, bs, steps)) or gens < 2:
        return items  # reported by load_config, or by TRL's own check at start
    given = value("generation_batch_size")
    batch = given if isinstance(given, int) else bs * world_size * steps
    if batch % gens:
        how = (
            "generation_batch_size"
            if isinstance(given, int)
            else f"per_device_train_batch_size {bs} x {world_size} process(es) x steps_per_generation {steps}"
        )
        where = "num_generations" if "num_generations" in cfg.train else "per_device_train_batch_size"
        items.append(
            (
                ("train", where),
                f"the generation batch ({batch} = {how}) must be a multiple of num_generations ({gens}): "
                f"each prompt's {gens} completions are compared with each other",
            )
        )
    eval_bs, eval_gens = value("per_device_eval_batch_size"), value("num_generations_eval") or gens
    if (
        value("eval_strategy") not in (None, "no")
        and isinstance(eval_bs, int)
        and (eval_bs * world_size) % eval_gens
    ):
        where = (
            "per_device_eval_batch_size" if "per_device_eval_batch_size" in cfg.train else "num_generations"
        )
        items.append(
            (
                ("train", where),
                f"evaluation samples {eval_gens} completions per prompt: per_device_eval_batch_size x "
                f"processes ({eval_bs * world_size}) must be a multiple of {eval_gens}",
            )
        )
    return items


def _method_sections(cfg: RunConfig, probs: _Problems) -> None:
    has_eval = cfg.data.eval is not None or cfg.data.eval_split is not None
    # (a value that is not a strategy, eval_strategy: step, has its own problem and only that one)
    if cfg.train.get("eval_strategy", "no") in ("steps", "epoch") and not has_eval:
        probs.add(
            ("train", "eval_strategy"),
            "evaluation needs eval data: add data: eval_split: 0.1 or data: eval: PATH",
        )
    if cfg.method == "full" and cfg.lora is not None:
        probs.add(
            ("lora",),
            "method: full trains every weight and takes no lora: section; remove it, or use method: lora",
        )
    if cfg.method not in ("qlora", "auto") and cfg.quantization is not None:
        probs.add(("quantization",), f"quantization: applies to method: qlora only (method is {cfg.method})")
    if cfg.lora is not None:
        _lora_fields(cfg, dict(cfg.lora.model_extra or {}), probs)


def _lora_fields(cfg: RunConfig, extra: dict[str, Any], probs: _Problems) -> None:
    """lora:'s peft fields and LoRA+: known to peft, of the right type, and usable in this run."""
    for key, value in extra.items():
        msg = trainargs.check_lora_key(key)
        home = _home_of(key, ("lora",), cfg.objective) if msg and msg.startswith("unknown") else None
        if home is not None:  # learning_rate in lora: belongs under train:
            msg = elsewhere_message(key, ("lora",), home)
        msg = msg or trainargs.check_lora_value(key, value)
        if msg:
            probs.add(("lora", key), msg)
    init = extra.get("init_lora_weights")
    if converts_init(init):
        single = cfg.distributed.strategy in ("auto", "none") and cfg.distributed.num_processes in ("auto", 1)
        why = (
            "reads the full-precision base weights (use method: lora)" if cfg.method == "qlora"
            else f"is supported for objective: sft (this run is {cfg.objective})" if cfg.objective != "sft"
            else "is supported on one process (its result is converted to a plain LoRA as it is saved)"
            if not single or cfg.distributed.nodes > 1 else None
        )  # fmt: skip
        if why:
            probs.add(("lora", "init_lora_weights"), f"init_lora_weights: {init} {why}")
    if "loraplus_lr_ratio" in extra and cfg.objective != "sft":
        probs.add(("lora", "loraplus_lr_ratio"), (
            f"loraplus_lr_ratio is supported for objective: sft (the {cfg.objective} trainer attaches the "
            f"adapter itself, after the optimizer would have to know its matrices)"
        ))  # fmt: skip


def _data_sections(cfg: RunConfig, probs: _Problems) -> None:
    d = cfg.data
    if not d.streaming:
        return
    steps = cfg.train.get("max_steps")
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps > 0):
        probs.add(
            ("data", "streaming"),
            "streaming: true reads the data as it trains, so its length is unknown and epochs cannot be "
            "counted: set train: max_steps: N (the number of optimizer steps to run)",
        )
    if isinstance(d.eval_split, float):
        probs.add(
            ("data", "eval_split"),
            f"eval_split: {d.eval_split} is a fraction, but a streamed dataset has no known length: give a "
            f"number of rows (eval_split: 200 holds out the first 200) or eval: PATH",
        )


def _preprocess_hook(raw: dict[str, Any], namespace: Mapping[str, Any] | None) -> RowHook | None:
    """``hooks: preprocess`` for the kernel's look at the rows: the notebook's function when ``namespace``
    has it (a missing one is reported by prepare, which captures the hooks), else None in ``fn``."""
    hooks = raw.get("hooks")
    name = hooks.get("preprocess") if isinstance(hooks, dict) else None
    if not isinstance(name, str) or not name:
        return None
    fn = namespace.get(name) if namespace is not None else None
    return RowHook(fn if callable(fn) else None, f"hooks: preprocess ({name})")


def _check_sources(
    data: dict[str, Any],
    fmt: str,
    columns: dict[str, str] | None,
    base: Path,
    objective: str,
    probs: _Problems,
    hook: RowHook | None = None,
) -> list[DataSource]:
    """Inspect every ``data: train:`` source (a string or a list of them) with its own format and
    column mapping (after ``hooks: preprocess``); sources that cannot be mixed (conversations with plain
    text, ...) are a problem."""
    train = data.get("train")
    if isinstance(train, str) and train:
        dataset = data.get("dataset")
        try:
            if isinstance(dataset, str) and dataset:
                return [_inspect_info(train, dataset, fmt, base, objective, columns, hook)]
            return [inspect_data(train, fmt, base, objective, columns, preprocess=hook)]
        except DataProblem as e:
            probs.add(("data", "dataset" if isinstance(dataset, str) and dataset else "train"), str(e))
            return []
    if not isinstance(train, list):
        return []
    out: list[DataSource] = []
    for i, item in enumerate(train):
        try:
            spec = DataSourceSettings.model_validate(item)
        except ValidationError:
            continue  # reported by the schema pass
        src_fmt = spec.format or fmt
        try:
            if spec.dataset is not None:
                src = _inspect_info(
                    spec.path, spec.dataset, src_fmt, base, objective, spec.columns or columns, hook
                )
                out.append(replace(src, weight=spec.weight))
                continue
            src = inspect_data(
                spec.path, src_fmt, base, objective, spec.columns or columns, split=spec.split,
                data_files=spec.data_files, preprocess=hook,
            )  # fmt: skip
        except DataProblem as e:
            probs.add(("data", "train", i, "dataset" if spec.dataset else "path"), str(e))
            continue
        out.append(replace(src, weight=spec.weight, split=spec.split, columns=spec.columns))
    if len(out) != len(train):
        return out
    kinds: dict[str, list[str]] = {}
    for src in out:
        if src.format == "auto":
            continue  # a hub dataset: checked in the worker
        kind = src.format
        if objective == "sft":
            kind = "plain text" if src.format == "text" else "conversations"
        kinds.setdefault(kind, []).append(Path(src.spec).name)
    if len(kinds) > 1:
        parts = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in kinds.items())
        probs.add(
            ("data", "train"),
            f"these sources cannot be mixed, the trainer takes one kind of row ({parts}); convert them to "
            f"one format or train on them in separate runs",
        )
    return out


def _inspect_info(
    spec: str,
    name: str,
    fmt: str,
    base: Path,
    objective: str,
    columns: dict[str, str] | None,
    hook: RowHook | None,
) -> DataSource:
    """The dataset ``name`` of the LLaMA-Factory dataset_info.json ``spec`` names, inspected like any
    source, with its resolved facts (file or Hub id, split, columns in nbtrain's names, tags) recorded in
    the DataSource the worker reads. ``columns`` (data: columns:) win over the entry's, name by name."""
    try:
        entry = datasetinfo.resolve(spec, name, base)
    except datasetinfo.InfoProblem as e:
        raise DataProblem(str(e)) from None
    merged = {**(entry.columns or {}), **(columns or {})} or None
    if merged is not None:
        problem = _columns_problem(merged)
        if problem:
            raise DataProblem(f"{entry.info}: {name!r} with data: columns: {problem}")
    src = inspect_data(
        entry.spec, fmt, base, objective, merged, split=entry.split, preprocess=hook, tags=entry.tags
    )
    return replace(
        src, spec=f"{name} ({entry.info})", split=entry.split, columns=merged, tags=entry.tags,
        dataset=name, dataset_info=entry.info,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- entry


def problems_error(text: str, items: list[tuple[tuple[str | int, ...], str]]) -> ConfigError:
    """A ConfigError for problems found after load_config (the notebook's reward functions), pointing
    at the YAML lines of ``text`` as load_config's own problems do."""
    probs = _Problems(text)
    for path, message in items:
        probs.add(path, message)
    return ConfigError(sorted(probs.items, key=lambda p: (p.line or 0, p.path)))


def parse_source(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any] | Any, str, Path]:
    """Return (raw object, YAML text, base dir for relative paths). Raises ConfigError on bad YAML."""
    base = Path.cwd()
    if isinstance(source, dict):
        return source, yaml.safe_dump(source, sort_keys=False), base
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.strip().endswith((".yaml", ".yml"))
    ):
        p = Path(source).expanduser()
        if not p.is_file():
            raise ConfigError([Problem("", f"config file not found: {p.resolve()}")])
        with p.open(encoding="utf-8") as f:
            text = f.read(MAX_YAML_BYTES + 1)  # a longer file is refused by load_yaml, not read whole
    else:
        text = str(source)
    try:
        raw = load_yaml(text)  # yaml.safe_load, with the size and alias expansion bounded
    except YamlProblem as e:
        lines = text.splitlines()

        def source_of(line: int | None) -> str | None:
            return lines[line - 1] if line and line <= len(lines) else None

        if isinstance(e, DuplicateKeys):
            raise ConfigError(
                [
                    Problem(".".join(d.path), d.message(), d.again, source_of(d.again), d.column)
                    for d in e.found
                ]
            ) from None
        what = "YAML syntax error" if isinstance(e, YamlSyntax) else "config refused"
        raise ConfigError([Problem("", f"{what}: {e}", e.line, source_of(e.line), e.column)]) from None
    return raw, text, base


class ConfigRules(Protocol):
    """Rules applied to a config as it is read: a lab preset (nbtrain.control.config.preset.Preset) is one.
    Typed here so that the schema does not import the preset (which sits beside it, not below it)."""

    def fill(self, raw: Mapping[Any, Any]) -> dict[Any, Any]: ...

    def config_problems(
        self, raw: Mapping[Any, Any], base: Path
    ) -> list[tuple[tuple[str | int, ...], str]]: ...


def _chat_template(raw: dict[str, Any], base: Path, probs: _Problems) -> dict[str, Any]:
    """``chat_template:`` (a built-in's name, contract/chat_templates, or a Jinja file) as TRL's
    ``train: chat_template_path``, the file's absolute path; the config without the key."""
    from nbtrain.contract.chat_templates import BUILTIN, builtin_template

    if "chat_template" not in raw:
        return raw
    raw = dict(raw)
    value = raw.pop("chat_template")
    names = ", ".join(BUILTIN)
    if not isinstance(value, str) or not value.strip():
        probs.add(("chat_template",), f"chat_template: names a built-in template ({names}) or a Jinja file")
        return raw
    given = raw.get("train")
    train: dict[str, Any] = given if isinstance(given, dict) else {}
    if train.get("chat_template_path"):
        probs.add(
            ("chat_template",),
            "chat_template: and train: chat_template_path both set the chat template; keep one",
        )
        return raw
    path = builtin_template(value)
    if path is None:
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file() or path.suffix not in (".jinja", ".j2"):
            probs.add(
                ("chat_template",),
                f"chat_template: {value!r} is neither a built-in template ({names}) nor a Jinja template "
                f"file (.jinja or .j2; looked for {path})",
            )
            return raw
    raw["train"] = {**train, "chat_template_path": str(path.resolve())}
    return raw


def load_config(
    source: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    preset: ConfigRules | None = None,
    namespace: Mapping[str, Any] | None = None,
) -> Resolved:
    """Validate a config and everything it points at; raise ConfigError listing every problem.

    With a lab ``preset`` (nbtrain.control.config.preset), what it fixes and the config leaves out is
    filled in first, and its violations are reported with the other problems. ``namespace``: the
    notebook's, where ``hooks: preprocess`` is found to look at the rows as the worker will format them
    (without it, their format is left to the worker)."""
    raw, text, base = parse_source(source)
    probs = _Problems(text)
    if raw is None:
        raise ConfigError([Problem("", "the config is empty; it needs at least model: and data: train:")])
    if not isinstance(raw, dict):
        raise ConfigError(
            [
                Problem(
                    "", f"the config must be a mapping of keys (model:, data:, ...), got {type(raw).__name__}"
                )
            ]
        )
    _secret_problems(raw, probs)
    raw = _chat_template(raw, base, probs)
    if name is not None:
        raw = {**raw, "name": name}
    preset_items: list[tuple[tuple[str | int, ...], str]] = []
    if preset is not None:
        raw = preset.fill(raw)
        preset_items = preset.config_problems(raw, base)  # listed after the config's own problems
    cfg: RunConfig | None = None
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        _schema_problems(e, raw, probs)

    # The checks below look at the world. They run on whatever parts parsed, so one pass reports
    # every problem it can, not only the schema's.
    model = raw.get("model")
    model_kind = (
        _check_model(model, base, probs, raw.get("gguf_file"))
        if isinstance(model, str) and model
        else "local"
    )
    objective = raw.get("objective", "sft")
    if isinstance(objective, str) and objective in UNAVAILABLE:
        probs.add(("objective",), unavailable_objective(objective))
    # train: keys are checked against the objective's TRL config; an unknown or unavailable objective
    # has none, and is reported on its own.
    known_objective = objective if isinstance(objective, str) and objective in OBJECTIVES else None
    train = raw.get("train")
    if isinstance(train, dict) and known_objective is not None:
        _check_train(train, raw.get("precision", "auto"), probs, known_objective)
    user_ds: dict[str, Any] | None = None
    reward_list: list[str | RewardModelRef] | None = None
    if cfg is not None:
        _method_sections(cfg, probs)
        _data_sections(cfg, probs)
        _objective_sections(cfg, probs)
        reward_list = _reward_models(cfg, base, probs)
        _hooks_sections(cfg, probs)
        user_ds = _check_distributed(cfg, base, probs)
    data: dict[str, Any] = raw["data"] if isinstance(raw.get("data"), dict) else {}
    fmt = data.get("format", "auto")
    fmt = fmt if fmt in ("auto", *FORMATS) else "auto"
    # Rows are checked after data: columns: renames them; with a broken mapping (reported already)
    # every row would look wrong, so they wait until it is fixed.
    columns: dict[str, str] | None = None
    try:
        columns = DataSettings.model_validate({"train": "-", "columns": data.get("columns")}).columns
        columns_ok = True
    except ValidationError:
        columns_ok = False
    sources: dict[str, DataSource] = {}
    train_sources: list[DataSource] = []
    if known_objective is not None and columns_ok:
        hook = _preprocess_hook(raw, namespace)
        train_sources = _check_sources(data, fmt, columns, base, known_objective, probs, hook)
        if isinstance(data.get("eval"), str) and data["eval"]:
            try:
                sources["eval"] = inspect_data(
                    data["eval"], fmt, base, known_objective, columns, preprocess=hook
                )
            except DataProblem as e:
                probs.add(("data", "eval"), str(e))
    flags = flags_problem([*train_sources, *sources.values()], train if isinstance(train, dict) else None)
    if flags:
        probs.add(("train", "assistant_only_loss"), flags)
    if (
        data.get("mask_history") is True
        and isinstance(train, dict)
        and train.get("assistant_only_loss") is False
    ):
        probs.add(
            ("data", "mask_history"),
            "mask_history trains each conversation's last assistant turn only, and train: says "
            "assistant_only_loss: false (every token); keep one of the two",
        )
    if data.get("mask_history") is True and known_objective not in (None, "sft"):
        probs.add(
            ("data", "mask_history"),
            f"mask_history is for SFT conversations, not objective: {known_objective}",
        )
    with_tools = [Path(s.location).name for s in [*train_sources, *sources.values()] if s.tools]
    if with_tools and isinstance(raw.get("model"), str):
        from nbtrain.control.config.chat_template import tools_problem  # jinja2: only for tool rows

        why = tools_problem(with_tools, raw["model"], train if isinstance(train, dict) else None)
        if why:
            probs.add(("model",), why)
    if raw.get("method") == "qlora":
        why = bitsandbytes_problem(tuple(sys.path))
        if why:
            probs.add(("method",), f"method: qlora needs bitsandbytes: {why}")
    for path, message in preset_items:
        probs.add(path, message)
    if probs.items or cfg is None:
        raise ConfigError(sorted(probs.items, key=lambda p: (p.line or 0, p.path)))
    train_src, eval_src = train_sources[0], sources.get("eval")

    # Fill defaults that depend on the method, and make paths absolute for the worker.
    updates: dict[str, Any] = {}
    if cfg.method in ("lora", "qlora", "auto") and cfg.lora is None:
        updates["lora"] = LoraSettings.model_validate({})
    if cfg.method in ("qlora", "auto") and cfg.quantization is None:
        updates["quantization"] = QuantSettings.model_validate({})
    if model_kind == "local":
        updates["model"] = str((base / Path(cfg.model).expanduser()).resolve())
    elif model_kind == "gguf":  # the file itself (a folder holding one names it)
        from nbtrain.control import gguf

        found = gguf.find((base / Path(cfg.model).expanduser()).resolve(), cfg.gguf_file)
        updates["model"], updates["gguf_file"] = str(found), None
    if reward_list is not None:
        updates["rewards"] = reward_list  # {model: ...} as the worker loads it: a directory or a Hub id
    # A dataset of a dataset_info.json keeps the json as its path (a resume resolves it again); the file or
    # Hub id it names is in the source the worker reads.
    data_updates: dict[str, Any] = {"train": train_src.dataset_info or train_src.location}
    if isinstance(cfg.data.train, list):
        data_updates["train"] = [
            s.model_copy(update={"path": src.dataset_info or src.location})
            for s, src in zip(cfg.data.train, train_sources, strict=True)
        ]
    if eval_src is not None:
        data_updates["eval"] = eval_src.location
    updates["data"] = cfg.data.model_copy(update=data_updates)
    cfg = cfg.model_copy(update=updates)
    dist_updates: dict[str, Any] = {}
    for key in ("hostfile", "deepspeed_config", "nvme_path"):
        value = getattr(cfg.distributed, key)
        if value is not None:
            dist_updates[key] = str((base / Path(value).expanduser()).resolve())
    if dist_updates:
        cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update=dist_updates)})
    notes = [
        f"data: {train_src.kind} file, format {train_src.format}"
        + (" (detected)" if cfg.data.format == "auto" and train_src.kind != "hub" else "")
        + (f", dataset {train_src.dataset!r} of {train_src.dataset_info}" if train_src.dataset else "")
    ]
    if len(train_sources) > 1:
        how = (
            f"mixed by weight ({cfg.data.stopping_strategy})"
            if train_sources[0].weight is not None
            else "concatenated"
        )
        notes[0] = f"data: {len(train_sources)} sources {how}: " + ", ".join(
            f"{Path(s.spec).name} [{s.kind}, {s.format}" + (f", weight {s.weight:g}]" if s.weight else "]")
            for s in train_sources
        )
    if cfg.data.streaming:
        notes.append(f"data: streaming (an IterableDataset; {cfg.train['max_steps']} steps)")
    if cfg.objective != "sft":
        notes.append(f"objective: {cfg.objective} ({OBJECTIVES[cfg.objective].summary})")
    return Resolved(cfg, text, model_kind, train_src, eval_src, notes, user_ds, train_sources)
