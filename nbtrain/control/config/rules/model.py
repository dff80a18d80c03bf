"""model: a local folder, a Hub id or a GGUF file; LoRA's target modules among the model's."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from nbtrain.contract.ggufcache import is_gguf
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.schema import RunConfig

HUB_MODEL = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?\Z")  # org/name, or a bare name


def check_model(spec: str, facts: Facts, probs: Problems, gguf_file: Any = None) -> str:
    """Where ``model:`` points: "local" (a folder, or a GGUF model: "gguf") or "hub"; what is wrong with it
    added to ``probs``."""
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
        path = facts.path(spec)
    except RuntimeError:  # "~name" of a user this machine does not know
        probs.add(("model",), f"{spec!r}: no home folder is known for that user here; write the full path")
        return "local"
    if facts.kind(path) != "missing":
        kind = check_gguf(path, gguf_name, facts, probs)
        if kind is not None:
            return kind
    if facts.kind(path) == "dir":
        if not facts.has_model_config(path):
            probs.add(
                ("model",),
                f"{path} is not a model directory (no config.json); point model: at "
                f"a directory saved with save_pretrained() or a .gguf file, or give a hub id",
            )
        return "local"
    looks_like_path = spec.startswith((".", "/", "~")) or "\\" in spec or spec.count("/") > 1
    if facts.kind(path) == "file":
        probs.add(
            ("model",),
            f"{path} is a file; model: takes a directory saved with save_pretrained(), a .gguf file or a "
            f"hub id",
        )
    elif looks_like_path or not HUB_MODEL.match(spec) or is_gguf(spec):
        close = difflib.get_close_matches(path.name, facts.neighbours(path), n=1, cutoff=0.6)
        # the suggestion as the config writes the path (./models/x stays relative); where it looked, in full
        written = spec.rstrip("/")
        head = written[: len(written) - len(path.name)] if written.endswith(path.name) else None
        hint = ""
        if close:
            hint = f"; did you mean '{head + close[0] if head is not None else path.parent / close[0]}'?"
        probs.add(("model",), f"model path not found: {path}{hint}")
    return "hub"


def check_gguf(path: Path, gguf_file: str | None, facts: Facts, probs: Problems) -> str | None:
    """``model:`` as a .gguf file, or a folder holding one: a file that is not GGUF, damaged, or of an
    architecture transformers cannot load refused (its header, read by ``facts``). None when ``path`` is
    no GGUF model."""
    found = facts.gguf(path, gguf_file)
    if found.problem is not None:
        probs.add(("model",), found.problem)
        return "gguf"
    if found.found is None:
        if gguf_file is not None:
            probs.add(("gguf_file",), f"gguf_file: {gguf_file} is for a Hub repo or a folder of .gguf "
                      f"files; {path} is a model folder with its own config.json")  # fmt: skip
        return None
    return "gguf"


def lora_targets_problem(names: set[str], targets: list[str]) -> str | None:
    """Which of LoRA's ``target_modules`` (a list: each matches a module named so, or ending in '.' + it,
    as peft matches them) the model has no module for, with the names it does have."""
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if not missing:
        return None
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names if not n.rsplit(".", 1)[-1].isdigit()})
    hints = []
    for t in missing:
        close = difflib.get_close_matches(t, leaves, n=1, cutoff=0.6)
        hints.append(f"'{t}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    shown = ", ".join(leaves[:20]) + (", ..." if len(leaves) > 20 else "")
    return (
        f"the model has no module named {', '.join(hints)}: peft would fail after the run started. Its "
        f"modules with weights are named: {shown}; or use target_modules: auto | all-linear"
    )


def lora_layers_problem(model_config: dict[str, Any], layers: int | list[Any]) -> str | None:
    """Which of LoRA's ``layers_to_transform`` (a layer's index or a list of them, as peft takes it) the model
    has no layer for: its layers are its config.json's ``num_hidden_layers``, its text_config's for a
    vision-language model (where the adapters go). None when every index is one, or the count is not said."""
    text = model_config.get("text_config")
    count, said = model_config.get("num_hidden_layers"), "num_hidden_layers"
    if isinstance(text, dict) and "num_hidden_layers" in text:
        count, said = text["num_hidden_layers"], "text_config: num_hidden_layers"
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return None
    given = layers if isinstance(layers, list) else [layers]
    bad = [x for x in given if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < count]
    if given and not bad:
        return None
    valid = f"from 0 to {count - 1}" if count > 1 else "0"
    what = f"{', '.join(repr(x) for x in bad)} {'is not a layer' if len(bad) == 1 else 'are not layers'} of"
    return (
        f"layers_to_transform: {what if bad else 'lists no layer of'} this model: it has {count} (its "
        f"config.json's {said}), numbered {valid}; peft would fail after the run started. Give layer "
        f"indexes {valid}, or leave layers_to_transform out to adapt every layer"
    )


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_init_from(cfg: RunConfig, facts: Facts, probs: Problems) -> Path | None:
    """``init_from:``: a folder holding what this run's method starts from (a LoRA adapter of the same shape,
    or a model), for an SFT run; the folder, absolute, or None (unset, or wrong: said in ``probs``)."""
    if cfg.init_from is None:
        return None
    key = ("init_from",)
    try:
        path = facts.path(cfg.init_from)
    except RuntimeError:
        probs.add(key, f"{cfg.init_from!r}: no home folder is known for that user here; write the full path")
        return None
    if cfg.objective != "sft":
        probs.add(key, f"init_from starts SFT runs only, not objective: {cfg.objective}; leave it out")
        return None
    if facts.kind(path) != "dir":
        probs.add(
            key, f"{path} is not a folder: give a run's checkpoint (RUN/checkpoints/checkpoint-N) or output"
        )
        return None
    if cfg.method == "full":
        if not facts.has_model_config(path):
            probs.add(
                key, f"{path} holds no model (config.json): method: full starts from a full run's weights"
            )
            return None
        return path
    missing = [f for f in ADAPTER_FILES if facts.kind(path / f) != "file"]
    if missing:
        probs.add(key, f"{path} holds no LoRA adapter ({', '.join(missing)} missing): method: {cfg.method} "
                       "starts from a LoRA run's checkpoint or output")  # fmt: skip
        return None
    try:
        adapter = json.loads(facts.text(path / "adapter_config.json"))
    except (OSError, ValueError):
        adapter = None
    if cfg.lora is not None and isinstance(adapter, dict) and adapter.get("r") != cfg.lora.r:
        r = adapter.get("r")
        probs.add(key, f"{path}'s adapter has r={r} and this run's lora: r is {cfg.lora.r}: give the same r "
                       "(the adapter's weights are its shape)")  # fmt: skip
        return None
    return path
