"""GGUF files as a starting point: where their conversions live, and how both sides name them.

A ``model:`` that is a ``.gguf`` file (from Ollama, LM Studio, llama.cpp) is converted once into an ordinary
model folder (safetensors, tokenizer with its chat template, config) and trained from there. The kernel
names the folder (it reads the file's header and hashes it, ``nbtrain.control.models.gguf``); the worker
makes it
(``nbtrain.worker.gguf``). Both meet here: the folder is keyed by the file's content hash and the float
type it holds, so the same file is converted once per machine whatever its name or place, and a file that
changes gets a new folder. Standard library only.

    <cache>/gguf/<sha256>-<dtype>/     the converted model (complete when it holds CONVERTED)
    <cache>/gguf/<sha256>-<dtype>.lock  held while one process converts (the others wait, then reuse it)
    <cache>/gguf/hashes.json            file identity (device, inode, size, mtime) -> sha256, so a file
                                        is read whole once, not at every run
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nbtrain.contract.rundir import atomic_write_json

SUFFIX = ".gguf"
CONVERTED = ".nbtrain-converted"  # written last into a converted folder: it is complete
DTYPES = ("float32", "bfloat16", "float16")
_CHUNK = 8 << 20


def cache_dir() -> Path:
    """nbtrain's per-machine cache: NBTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/nbtrain, else ~/.cache/nbtrain.

    Unlike NBTRAIN_HOME (runs' registry, courses), it holds only what can be made again: converted
    models, downloaded example wheels."""
    env = os.environ.get("NBTRAIN_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base) / "nbtrain").resolve()


def gguf_dir() -> Path:
    return cache_dir() / "gguf"


# --- Export to GGUF (nbtrain.control.jobs.llamacpp sets it up; nbtrain.worker.jobs.export_gguf runs it) ---
# llama.cpp as the package registry has it: the llama-cpp-python sdist vendors llama.cpp with its
# converter (convert_hf_to_gguf.py, the conversion/ package, gguf-py). Built once per machine (pip keeps
# the wheel), its converter files kept in the cache beside it.
LLAMA_CPP_PYTHON = "0.3.36"
# What a GGUF export may be quantised to: llama.cpp's file types (llama_ftype), by the names its tools use.
GGUF_QUANTS = {
    "f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9,
    "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15,
    "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18,
}  # fmt: skip
GGUF_FLOATS = ("f32", "f16", "bf16")  # what the converter writes itself; the rest are quantised from it
GGUF_LORA_TYPES = ("f16", "f32", "bf16", "q8_0")  # what llama.cpp's LoRA converter writes


def llama_cpp_dir() -> Path:
    """The converter files of the pinned llama-cpp-python sdist (complete when it holds CONVERTED)."""
    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(SUFFIX)


def gguf_files(folder: Path) -> list[Path]:
    """The .gguf files directly in ``folder`` (sorted), none when it cannot be listed."""
    try:
        return sorted(p for p in folder.iterdir() if is_gguf(p.name) and p.is_file())
    except OSError:
        return []


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def file_sha256(path: str | Path) -> str:
    """The sha256 of the file's bytes, read once per file version (remembered by its identity)."""
    path = Path(path).resolve()
    index = gguf_dir() / "hashes.json"
    ident = _identity(path)
    known = _read_index(index)
    entry = known.get(str(path))
    if isinstance(entry, dict) and entry.get("id") == ident and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    if _identity(path) != ident:  # changed while it was read: the digest is of no one version
        raise OSError(f"{path} changed while it was being read; try again once it is written")
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        with _locked(index.with_suffix(".lock")):
            known = _read_index(index)
            known[str(path)] = {"id": ident, "sha256": digest}
            atomic_write_json(index, dict(list(known.items())[-1000:]))  # bounded: the newest 1000 files
    except OSError:
        pass  # an unwritable cache costs a re-read next time, nothing else
    return digest


def _read_index(index: Path) -> dict[str, object]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def converted_dir(sha256: str, dtype: str) -> Path:
    """Where the conversion of the file with this content, in this float type, lives."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype is one of {', '.join(DTYPES)}, not {dtype!r}")
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return gguf_dir() / f"{sha256}-{dtype}"


def is_converted(folder: Path) -> bool:
    return (folder / CONVERTED).is_file() and (folder / "config.json").is_file()


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def conversion_lock(folder: Path) -> Iterator[None]:
    """Held while one process converts into ``folder``: a second waits here and then finds it made."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_name(folder.name + ".lock")):
        yield


__all__ = [
    "CONVERTED",
    "DTYPES",
    "GGUF_FLOATS",
    "GGUF_LORA_TYPES",
    "GGUF_QUANTS",
    "LLAMA_CPP_PYTHON",
    "SUFFIX",
    "cache_dir",
    "conversion_lock",
    "converted_dir",
    "file_sha256",
    "gguf_dir",
    "gguf_files",
    "is_converted",
    "is_gguf",
    "llama_cpp_dir",
]
