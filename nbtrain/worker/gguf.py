"""A GGUF file converted, once, into an ordinary model folder that everything else loads.

    python -m nbtrain.worker.gguf FILE.gguf [--dtype float32|bfloat16|float16]   # prints the folder

transformers reads GGUF itself (``from_pretrained(folder, gguf_file=NAME)``, dequantising with the ``gguf``
package) but will not save what it loaded, and dequantising again at every run costs seconds to minutes.
So the first process that needs the file converts it into ``nbtrain.contract.ggufcache.converted_dir(sha256,
dtype)`` (safetensors, tokenizer with its chat template, config, generation config) under that folder's
lock, writes it beside its place and renames it in whole; a second process converting the same file at
the same time waits for the lock and finds the folder made. While a run converts, status.json says
``phase: "converting model"`` with the tensors done (``download: {repo: FILE, done, total, unit}``).

Every worker entry (the training worker, its jobs, the server) calls ``use_converted(resolved)`` after it
reads resolved.json: a GGUF run's ``config.model`` is then the folder, as for any local model.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nbtrain.contract import ggufcache
from nbtrain.contract.rundir import RunPaths, atomic_write_json, write_status


class _Progress:
    """Tensors dequantised so far (transformers' loop over them, counted), written into status.json."""

    def __init__(self, paths: RunPaths | None, name: str) -> None:
        self.paths, self.name = paths, name
        self.done, self.total = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nbtrain-gguf-progress", daemon=True)

    def _write(self) -> None:
        if self.paths is not None:
            d = {"repo": self.name, "done": self.done, "total": self.total, "unit": "tensors"}
            write_status(self.paths, "starting", phase="converting model", download=d)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._write()

    def __enter__(self) -> _Progress:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        base = gguf_utils.tqdm
        progress = self

        class Counting(base):  # type: ignore[misc, valid-type]
            def __init__(self, iterable: Any = None, *args: Any, **kwargs: Any) -> None:
                super().__init__(iterable, *args, **kwargs)
                progress.total = int(self.total or 0)

            def update(self, n: float | None = 1) -> bool | None:
                progress.done += int(n or 0)
                return super().update(n)

        self._base = base
        gguf_utils.tqdm = Counting
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        gguf_utils.tqdm = self._base
        self._stop.set()
        self._thread.join()


def convert(file: str | Path, out: str | Path, dtype: str = "float32", paths: RunPaths | None = None) -> Path:
    """Convert GGUF ``file`` into the model folder ``out`` (written beside it, renamed in whole)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file, out = Path(file).resolve(), Path(out)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.monotonic()
    print(f"nbtrain: converting {file.name} ({file.stat().st_size / 1e6:.0f} MB) into {out} ({dtype})",
          flush=True)  # fmt: skip
    try:
        tok = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        with _Progress(paths, file.name):
            model = AutoModelForCausalLM.from_pretrained(
                file.parent, gguf_file=file.name, dtype=getattr(torch, dtype)
            )
        # What loading a GGUF leaves behind makes save_pretrained refuse; the weights are plain tensors.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None  # type: ignore[assignment]
        model.is_quantized = False  # type: ignore[assignment]
        model.config.dtype = dtype
        model.config.name_or_path = str(out)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / ggufcache.CONVERTED).write_text(f"{file}\n", encoding="utf-8")
        if out.exists():
            _replace_dir(tmp, out)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"nbtrain: converted {file.name} in {time.monotonic() - started:.1f} s", flush=True)
    return out


def _replace_dir(tmp: Path, out: Path) -> None:
    """``out`` is an incomplete folder (a conversion killed before its marker): set it aside, then move."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def ensure(file: str | Path, dtype: str, paths: RunPaths | None = None, sha256: str | None = None) -> Path:
    """The converted folder of ``file`` in ``dtype``, converting it first unless another process did."""
    folder = ggufcache.converted_dir(sha256 or ggufcache.file_sha256(file), dtype)
    if ggufcache.is_converted(folder):
        return folder
    with ggufcache.conversion_lock(folder):
        if not ggufcache.is_converted(folder):  # made by the process that held the lock before us
            convert(file, folder, dtype, paths)
    return folder


def use_converted(resolved: dict[str, Any], paths: RunPaths | None = None) -> dict[str, Any]:
    """A GGUF run's resolved.json with ``config.model`` pointing at the converted folder (converted now if
    it is not there: a cleared cache, another machine); any other run's unchanged."""
    src = resolved.get("gguf")
    if not isinstance(src, dict):
        return resolved
    file = src["file"]
    if resolved.get("model_kind") == "hub":
        from huggingface_hub import hf_hub_download

        cfg = resolved["config"]
        file = hf_hub_download(cfg["model"], cfg["gguf_file"], revision=cfg.get("revision"))
    folder = ensure(file, src["dtype"], paths, sha256=src.get("sha256"))
    resolved["config"]["model"] = str(folder)
    return resolved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.worker.gguf", description=__doc__.split("\n")[0])
    ap.add_argument("file", help="a .gguf file")
    ap.add_argument("--dtype", default="float32", choices=ggufcache.DTYPES)
    ap.add_argument("--result", help="write {folder} or {error} here as JSON (the kernel's job runner)")
    args = ap.parse_args(argv)
    try:
        folder = ensure(args.file, args.dtype)
    except (OSError, ValueError) as e:
        print(f"nbtrain: converting {args.file} failed: {e}", file=sys.stderr)
        if args.result:
            atomic_write_json(Path(args.result), {"error": f"{type(e).__name__}: {e}"})
        return 1
    if args.result:
        atomic_write_json(Path(args.result), {"folder": str(folder)})
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
