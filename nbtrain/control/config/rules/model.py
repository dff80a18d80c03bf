"""model: a local folder, a Hub id or a GGUF file; method: qlora needs bitsandbytes that loads."""

from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from nbtrain.contract.gguf import is_gguf
from nbtrain.control.config.problems import Problems

HUB_MODEL = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # org/name, or a bare name


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


def check_model(spec: str, base: Path, probs: Problems, gguf_file: Any = None) -> str:
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
        kind = check_gguf(path, gguf_name, probs)
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
    elif looks_like_path or not HUB_MODEL.match(spec) or is_gguf(spec):
        try:
            names = [p.name for p in path.parent.iterdir() if p.is_dir() or is_gguf(p.name)]
        except OSError:
            names = []
        close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
        hint = f"; did you mean '{path.parent / close[0]}'?" if close else ""
        probs.add(("model",), f"model path not found: {path}{hint}")
    return "hub"


def check_gguf(path: Path, gguf_file: str | None, probs: Problems) -> str | None:
    """``model:`` as a .gguf file, or a folder holding one: its header read (not dequantised), a file
    that is not GGUF, damaged, or of an architecture transformers cannot load refused. None when ``path``
    is no GGUF model."""
    from nbtrain.control.models import gguf  # the gguf reader (numpy) only when a .gguf is in play

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


MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not a model's


def module_names(model_dir: Path) -> set[str] | None:
    """The names of a local model's modules that hold weights ('model.layers.0.self_attn.q_proj'), from its
    safetensors index or headers: nothing is loaded. None when they cannot be read (no safetensors)."""
    import json
    import struct

    keys: set[str] = set()
    index = model_dir / "model.safetensors.index.json"
    try:
        if index.is_file():
            keys = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {})
        else:
            for f in sorted(model_dir.glob("*.safetensors"))[:64]:
                with open(f, "rb") as fh:
                    (size,) = struct.unpack("<Q", fh.read(8))
                    if size > MAX_HEADER_BYTES:
                        return None
                    keys |= {k for k in json.loads(fh.read(size)) if k != "__metadata__"}
    except (OSError, ValueError, struct.error, AttributeError):
        return None
    return {k.rsplit(".", 1)[0] for k in keys if "." in k} or None


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
