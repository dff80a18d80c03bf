"""A GGUF file seen from the kernel: its header read (the ``gguf`` package: numpy, no torch), what it is,
whether transformers can load it, and the ``config.json`` the converted folder will have, for the estimate.

Nothing is dequantised here: the worker converts the file once (``nbtrain.worker.gguf``) into the folder
``nbtrain.contract.ggufcache`` names. What is read of a file is remembered in the cache by the file's
identity, so a second look costs a ``stat``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract import ggufcache
from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import atomic_write_json

# GGUF architectures whose transformers name differs (transformers' own renames when it loads one).
_RENAMED = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}
# general.file_type (llama.cpp's LLAMA_FTYPE): the ones that hold float weights, by the float they hold.
_FLOAT_FILE_TYPES = {0: "float32", 1: "float16", 32: "bfloat16"}
_INFO_VERSION = 1


class GgufProblem(NbtrainError, ValueError):
    """A GGUF file that cannot be used: not GGUF, truncated or corrupt, or an architecture transformers
    cannot load. The message names the file and what to do."""


@dataclass(frozen=True)
class GgufInfo:
    path: str
    architecture: str  # transformers' name (llama, qwen2, ...)
    name: str | None  # general.name
    file_type: str  # "float32", "bfloat16", "float16" or the quantisation (e.g. "Q4_1")
    tensor_types: list[str]
    n_tensors: int
    size: int
    config: dict[str, Any]  # what transformers will put in config.json (the estimator's input)
    chat_template: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def float_type(self) -> str | None:
        """The float type of its weights when it holds no quantised tensors (else None)."""
        return self.file_type if self.file_type in ggufcache.DTYPES else None


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers loads (its GGUF_CONFIG_MAPPING; importing that module
    loads no torch)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    value = f.contents()
    return value


def read(path: str | Path) -> GgufInfo:
    """The header of GGUF file ``path``. Raises GgufProblem (not GGUF, truncated, corrupt, unsupported)."""
    path = Path(path).expanduser().resolve()
    try:
        st = path.stat()
    except OSError as e:
        raise GgufProblem(f"cannot read {path}: {e.strerror or e}") from None
    memo = ggufcache.gguf_dir() / "headers" / f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}.json"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if known.get("version") == _INFO_VERSION and known.get("path") == str(path):
            known.pop("version")
            return GgufInfo(**known)
    except (OSError, ValueError, TypeError):
        pass
    info = _read(path, st.st_size)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(memo, {"version": _INFO_VERSION, **asdict(info)})
    except OSError:
        pass
    return info


def _read(path: Path, size: int) -> GgufInfo:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GgufProblem(
            f"{path} is a GGUF file, and reading one needs the gguf package: pip install gguf"
        ) from None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GgufProblem(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes): give a .gguf file "
            f"from llama.cpp, Ollama or LM Studio, or a model folder saved with save_pretrained()"
        )
    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # noqa: BLE001 - the reader fails in many ways on a damaged file
        raise GgufProblem(
            f"{path} is truncated or corrupt: its GGUF header could not be read ({type(e).__name__}: {e}); "
            f"download or copy it again (its size is {size:,} bytes)"
        ) from None
    if end > size:
        raise GgufProblem(
            f"{path} is truncated: its tensors end at byte {end:,} but the file has {size:,}; download or "
            f"copy it again"
        )
    raw_arch = _field(reader, "general.architecture")
    if not isinstance(raw_arch, str):
        raise GgufProblem(f"{path} is corrupt: its header has no general.architecture")
    name = _field(reader, "general.name")
    name = name if isinstance(name, str) else None
    arch = _RENAMED.get(raw_arch, raw_arch)
    if arch == "llama" and name and "mistral" in name.lower():
        arch = "mistral"  # llama.cpp writes Mistral models as llama (transformers renames them too)
    supported = supported_architectures()
    if arch not in supported:
        raise GgufProblem(
            f"{path} holds a {raw_arch!r} model, which transformers cannot load from GGUF; the architectures "
            f"it loads are: {', '.join(supported)}. Use the model's original (safetensors) weights instead"
        )
    types = sorted({t.tensor_type.name for t in reader.tensors})
    ft = _field(reader, "general.file_type")
    quantised = [t for t in types if t not in ("F32", "F16", "BF16")]
    if quantised:
        file_type = max(quantised, key=lambda t: sum(x.tensor_type.name == t for x in reader.tensors))
    else:
        file_type = _FLOAT_FILE_TYPES.get(int(ft), "float32") if isinstance(ft, int) else "float32"
    template = _field(reader, "tokenizer.chat_template")
    return GgufInfo(
        path=str(path),
        architecture=arch,
        name=name,
        file_type=file_type,
        tensor_types=types,
        n_tensors=len(reader.tensors),
        size=size,
        config=_config(reader, raw_arch, arch),
        chat_template=template if isinstance(template, str) else None,
    )


def _config(reader: Any, raw_arch: str, arch: str) -> dict[str, Any]:
    """The config.json keys transformers derives from the header (its GGUF_CONFIG_MAPPING), as far as
    the estimator needs them."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    out: dict[str, Any] = {"model_type": arch, "architectures": None}
    mapping: dict[str, str | None] = dict(GGUF_CONFIG_MAPPING.get(arch, {}))  # type: ignore[call-overload]
    for gguf_key, hf_key in mapping.items():
        if not hf_key:
            continue
        value = _field(reader, f"{raw_arch}.{gguf_key}")
        if value is not None:
            out[hf_key] = value
    if "vocab_size" not in out:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if tokens is not None:
            out["vocab_size"] = len(tokens.data)
    if "rope_theta" in out:
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": out["rope_theta"]}
    names = {t.name for t in reader.tensors}
    out["tie_word_embeddings"] = "output.weight" not in names or arch in ("falcon", "bloom")
    out["attention_bias"] = any(n.endswith("attn_q.bias") for n in names)
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = _field(reader, f"tokenizer.ggml.{key}")
        if isinstance(value, int):
            out["pad_token_id" if key == "padding_token_id" else key] = value
    return {k: v for k, v in out.items() if v is not None}


def find(spec: str | Path, gguf_file: str | None = None) -> Path | None:
    """The GGUF file a local ``model:`` names: the file itself, or the one .gguf in a folder (or
    ``gguf_file:`` there). None when ``spec`` is neither. Raises GgufProblem for a folder holding several
    and no ``gguf_file:``, or naming one it lacks."""
    path = Path(spec).expanduser()
    if path.is_file() and ggufcache.is_gguf(path.name):
        return path.resolve()
    if not path.is_dir() or ((path / "config.json").exists() and gguf_file is None):
        return None
    if gguf_file is not None:
        target = path / gguf_file
        if not target.is_file():
            have = ", ".join(p.name for p in ggufcache.gguf_files(path)) or "none"
            raise GgufProblem(f"{path} has no file {gguf_file!r} (its .gguf files: {have})")
        return target.resolve()
    files = ggufcache.gguf_files(path)
    if len(files) > 1:
        raise GgufProblem(
            f"{path} holds {len(files)} GGUF files ({', '.join(p.name for p in files)}): say which with "
            f"gguf_file: NAME"
        )
    return files[0].resolve() if files else None


def conversion_dtype(info: GgufInfo, precision: str) -> str:
    """The float type the converted folder holds: the file's own when it is a float file; a quantised
    file is dequantised to what training computes in (bf16 or fp16), fp32 for fp32 training (a CPU)."""
    if info.float_type is not None:
        return info.float_type
    return {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")


def source(path: str | Path, precision: str) -> dict[str, Any]:
    """What resolved.json says of a GGUF model: the file, its hash, the folder it converts into."""
    info = read(path)
    sha = ggufcache.file_sha256(info.path)
    dtype = conversion_dtype(info, precision)
    folder = ggufcache.converted_dir(sha, dtype)
    return {
        "file": info.path,
        "sha256": sha,
        "dtype": dtype,
        "folder": str(folder),
        "architecture": info.architecture,
        "file_type": info.file_type,
        "converted": ggufcache.is_converted(folder),
    }


__all__ = ["GgufInfo", "GgufProblem", "conversion_dtype", "find", "read", "source", "supported_architectures"]
