"""Hub models and datasets seen from the kernel, lightly: a model's ``config.json``, whether a repo can be
read (gated, private, missing), and the first rows of a dataset's first data file.

No torch, transformers or datasets here: ``huggingface_hub`` (imported when a Hub id is in play) downloads
``config.json`` into the normal HF cache, so the worker's ``from_pretrained`` finds it there too, and a
dataset's first rows come from a byte range of one file (or, for Parquet, its first row group). Settings
are read from the environment on each call (``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` /
``HF_HOME``, ``HF_TOKEN``): huggingface_hub reads some of them once at import, and a notebook may set
them after that. The token is only handed to huggingface_hub, never returned or stored.
"""

from __future__ import annotations

import difflib
import fnmatch
import io
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+\Z")
DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 10.0
SAMPLE_BYTES = 1 << 20  # the first MiB of a JSON-lines or CSV file holds the sampled rows
FRESH_S = 60.0  # how long a fetched config.json is reused without asking the Hub again
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")
# The file-name words ``datasets`` maps to each standard split (its data_files conventions).
SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}


class HubProblem(ValueError):
    """A Hub repo that cannot be used as configured: missing, gated, private, a bad revision or file."""


@dataclass(frozen=True)
class Settings:
    endpoint: str
    offline: bool
    cache_dir: str
    token: str | None


def cache_dir() -> str:
    """The Hub cache folder huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub), without importing it."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")


def settings() -> Settings:
    from huggingface_hub import get_token

    offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return Settings(
        endpoint=(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
        offline=offline.strip().upper() in ("1", "ON", "YES", "TRUE"),
        cache_dir=cache_dir(),
        token=get_token(),
    )


def is_hub_id(spec: str) -> bool:
    return bool(HUB_ID.match(spec))


def page(repo: str, kind: str = "model", endpoint: str | None = None) -> str:
    base = (endpoint or settings().endpoint).rstrip("/")
    return f"{base}/{repo}" if kind == "model" else f"{base}/datasets/{repo}"


def _offline_fix(repo: str, kind: str) -> str:
    get = f"hf download {repo}" + (" --repo-type dataset" if kind == "dataset" else "")
    return f"download it while online (`{get}`), or unset HF_HUB_OFFLINE"


def _access_problem(err: Exception, repo: str, kind: str, s: Settings) -> HubProblem | None:
    """The user's sentence for a Hub error about ``repo``, or None when ``err`` is not one."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    url = page(repo, kind, s.endpoint)
    if isinstance(err, GatedRepoError):
        if s.token is None:
            return HubProblem(
                f"{kind} {repo} is gated on the Hub and no token is set: accept its terms at {url}, then "
                f"set HF_TOKEN or run `hf auth login`"
            )
        return HubProblem(
            f"{kind} {repo} is gated and your token has no access to it: request access at {url}"
        )
    if isinstance(err, RepositoryNotFoundError):
        close = _close_repo(repo, kind, s)
        hint = f"; did you mean '{close}'?" if close else ""
        auth = (
            "if it is private, set HF_TOKEN or run `hf auth login`"
            if s.token is None
            else "if it is private, your token has no access to it"
        )
        return HubProblem(f"{kind} {repo} was not found on the Hub ({url}){hint}; {auth}")
    if isinstance(err, RevisionNotFoundError):
        return HubProblem(
            f"{kind} {repo} has no revision {_revision_of(err)!r} (branch, tag or commit) at {url}"
        )
    if isinstance(err, RemoteEntryNotFoundError):
        return HubProblem(f"{kind} {repo} has no {_file_of(err)} ({url})")
    return None


def _revision_of(err: Exception) -> str:
    m = re.search(r"/(?:resolve|revision|tree)/([^/\s]+)", str(err))
    return m.group(1) if m else "?"


def _file_of(err: Exception) -> str:
    m = re.search(r"/resolve/[^/]+/(\S+?)\.?$", str(err).splitlines()[-1] if str(err) else "")
    return m.group(1) if m else "such file"


def _close_repo(repo: str, kind: str, s: Settings) -> str | None:
    """A repo whose name is close to ``repo`` (one search request), or None; never raises. The Hub's
    search matches substrings, so it is asked for the name's first half: a typo later in the name still
    finds the repo, and difflib picks the closest of what comes back."""
    from huggingface_hub import HfApi

    name = repo.split("/")[-1]
    text = name[: max(3, len(name) // 2)]
    try:
        api = HfApi(endpoint=s.endpoint, token=s.token)
        found = (
            api.list_models(search=text, limit=50)
            if kind == "model"
            else api.list_datasets(search=text, limit=50)
        )
        ids = [x.id for x in found]
    except Exception:  # noqa: BLE001 - a hint only: any failure means no hint
        return None
    close = difflib.get_close_matches(repo, ids, n=1, cutoff=0.6)
    return close[0] if close else None


# ------------------------------------------------------------------------------------------- models

_configs: dict[tuple[str, str | None, str, bool, bool], tuple[float, dict[str, Any] | None, str | None]] = {}


def model_config(repo: str, revision: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """``config.json`` of Hub model ``repo`` (downloaded into the HF cache), and a note.

    Returns ``(config, None)``; ``(config, note)`` when it came from the cache because the Hub could not
    be asked (offline); ``(None, why)`` when the Hub cannot be reached and the cache does not hold it.
    Raises HubProblem for a missing, gated or private repo, a bad revision, a repo without config.json,
    and for offline mode without the file cached (the run could not load the model either).
    """
    s = settings()
    key = (repo, revision, s.endpoint, s.offline, s.token is not None)
    hit = _configs.get(key)
    if hit is not None and time.monotonic() - hit[0] < FRESH_S:
        return hit[1], hit[2]
    config, note = _fetch_config(repo, revision, s)
    _configs[key] = (time.monotonic(), config, note)
    return config, note


def _fetch_config(repo: str, revision: str | None, s: Settings) -> tuple[dict[str, Any] | None, str | None]:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    def cached() -> dict[str, Any] | None:
        try:
            path = hf_hub_download(
                repo, "config.json", revision=revision, cache_dir=s.cache_dir, local_files_only=True
            )
        except (EntryNotFoundError, OSError, ValueError):
            return None
        return _read_json(path)

    at = f"@{revision}" if revision else ""
    if s.offline:
        config = cached()
        if config is None:
            raise HubProblem(
                f"model {repo}{at} is not in the local Hugging Face cache ({s.cache_dir}) and HF_HUB_OFFLINE "
                f"is set, so it cannot be downloaded: {_offline_fix(repo, 'model')}"
            )
        return config, f"HF_HUB_OFFLINE: {repo}'s config.json from the local cache (access not checked)"
    url = hf_hub_url(repo, "config.json", revision=revision, endpoint=s.endpoint)
    try:
        # One quick request, without huggingface_hub's retries (about 25 s when the network is down).
        get_hf_file_metadata(url, token=s.token, timeout=TIMEOUT_S, endpoint=s.endpoint)
    except HfHubHTTPError as e:
        problem = _access_problem(e, repo, "model", s)
        if problem is not None:
            raise problem from None
        return _unreachable(cached(), repo, s, e)
    except Exception as e:  # noqa: BLE001 - network (refused, DNS, timeout): the HTTP library's own errors
        return _unreachable(cached(), repo, s, e)
    path = hf_hub_download(
        repo, "config.json", revision=revision, cache_dir=s.cache_dir, endpoint=s.endpoint, token=s.token,
        etag_timeout=TIMEOUT_S,
    )  # fmt: skip
    config = _read_json(path)
    if config is None:
        raise HubProblem(f"model {repo}{at}: its config.json is not a JSON object ({page(repo)})")
    return config, None


def cached_file(repo: str, file: str, revision: str | None = None) -> str | None:
    """Where ``file`` of Hub repo ``repo`` lies in the local HF cache, or None; asks no server."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo, file, cache_dir=cache_dir(), revision=revision)
    return hit if isinstance(hit, str) else None


def gguf_file(repo: str, file: str, revision: str | None = None) -> tuple[str | None, str | None]:
    """A Hub repo's GGUF file ``file`` (``model: org/x`` + ``gguf_file:``): the repo, revision and file
    checked with one metadata request (nothing downloaded: the worker fetches it, with its bytes shown).

    Returns ``(cached path or None, note)``; the note says why the Hub could not be asked, or that the
    estimate waits for the download. Raises HubProblem for a missing repo, revision or file, a gated or
    private repo, and offline mode without the file cached."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError

    s = settings()
    cached = cached_file(repo, file, revision)
    if s.offline:
        if cached is None:
            raise HubProblem(
                f"{repo}'s {file} is not in the local Hugging Face cache ({s.cache_dir}) and HF_HUB_OFFLINE "
                f"is set, so it cannot be downloaded: hf download {repo} {file}"
            )
        return cached, f"HF_HUB_OFFLINE: {repo}'s {file} from the local cache (access not checked)"
    url = hf_hub_url(repo, file, revision=revision, endpoint=s.endpoint)
    try:
        get_hf_file_metadata(url, token=s.token, timeout=TIMEOUT_S, endpoint=s.endpoint)
    except RemoteEntryNotFoundError:
        where = page(repo, "model", s.endpoint)
        raise HubProblem(
            f"model {repo} has no file {file!r} ({where}); gguf_file: names one of its .gguf files"
        ) from None
    except HfHubHTTPError as e:
        problem = _access_problem(e, repo, "model", s)
        if problem is not None:
            raise problem from None
        return cached, f"the Hub ({s.endpoint}) could not be reached ({type(e).__name__})"
    except Exception as e:  # noqa: BLE001 - network (refused, DNS, timeout)
        return cached, f"the Hub ({s.endpoint}) could not be reached ({type(e).__name__}: {str(e)[:120]})"
    if cached is None:
        return None, f"{file} is read when the worker has downloaded it: no memory estimate before"
    return cached, None


def _unreachable(
    config: dict[str, Any] | None, repo: str, s: Settings, err: Exception
) -> tuple[dict[str, Any] | None, str]:
    why = f"the Hub ({s.endpoint}) could not be reached ({type(err).__name__}: {str(err)[:120]})"
    if config is not None:
        return config, f"{why}; {repo}'s config.json from the local cache (access not checked)"
    return None, f"{why}, and {repo}'s config.json is not in the local cache"


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ----------------------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class Sample:
    file: str  # the repo file the rows come from
    kind: str  # jsonl | json | csv | parquet
    rows: list[tuple[int, Any]]  # (row number in that file, row)


def data_file_for(files: list[str], split: str | None, data_files: str | list[str] | None) -> list[str]:
    """The repo files that make up ``split`` (or the ones ``data_files`` names), as ``datasets`` picks
    them by name when the dataset has no loading script: ``train.jsonl``, ``data/train-0000.parquet``,
    ``test/part.csv``...; a repo whose files name no split is all ``train``."""
    data = sorted(f for f in files if f.lower().endswith(DATA_SUFFIXES) and not f.startswith("."))
    if data_files is not None:
        patterns = [data_files] if isinstance(data_files, str) else list(data_files)
        return [f for f in data if any(fnmatch.fnmatch(f, p) for p in patterns)]
    want = split or "train"

    def words(f: str) -> set[str]:
        return set(re.split(r"[^a-z0-9]+", str(PurePosixPath(f).with_suffix("")).lower()))

    every = {w for ws in SPLIT_WORDS.values() for w in ws}
    if not any(words(f) & every for f in data):  # no file names a standard split: all of it is train
        return data if want == "train" else [f for f in data if want in words(f)]
    return [f for f in data if words(f) & set(SPLIT_WORDS.get(want, (want,)))]


def dataset_sample(
    repo: str, n: int, *, split: str | None = None, data_files: str | list[str] | None = None
) -> tuple[Sample | None, str | None]:
    """The first ``n`` rows of ``split``'s first data file in Hub dataset ``repo``, and a note.

    ``(None, note)`` when the rows cannot be read here (offline, the Hub unreachable, a dataset with a
    loading script or files this reader does not know): the worker checks them when it loads the data.
    Raises HubProblem for a missing, private or gated dataset, or a split / data_files naming no file.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    s = settings()
    if s.offline:
        return None, f"HF_HUB_OFFLINE: dataset {repo} not checked here (the run reads it from the cache)"
    try:
        info = HfApi(endpoint=s.endpoint, token=s.token).dataset_info(repo, timeout=TIMEOUT_S)
    except HfHubHTTPError as e:
        problem = _access_problem(e, repo, "dataset", s)
        if problem is not None:
            raise problem from None
        return None, f"dataset {repo} not checked here: the Hub answered {e}"
    except Exception as e:  # noqa: BLE001 - network, as in _fetch_config
        return None, f"dataset {repo} not checked here: the Hub ({s.endpoint}) could not be reached ({e})"
    files = [x.rfilename for x in info.siblings or []]
    chosen = data_file_for(files, split, data_files)
    if not chosen:
        if data_files is not None:
            raise HubProblem(
                f"data_files {data_files!r} names no file of dataset {repo} ({page(repo, 'dataset')})"
            )
        if any(f.lower().endswith(DATA_SUFFIXES) for f in files):
            raise HubProblem(f"dataset {repo} has no split {split or 'train'!r} ({page(repo, 'dataset')})")
        return (
            None,
            f"dataset {repo} has no .jsonl/.json/.csv/.parquet files to check here; the run checks it",
        )
    first = chosen[0]
    kind = {".ndjson": "jsonl"}.get(
        PurePosixPath(first).suffix.lower(), PurePosixPath(first).suffix[1:].lower()
    )
    try:
        rows = list(_rows(repo, first, kind, n, s))
    except HfHubHTTPError as e:
        problem = _access_problem(e, repo, "dataset", s)
        if problem is not None:
            raise problem from None
        return None, f"dataset {repo} not checked here: reading {first} failed ({e})"
    return Sample(first, kind, rows), None


def _range(repo: str, file: str, s: Settings, start: int, end: int | None) -> tuple[bytes, int | None]:
    """Bytes ``start``..``end`` (inclusive; None: to the end) of a dataset file, and the file's size."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo, file, repo_type="dataset", endpoint=s.endpoint)
    headers = build_hf_headers(token=s.token)
    headers["Range"] = f"bytes={start}-{'' if end is None else end}"
    r = get_session().get(url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S)
    hf_raise_for_status(r)
    total = r.headers.get("Content-Range", "").rpartition("/")[2]
    return r.content, int(total) if total.isdigit() else None


def _rows(repo: str, file: str, kind: str, n: int, s: Settings) -> Iterator[tuple[int, Any]]:
    if kind == "parquet":
        yield from _parquet_rows(repo, file, n, s)
        return
    head, size = _range(repo, file, s, 0, SAMPLE_BYTES - 1)
    whole = size is None or len(head) >= size
    text = head.decode("utf-8", errors="replace")
    if kind == "json":
        if not whole:
            return  # one JSON document larger than the sample: the worker checks it
        yield from _json_rows(text, file, n)
        return
    lines = text.splitlines(keepends=True)
    if not whole and lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # cut off mid-row
    if kind == "csv":
        import csv

        for i, row in enumerate(csv.DictReader(io.StringIO("".join(lines)))):
            if i >= n:
                return
            yield i + 2, dict(row)  # +2: the header is line 1
        return
    count = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        count += 1
        if count > n:
            return
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise HubProblem(
                f"line {lineno} of {file} is not valid JSON ({e.msg}): {line.strip()[:200]}"
            ) from None


def _json_rows(text: str, file: str, n: int) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HubProblem(f"{file} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    if not isinstance(data, list):
        raise HubProblem(f"{file} must hold a JSON list of rows (or an object with exactly one list in it)")
    for i, row in enumerate(data[:n]):
        yield i + 1, row


def _parquet_rows(repo: str, file: str, n: int, s: Settings) -> Iterator[tuple[int, Any]]:
    """The first rows of a Parquet file, reading its footer and first row group through HfFileSystem
    (ranged reads; pyarrow is already a dependency of the local Parquet check)."""
    import pyarrow.parquet as pq
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=s.endpoint, token=s.token)
    with fs.open(f"datasets/{repo}/{file}", "rb") as f:
        pf = pq.ParquetFile(f)
        if pf.metadata.num_rows == 0:
            return
        table = pf.read_row_group(0)
    for i, row in enumerate(table.slice(0, n).to_pylist()):
        yield i + 1, row


__all__ = [
    "HUB_ID",
    "HubProblem",
    "Sample",
    "cached_file",
    "data_file_for",
    "dataset_sample",
    "gguf_file",
    "is_hub_id",
    "model_config",
    "page",
    "settings",
]
