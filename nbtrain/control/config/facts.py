"""What the config's rules know of the world, read in one place and once per ``load_config``.

The rules (``config/rules/``) are functions of the config and a ``Facts``: they touch no file, start no
process and import no package themselves. Facts are read when a rule first asks (a config without
``method: qlora`` never probes bitsandbytes) and kept for the rest of the load, so two rules that look at
the same path read it once. Paths in a config are relative to the folder it was read from (``base``).

What is read here: where ``model:`` points (a folder with a config.json, a file, nothing, and the names
beside it for a suggestion), a GGUF file's header (through ``models.gguf``: numpy only), a local model's
module names (safetensors headers, nothing loaded), small text files a config names (hostfile, DeepSpeed
config), a chat template file's existence, an NVMe folder's fitness (writable, O_DIRECT), and whether the
packages a method needs load (bitsandbytes, DeepSpeed's async_io op: each asked in a subprocess, the
kernel imports neither). Data rows are read by ``datacheck`` (the first rows, the same reader the panel's
preview uses); the model's config.json for the plan is ``plan/facts``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from nbtrain.contract.ggufcache import is_gguf
from nbtrain.control.config import datasetinfo, rewardmodels
from nbtrain.control.config.datacheck import DataSource, inspect_data
from nbtrain.control.config.datasetinfo import InfoDataset
from nbtrain.control.config.rewardmodels import RunLookup

Kind = Literal["dir", "file", "missing"]
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not a model's
MAX_TEXT_BYTES = 2**20  # a hostfile or DeepSpeed config is read up to this much


@dataclass(frozen=True)
class GgufFacts:
    found: Path | None  # the .gguf file a path names (itself, or the one in its folder); None: no GGUF model
    problem: str | None  # why it cannot be used (not GGUF, damaged, an architecture transformers lacks)


class Facts:
    """The world as one load of a config sees it; see the module's docstring."""

    def __init__(self, base: Path, runs: RunLookup | None = None) -> None:
        self.base = base
        self.runs = runs  # how a run named as a reward model is found (prepare hands the registry's)
        self._kinds: dict[Path, Kind] = {}
        self._modules: dict[Path, set[str] | None] = {}
        self._configs: dict[Path, dict[str, Any] | None] = {}
        self._gguf: dict[tuple[Path, str | None], GgufFacts] = {}

    def path(self, spec: str) -> Path:
        """A path the config gives, made absolute against its folder (RuntimeError for '~user' unknown)."""
        p = Path(spec).expanduser()
        return p if p.is_absolute() else (self.base / p).resolve()

    def resolved(self, spec: str) -> Path:
        """A path the config gives, against its folder, with links resolved."""
        return (self.base / Path(spec).expanduser()).resolve()

    def kind(self, path: Path) -> Kind:
        if path not in self._kinds:
            self._kinds[path] = "dir" if path.is_dir() else "file" if path.exists() else "missing"
        return self._kinds[path]

    def has_model_config(self, folder: Path) -> bool:
        return (folder / "config.json").exists()

    def neighbours(self, path: Path) -> list[str]:
        """The folders and .gguf files beside ``path`` (for a 'did you mean'); [] when unreadable."""
        try:
            return [p.name for p in path.parent.iterdir() if p.is_dir() or is_gguf(p.name)]
        except OSError:
            return []

    def gguf(self, path: Path, gguf_file: str | None) -> GgufFacts:
        """The GGUF model ``path`` is or holds, its header read (not dequantised)."""
        key = (path, gguf_file)
        if key not in self._gguf:
            from nbtrain.control.models import gguf  # the gguf reader (numpy) only when a .gguf is in play

            try:
                found = gguf.find(path, gguf_file)
                if found is not None:
                    gguf.read(found)
                self._gguf[key] = GgufFacts(found, None)
            except gguf.GgufProblem as e:
                self._gguf[key] = GgufFacts(path, str(e))
        return self._gguf[key]

    def module_names(self, folder: Path) -> set[str] | None:
        if folder not in self._modules:
            self._modules[folder] = module_names(folder)
        return self._modules[folder]

    def model_config(self, folder: Path) -> dict[str, Any] | None:
        """A local model folder's config.json as a mapping; None when it cannot be read as one."""
        if folder not in self._configs:
            try:
                value = json.loads(self.text(folder / "config.json"))
            except (OSError, ValueError):
                value = None
            self._configs[folder] = value if isinstance(value, dict) else None
        return self._configs[folder]

    def text(self, path: Path) -> str:
        """A small text file's first MAX_TEXT_BYTES (OSError as it comes: FileNotFoundError and others)."""
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.read(MAX_TEXT_BYTES)

    def json(self, path: Path) -> Any:
        """A JSON file's value (FileNotFoundError, OSError, ValueError as they come)."""
        return json.loads(path.read_text(encoding="utf-8"))

    def data(
        self, spec: str, fmt: str, objective: str, columns: dict[str, str] | None, **kw: Any
    ) -> DataSource:
        """A data source found, its first rows read and checked (``datacheck.inspect_data``; DataProblem)."""
        return inspect_data(spec, fmt, self.base, objective, columns, **kw)

    def dataset_info(self, spec: str, name: str) -> InfoDataset:
        """The entry ``name`` of the LLaMA-Factory dataset_info.json ``spec`` names (InfoProblem)."""
        return datasetinfo.resolve(spec, name, self.base)

    def version(self, package: str) -> str | None:
        """An installed package's version (its metadata: nothing imported), None when it is not there."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(package)
        except (PackageNotFoundError, ValueError):
            return None

    def reward_model(self, ref: str) -> tuple[str | None, str | None]:
        """(what the worker loads, why it cannot be used) of a reward model named by run, folder or Hub id."""
        return rewardmodels.resolve(ref, self.base, self.runs)

    def is_file(self, path: Path) -> bool:
        return path.is_file()

    def nvme_problem(self, path: Path) -> str | None:
        return nvme_path_problem(path)

    def bitsandbytes_problem(self) -> str | None:
        return bitsandbytes_problem(tuple(sys.path))

    def async_io_problem(self) -> str | None:
        return async_io_problem(tuple(sys.path))


def module_names(model_dir: Path) -> set[str] | None:
    """The names of a local model's modules that hold weights ('model.layers.0.self_attn.q_proj'), from its
    safetensors index or headers: nothing is loaded. None when they cannot be read (no safetensors)."""
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


__all__ = [
    "Facts", "GgufFacts", "async_io_problem", "bitsandbytes_problem", "module_names", "nvme_path_problem",
]  # fmt: skip
