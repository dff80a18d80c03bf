"""Local path candidates for the panel's model and data boxes: a bounded, breadth-first walk below the
notebook's folder and the Hub cache."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from nbtrain.contract.formats import (
    FILE_KINDS,
)
from nbtrain.contract.ggufcache import cache_dir, is_gguf
from nbtrain.contract.paths import runs_root
from nbtrain.control.models.hub import cache_dir as hub_cache_dir
from nbtrain.ui.panel import examples

# ------------------------------------------------------------------------------- local path candidates
# The model and data boxes offer what is on disk: model folders (a config.json beside the weights) and
# data files (the suffixes the data loader reads) below the notebook's folder, and the models in the Hub
# cache. The walk is bounded, so a home folder full of files costs milliseconds, not seconds.

SKIP_DIRS: Final = frozenset(
    {"node_modules", "__pycache__", "site-packages", "nbtrain_runs", "checkpoints", "wandb", "mlruns"}
)
MAX_CANDIDATES = 200
CANDIDATES_EVERY = 10.0  # seconds: how often typing may look at the disk again


def _walk(base: Path, depth: int, budget: int = 4000) -> Iterable[tuple[Path, list[os.DirEntry[str]]]]:
    """(folder, its entries) below ``base`` (itself included), breadth first, at most ``depth`` levels,
    ``budget`` entries in all; hidden folders, the runs root and tool folders are skipped."""
    try:
        skip = runs_root()
    except OSError:
        skip = None
    queue: list[tuple[Path, int]] = [(base, 0)]
    seen: set[tuple[int, int]] = set()
    while queue and budget > 0:
        folder, level = queue.pop(0)
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue  # a link back up the tree
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)[:budget]
        except OSError:
            continue
        budget -= len(entries)
        yield folder, entries
        if level >= depth:
            continue
        for e in entries:
            if e.name.startswith(".") or e.name in SKIP_DIRS:
                continue
            with contextlib.suppress(OSError):
                if e.is_dir() and (skip is None or Path(e.path) != skip):
                    queue.append((Path(e.path), level + 1))


def _relative(p: Path, base: Path) -> str:
    try:
        rel = p.relative_to(base)
    except ValueError:
        return str(p)
    return f"./{rel.as_posix()}" if len(rel.parts) == 1 else rel.as_posix()


def model_candidates(base: Path, depth: int = 2) -> list[str]:
    """Model folders below ``base`` (those holding a config.json) and GGUF files, the example models
    fetched already (``nbtrain.example_model(name=...)``: their GGUF files in nbtrain's cache), then the
    Hub cache's models (org/name), and last the example models by name (``examples.py``: picking one gets
    it)."""
    out = []
    for folder, entries in _walk(base, depth):
        if folder != base and any(e.name == "config.json" for e in entries):
            out.append(_relative(folder, base))
        out += [_relative(folder / e.name, base) for e in entries if is_gguf(e.name)]
    with contextlib.suppress(OSError), os.scandir(cache_dir() / "examples") as it:
        out += sorted(e.path for e in it if is_gguf(e.name) and not e.name.startswith("."))
    hub = Path(hub_cache_dir())
    with contextlib.suppress(OSError), os.scandir(hub) as it:
        names = sorted(e.name for e in it if e.name.startswith("models--"))
        out += [n.removeprefix("models--").replace("--", "/") for n in names]
    return [*out[: MAX_CANDIDATES - len(examples.names())], *examples.names()]


def data_candidates(base: Path, depth: int = 3) -> list[str]:
    """Data files below ``base`` (FILE_KINDS suffixes) and save_to_disk() folders; model folders are
    not looked into (their .json files are not data)."""
    out: list[str] = []
    for folder, entries in _walk(base, depth):
        names = {e.name for e in entries}
        if "config.json" in names and folder != base:
            continue  # a model folder
        if "dataset_info.json" in names and "state.json" in names:
            out.append(_relative(folder, base))
            continue
        for e in entries:
            if Path(e.name).suffix.lower() in FILE_KINDS and not e.name.startswith("."):
                with contextlib.suppress(OSError):
                    if e.is_file():
                        out.append(_relative(Path(e.path), base).removeprefix("./"))
    return out[:MAX_CANDIDATES]
