"""A Hub model's files fetched into the HF cache before the recipe loads them, with the bytes in status.json.

``from_pretrained`` would download them too, but silently: a 15 GB model would sit in ``starting`` for
minutes with nothing to show. Here the worker lists the revision's files (sizes included), fetches the ones
loading needs and the cache lacks with ``snapshot_download``, and while it runs a thread measures what has
arrived in the repo's cache folder (the blobs, ``.incomplete`` ones included) and writes the phase into
status.json: ``phase: "downloading model"`` and ``download: {repo, done, total, rate, files}``, every half
second. Loading the weights after it is the phase ``"loading model"``. Phases exist only while the run is
``starting``: the first ``running`` status drops them (``write_status``).

A Hub dataset (not streamed) is fetched the same way, as ``phase: "downloading data"``: the files
``datasets`` would download (its builder's resolved ``data_files``, every split, at the resolved
revision) go into the HF cache with ``hf_hub_download``, where ``load_dataset`` then finds them. Should
working that out fail, the download is left to ``load_dataset`` (no progress, its own errors), with one
log line saying why.

Offline (HF_HUB_OFFLINE) or for a local model nothing is fetched here; the recipe's ``from_pretrained``
reads the cache or the directory as before. The token is the environment's (HF_TOKEN or the login's
file): never written anywhere by nbtrain.
"""

from __future__ import annotations

import fnmatch
import os
import threading
import time
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import RunPaths, write_status

# What loading a causal LM (and its tokenizer) reads; the weights are the safetensors when the revision has
# them, else the PyTorch .bin files. Other formats (GGUF, ONNX, Flax, TF, original checkpoints) are skipped.
SMALL_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "tokenizer*", "*.jinja")
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
INTERVAL = 0.5


def wanted(files: dict[str, int], trust_remote_code: bool) -> dict[str, int]:
    """The files of a revision (path -> size) that loading the model and its tokenizer needs."""
    top = {p: s for p, s in files.items() if "/" not in p}  # subfolders hold other formats or variants
    patterns = list(SMALL_FILES) + (["*.py"] if trust_remote_code else [])
    weights = "*.safetensors" if any(fnmatch.fnmatch(p, "*.safetensors") for p in top) else WEIGHTS[1]
    patterns.append(weights)
    return {p: s for p, s in top.items() if any(fnmatch.fnmatch(p, pat) for pat in patterns)}


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


class _Meter:
    """Bytes arrived in a repo's cache folder since it started, written into status.json."""

    def __init__(
        self,
        paths: RunPaths,
        repo: str,
        folder: Path,
        total: int,
        files: int,
        report: bool,
        phase: str = "downloading model",
    ) -> None:
        self.paths, self.repo, self.folder, self.total, self.files = paths, repo, folder, total, files
        self.report, self.phase = report, phase
        self.base = self._size()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nbtrain-download", daemon=True)

    def _size(self) -> int:
        total = 0
        try:
            with os.scandir(self.folder / "blobs") as it:
                for e in it:
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            return 0
        return total

    def write(self, done: int) -> None:
        if not self.report:
            return
        elapsed = max(time.monotonic() - self.t0, 1e-6)
        download = {"repo": self.repo, "done": min(done, self.total), "total": self.total,
                    "rate": done / elapsed, "files": self.files}  # fmt: skip
        write_status(self.paths, "starting", phase=self.phase, download=download)

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            self.write(max(0, self._size() - self.base))

    def __enter__(self) -> _Meter:
        self.write(0)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.write(self.total)


def download_hub_files(paths: RunPaths, resolved: dict[str, Any], *, report: bool) -> None:
    """Fetch what a Hub model's loading and a Hub dataset's reading need and the cache lacks, reporting the
    bytes (``report``: this rank writes status.json); then say the weights are loading."""
    hub_model = _download_model(paths, resolved, report=report)
    hub_data = _download_data(paths, resolved, report=report)
    if report and (hub_model or hub_data):
        write_status(paths, "starting", phase="loading model", download=None)


def _hub_sources(resolved: dict[str, Any]) -> list[dict[str, Any]]:
    data = resolved.get("data") or {}
    sources = [*(data.get("sources") or [data.get("train")]), data.get("eval")]
    return [s for s in sources if isinstance(s, dict) and s.get("kind") == "hub"]


def _download_data(paths: RunPaths, resolved: dict[str, Any], *, report: bool) -> bool:
    """The files of each Hub dataset of the run that the cache lacks, one repo at a time."""
    sources = _hub_sources(resolved)
    if not sources or _offline() or (resolved["config"].get("data") or {}).get("streaming"):
        return bool(sources)
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.file_download import repo_folder_name

    for src in sources:
        try:
            repo, revision, files = _dataset_files(src)
        except Exception as e:  # noqa: BLE001 - load_dataset downloads them then, and says what is wrong
            why = f"{type(e).__name__}: {e}"
            print(f"nbtrain: the download of {src['location']} shows no progress: {why}", flush=True)
            continue
        if not files:
            continue
        folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="dataset")
        total = sum(files.values())
        print(f"nbtrain: downloading {len(files)} files of dataset {repo} ({total / 1e9:.2f} GB)", flush=True)
        with _Meter(paths, repo, folder, total, len(files), report, phase="downloading data"):
            for path in sorted(files):
                hf_hub_download(repo, path, repo_type="dataset", revision=revision)
    return True


def _dataset_files(src: dict[str, Any]) -> tuple[str, str, dict[str, int]]:
    """(repo, revision, path -> size) of the files ``load_dataset`` would download for a Hub source (its
    builder's data files, every split) that the HF cache lacks."""
    import datasets
    from huggingface_hub import HfApi, HfFileSystem, try_to_load_from_cache
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.hf_file_system import HfFileSystemResolvedRepositoryPath

    builder = datasets.load_dataset_builder(src["location"], data_files=src.get("data_files"))
    urls = [str(f) for split in (builder.config.data_files or {}).values() for f in split]
    fs = HfFileSystem()
    resolved = [fs.resolve_path(u) for u in urls if u.startswith("hf://datasets/")]
    found = [r for r in resolved if isinstance(r, HfFileSystemResolvedRepositoryPath)]
    if not found:
        return src["location"], "main", {}
    repo, revision = found[0].repo_id, str(found[0].revision)
    wanted = sorted({f.path_in_repo for f in found if f.repo_id == repo})
    info = HfApi().get_paths_info(repo, wanted, repo_type="dataset", revision=revision)
    sizes = {f.path: int(f.size) for f in info if isinstance(f, RepoFile)}
    missing = {
        p: size
        for p, size in sizes.items()
        if not isinstance(try_to_load_from_cache(repo, p, revision=revision, repo_type="dataset"), str)
    }
    return repo, revision, missing


def _download_model(paths: RunPaths, resolved: dict[str, Any], *, report: bool) -> bool:
    """The files a Hub model's loading needs and the cache lacks. False for a local model."""
    cfg = resolved["config"]
    if resolved.get("model_kind") != "hub":
        return False
    if not _offline():
        from huggingface_hub import HfApi, constants, snapshot_download, try_to_load_from_cache
        from huggingface_hub.file_download import repo_folder_name

        repo, revision = cfg["model"], cfg.get("revision")
        from huggingface_hub.hf_api import RepoFile

        tree = HfApi().list_repo_tree(repo, revision=revision, recursive=True)
        listed = {f.path: int(f.size) for f in tree if isinstance(f, RepoFile)}
        gguf_file = cfg.get(
            "gguf_file"
        )  # a GGUF file of the repo: that file alone (worker/gguf.py converts it)
        if gguf_file is not None and gguf_file not in listed:
            have = ", ".join(p for p in listed if p.endswith(".gguf")) or "none"
            raise FileNotFoundError(f"{repo} has no file {gguf_file!r} (its GGUF files: {have})")
        if gguf_file is not None:
            need = {gguf_file: listed[gguf_file]}
        else:
            need = wanted(listed, bool(cfg.get("trust_remote_code")))
        missing = {
            p: s
            for p, s in need.items()
            if not isinstance(try_to_load_from_cache(repo, p, revision=revision), str)
        }
        if missing:
            folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
            gb = sum(missing.values()) / 1e9
            print(f"nbtrain: downloading {len(missing)} files of {repo} ({gb:.2f} GB)", flush=True)
            with _Meter(paths, repo, folder, sum(missing.values()), len(missing), report):
                snapshot_download(repo, revision=revision, allow_patterns=sorted(need))
    return True
