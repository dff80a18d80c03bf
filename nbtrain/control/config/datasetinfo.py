"""A dataset named in LLaMA-Factory's ``dataset_info.json``, resolved once in the kernel.

``data: {train: data/dataset_info.json, dataset: my_set}`` (``train:`` may name the folder that holds the
file, as LLaMA-Factory's ``dataset_dir`` does; a ``train:`` list takes ``dataset:`` per source). The entry's
facts become plain ones the worker reads from resolved.json without reading the file again:

- ``file_name`` (relative to the json's folder) -> the data file; ``hf_hub_url`` (+ ``split``) -> the Hub
  dataset, read as any ``data: train:`` Hub id is;
- ``columns`` -> ``data: columns:`` in nbtrain's names (alpaca: prompt -> instruction, query -> input,
  response -> output; sharegpt: messages -> conversations; history, system, tools, images, chosen,
  rejected, kto_tag keep their names), applied by ``formats.apply_columns`` like any other mapping;
- ``tags`` -> the sharegpt key and role names ``formats_peers.sharegpt_turns`` reads the turns with;
- ``formatting`` / ``ranking`` say what the rows are; the rows are checked as such (``format: auto``
  tells alpaca, sharegpt, ranking and KTO rows apart by their columns once they are renamed).

What nbtrain does not read is refused by name, never skipped: ModelScope / Modelers / script / cloud
sources, ``subset``, ``folder``, ``num_samples``, video and audio columns.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.formats_peers import DEFAULT_TAGS

INFO_FILE = "dataset_info.json"
MAX_INFO_BYTES = 16 * 2**20

# LLaMA-Factory's column names -> nbtrain's (formats.CANONICAL_COLUMNS), per formatting.
_COMMON = {
    "system": "system",
    "tools": "tools",
    "images": "images",
    "chosen": "chosen",
    "rejected": "rejected",
    "kto_tag": "kto_tag",
}
COLUMNS = {
    "alpaca": {
        "prompt": "instruction",
        "query": "input",
        "response": "output",
        "history": "history",
        **_COMMON,
    },
    "sharegpt": {"messages": "conversations", **_COMMON},
}
_KEYS = ("file_name", "hf_hub_url", "formatting", "ranking", "split", "columns", "tags")
_ELSEWHERE = ("ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


class InfoProblem(ValueError):
    """A dataset_info.json or its entry that cannot be used; the message names the cause and the fix."""


@dataclass(frozen=True)
class InfoDataset:
    """One entry of a dataset_info.json, as plain facts."""

    name: str
    info: str  # the dataset_info.json, absolute
    spec: str  # the data file (absolute) or the Hub dataset id
    split: str | None  # a Hub dataset's split
    columns: dict[str, str] | None  # nbtrain's name -> the dataset's column
    tags: dict[str, str] | None  # sharegpt key and role names (formats_peers.DEFAULT_TAGS's keys)
    formatting: str  # alpaca | sharegpt
    ranking: bool


def no_nul(value: str, what: str, where: str) -> None:
    """Refuse a file name or Hub id holding a NUL byte, which none can hold (Python's path functions raise a
    bare ValueError on one); ``where``: the file to remove it from."""
    if "\0" in value:
        why = "which no file name or Hub id can hold"
        raise InfoProblem(f"{what} {value!r} holds a NUL byte (\\0), {why}: remove it from {where}")


def info_file(spec: str, base: Path) -> Path:
    """The dataset_info.json ``spec`` names: the file, or a folder holding one."""
    no_nul(spec, "data: train:", "the config")
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else (base / path).resolve()
    if path.is_dir():
        path = path / INFO_FILE
    if not path.is_file():
        raise InfoProblem(
            f"data: dataset: names a dataset of a LLaMA-Factory dataset_info.json, but {path} is not there; "
            f"point train: at the dataset_info.json (or its folder)"
        )
    return path


def read_info(path: Path) -> dict[str, Any]:
    if path.stat().st_size > MAX_INFO_BYTES:
        raise InfoProblem(
            f"{path} is over {MAX_INFO_BYTES // 2**20} MiB; a dataset_info.json is a small index"
        )
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InfoProblem(f"{path} is not JSON ({e}); fix the file") from None
    if not isinstance(info, dict) or not all(isinstance(v, dict) for v in info.values()):
        raise InfoProblem(
            f"{path} is not a LLaMA-Factory dataset_info.json (an object of datasets by name, each "
            f'{{"file_name": ..., "formatting": ..., "columns": {{...}}}})'
        )
    return info


def looks_like_info(path: Path) -> bool:
    """Whether ``path`` is a LLaMA-Factory dataset_info.json (named so, each value a dataset entry)."""
    if path.name != INFO_FILE or not path.is_file():
        return False
    try:
        info = read_info(path)
    except (InfoProblem, OSError):
        return False
    return bool(info) and all(
        any(k in v for k in ("file_name", "hf_hub_url", *_ELSEWHERE)) for v in info.values()
    )


def names_hint(info: Mapping[str, Any], name: str | None = None) -> str:
    close = difflib.get_close_matches(name, list(info), n=1) if name else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(sorted(info)[:30]) + (", ..." if len(info) > 30 else "")
    return f"{hint}its datasets: {shown}"


def resolve(spec: str, name: str, base: Path) -> InfoDataset:
    """The entry ``name`` of the dataset_info.json ``spec`` names (relative to ``base``); InfoProblem."""
    path = info_file(spec, base)
    info = read_info(path)
    where = f"{path}: {name!r}"
    entry = info.get(name)
    if entry is None:
        raise InfoProblem(f"{path} has no dataset {name!r}; {names_hint(info, name)}")
    unknown = [k for k in entry if k not in _KEYS and k not in _ELSEWHERE]
    for key, fix in (
        (
            "subset",
            "point hf_hub_url at the subset's files with data: train: [{path: REPO, data_files: ...}]",
        ),
        ("folder", "point data: train: [{path: REPO, data_files: 'FOLDER/*'}] at the folder's files"),
        ("num_samples", "use data: max_samples: to train on the first rows"),
    ):
        if key in entry:
            raise InfoProblem(f"{where} has {key}:, which nbtrain does not read; {fix}")
    if unknown:
        raise InfoProblem(f"{where} has keys nbtrain does not know: {unknown}; it reads {list(_KEYS)}")
    for key in ("file_name", "hf_hub_url", "split"):
        if isinstance(entry.get(key), str):
            no_nul(entry[key], f"{where}: {key}", str(path))
    formatting = entry.get("formatting", "alpaca")
    if formatting not in COLUMNS:
        raise InfoProblem(f"{where}: formatting {formatting!r} is not alpaca or sharegpt")
    ranking = entry.get("ranking", False)
    if not isinstance(ranking, bool):
        raise InfoProblem(f"{where}: ranking must be true or false, got {ranking!r}")
    if entry.get("file_name") is not None:
        file = entry["file_name"]
        if not isinstance(file, str) or not file:
            raise InfoProblem(f"{where}: file_name must be a path (relative to {path.parent})")
        data = (path.parent / Path(file).expanduser()).resolve()
        if not data.exists():
            raise InfoProblem(
                f"{where}: file_name {file!r} is not there (looked for {data}); file_name is relative to "
                f"the folder of the dataset_info.json"
            )
        if data.is_dir():
            raise InfoProblem(
                f"{where}: file_name {file!r} is a folder; nbtrain reads one file per dataset: name a "
                f".jsonl / .json / .csv / .parquet file, or list the files as data: train: sources"
            )
        source, split = str(data), None
    elif entry.get("hf_hub_url") is not None:
        source = entry["hf_hub_url"]
        if not isinstance(source, str) or not source:
            raise InfoProblem(f"{where}: hf_hub_url must be a Hub dataset id (owner/name)")
        split = entry.get("split") or "train"
        if not isinstance(split, str):
            raise InfoProblem(f"{where}: split must be a split's name, got {split!r}")
    else:
        others = [k for k in _ELSEWHERE if k in entry]
        raise InfoProblem(
            f"{where} has no file_name or hf_hub_url"
            + (f" (only {', '.join(others)}, which nbtrain does not read)" if others else "")
            + "; give the data file as file_name, or the Hub dataset as hf_hub_url"
        )
    return InfoDataset(
        name=name,
        info=str(path),
        spec=source,
        split=split,
        columns=_columns(entry.get("columns"), formatting, where),
        tags=_tags(entry.get("tags"), formatting, where),
        formatting=formatting,
        ranking=ranking,
    )


def _columns(value: Any, formatting: str, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InfoProblem(f"{where}: columns must be an object ({{prompt: ..., response: ...}})")
    names = COLUMNS[formatting]
    out: dict[str, str] = {}
    for key, column in value.items():
        if key not in names:
            other = next((f for f, n in COLUMNS.items() if key in n), None)
            why = (
                f"is a {other} column, and the dataset's formatting is {formatting}"
                if other
                else "is not read by nbtrain (video and audio are not trained on here)"
                if key in ("videos", "audios")
                else f"is not one of {', '.join(names)}"
            )
            raise InfoProblem(f"{where}: columns: {key} {why}")
        if column is None:
            continue
        if not isinstance(column, str) or not column:
            raise InfoProblem(f"{where}: columns: {key} must name a column, got {column!r}")
        out[names[key]] = column
    return out or None


def _tags(value: Any, formatting: str, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    if formatting != "sharegpt":
        raise InfoProblem(
            f"{where}: tags name sharegpt turns' keys and roles; the formatting is {formatting}"
        )
    if not isinstance(value, dict):
        raise InfoProblem(f"{where}: tags must be an object ({{role_tag: from, content_tag: value, ...}})")
    out: dict[str, str] = {}
    for key, tag in value.items():
        if key not in DEFAULT_TAGS:
            raise InfoProblem(f"{where}: tags: {key} is not one of {', '.join(DEFAULT_TAGS)}")
        if not isinstance(tag, str) or not tag:
            raise InfoProblem(f"{where}: tags: {key} must be a name, got {tag!r}")
        out[key] = tag
    return out or None
