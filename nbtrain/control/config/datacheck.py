"""Kernel-side look at training data before anything starts: does it exist, is it empty, what format.

Reads only a sample of rows (no ``datasets`` import) so a cell answers quickly even for large files;
the worker checks every row again when it converts them.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.formats import (
    FILE_KINDS,
    RowError,
    apply_columns,
    check_rows,
    jsonl_lines,
    to_example,
)
from nbtrain.contract.images import (
    ImageRowError,
    describe,
    has_images,
    image_source,
    too_many_pixels,
    url_problem,
)
from nbtrain.control.config.datasetinfo import looks_like_info, names_hint, read_info

SAMPLE_ROWS = 1000
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+\Z")


@dataclass(frozen=True)
class DataSource:
    spec: str  # as written
    location: str  # absolute path, or the hub id
    kind: str  # jsonl | json | csv | parquet | disk | hub
    format: str  # detected or given; "auto" when it could not be looked at (hub)
    sample_rows: int  # rows looked at
    # a source in a data: train: list
    weight: float | None = None
    split: str | None = None
    columns: dict[str, str] | None = None
    data_files: str | list[str] | None = None  # a hub dataset: which of its files
    images: int = 0  # images the sampled rows name (a vision-language model's data)
    images_per_row: int = 0  # the most one sampled row names
    # a dataset of a LLaMA-Factory dataset_info.json (datasetinfo.py): its name, the json, and the sharegpt
    # key and role names its rows are read with (columns, split and the file above are its resolved facts)
    dataset: str | None = None
    dataset_info: str | None = None
    tags: dict[str, str] | None = None
    # some sampled row marks which turns to train (ms-swift "loss", OpenAI "weight"): see flags_problem
    turn_flags: bool = False
    # some sampled row defines tools or calls one: the chat template must render them (chat_template.py)
    tools: bool = False


class DataProblem(ValueError):
    pass


@dataclass(frozen=True)
class RowHook:
    """``hooks: preprocess`` as the kernel's look at the rows applies it: the notebook's function, so the
    rows are checked as the worker will format them (after it), and a function that fails on them fails
    before anything starts. ``fn`` is None where the notebook is not at hand (a resume, the server's check):
    then the rows' format is left to the worker, which applies the captured function."""

    fn: Callable[[Any], Any] | None
    label: str  # "hooks: preprocess (my_fn)"

    def apply(self, rows: list[tuple[int, Any]], name: str) -> list[tuple[int, Any]]:
        assert self.fn is not None
        out = []
        for n, row in rows:
            try:
                new = self.fn(dict(row) if isinstance(row, Mapping) else row)
            except Exception as e:  # noqa: BLE001 - the user's function: any failure is reported as its
                raise DataProblem(
                    f"{self.label} raised {type(e).__name__}: {e} on row {n} of {name} (nbtrain tries it on "
                    f"the first rows before starting); fix the function and run its cell again"
                ) from None
            if not isinstance(new, Mapping):
                raise DataProblem(
                    f"{self.label} returned {type(new).__name__} for row {n} of {name}; it returns the row "
                    f"(a dict of columns)"
                )
            out.append((n, {**row, **new} if isinstance(row, Mapping) else dict(new)))
        return out


def _close_files(path: Path) -> str:
    try:
        names = [p.name for p in path.parent.iterdir()]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean '{path.parent / close[0]}'?" if close else ""


def _rows_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    n = 0
    try:
        for lineno, line in jsonl_lines(path):
            if not line.strip():
                continue
            n += 1
            if n > SAMPLE_ROWS:
                return
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataProblem(
                    f"line {lineno} of {path.name} is not valid JSON ({e.msg}): {line.strip()[:200]}"
                ) from None
            except RecursionError:
                raise DataProblem(
                    f"line {lineno} of {path.name} is nested too deeply to read; rows are flat objects "
                    f"of text fields (or lists of messages)"
                ) from None
    except RowError as e:  # a line over the bound, or not UTF-8
        raise DataProblem(str(e)) from None


def _sample(path: Path, kind: str, split: str | None) -> list[tuple[int, Any]]:
    """The checked sample of a local source; a file that cannot be read is one DataProblem naming it and
    the cause (never a raw decoder or Arrow traceback)."""
    try:
        return list(_rows_disk(path, split) if kind == "disk" else _READERS[kind](path))
    except DataProblem:
        raise
    except UnicodeDecodeError as e:
        raise DataProblem(f"{path.name} is not UTF-8 text (byte {e.start + 1}); save it as UTF-8") from None
    except RecursionError:
        raise DataProblem(f"{path.name} is nested too deeply to read; rows are flat objects") from None
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSErrors
        raise DataProblem(
            f"cannot read {path.name} as {kind}: {type(e).__name__}: {str(e)[:300]} (is it truncated or "
            f"corrupt? write it again)"
        ) from None


def _rows_json(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise DataProblem(
            f"{path.name} is not valid JSON ({e.msg} at line {e.lineno}); for one "
            f"object per line name the file .jsonl"
        ) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataProblem(
                f"{path.name} holds a JSON object; expected a list of rows "
                f"(or an object with exactly one list in it)"
            )
        data = lists[0]
    if not isinstance(data, list):
        raise DataProblem(f"{path.name} must hold a JSON list of rows, got {type(data).__name__}")
    for i, row in enumerate(data[:SAMPLE_ROWS]):
        yield i + 1, row


def _rows_csv(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8", newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= SAMPLE_ROWS:
                return
            yield i + 2, dict(row)  # +2: the header is line 1


def _rows_arrow_table(table: Any) -> Iterator[tuple[int, Any]]:
    for i, row in enumerate(table.slice(0, SAMPLE_ROWS).to_pylist()):
        yield i + 1, row


def _rows_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if pf.metadata.num_rows == 0:
        return
    yield from _rows_arrow_table(pf.read_row_group(0))


def _rows_disk(path: Path, split: str | None = None) -> Iterator[tuple[int, Any]]:
    """A ``datasets.save_to_disk`` directory: read its first Arrow shard with pyarrow."""
    import pyarrow as pa

    d = path
    if (path / "dataset_dict.json").exists():
        d = path / (split or "train")
        if not d.is_dir():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise DataProblem(f"{path.name} has no split {split or 'train'!r}; its splits: {splits}")
    shards = sorted(d.glob("*.arrow"))
    if not (d / "state.json").exists() or not shards:
        raise DataProblem(
            f"{path} is a directory but not a datasets.save_to_disk() dataset (no state.json / .arrow files)"
        )
    with pa.memory_map(str(shards[0])) as src:
        table = pa.ipc.open_stream(src).read_all()
    yield from _rows_arrow_table(table)


_READERS = {
    "jsonl": _rows_jsonl,
    "json": _rows_json,
    "csv": _rows_csv,
    "parquet": _rows_parquet,
    "disk": _rows_disk,
}


def read_rows(path: Path, kind: str, n: int) -> list[tuple[int, Any]]:
    """The first ``n`` (row number, row) pairs of a local data file or save_to_disk directory."""
    return list(itertools.islice(_READERS[kind](path), n))


def _one_sided_labels(
    rows: list[tuple[int, Any]], columns: dict[str, str] | None, tags: dict[str, str] | None = None
) -> bool | None:
    """The single label every unpaired row carries, or None when both kinds occur."""
    seen = set()
    for _, row in rows:
        try:
            seen.add(to_example(apply_columns(row, columns), "unpaired", tags=tags)["label"])
        except RowError:
            return None  # check_rows has passed these rows; nothing more to say
    return seen.pop() if len(seen) == 1 else None


def inspect_data(
    spec: str,
    fmt: str,
    base: Path,
    objective: str = "sft",
    columns: dict[str, str] | None = None,
    *,
    split: str | None = None,
    data_files: str | list[str] | None = None,
    preprocess: RowHook | None = None,
    tags: dict[str, str] | None = None,
) -> DataSource:
    """Find ``spec`` (a path or a hub id), read a sample and check its format for ``objective``
    (after ``preprocess`` and renaming ``columns``; ``tags``: sharegpt names, formats.to_example); raise
    DataProblem."""
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (base / path).resolve()
    if not path.exists():
        if _HUB_ID.match(spec) and Path(spec).suffix.lower() not in FILE_KINDS:
            return _inspect_hub(spec, fmt, objective, columns, split, data_files, tags)
        raise DataProblem(f"data file not found: {path}{_close_files(path)}")
    if looks_like_info(path):
        raise DataProblem(
            f"{path.name} is LLaMA-Factory's index of datasets, not rows: name the dataset to train on with "
            f"data: dataset: ({names_hint(read_info(path))})"
        )
    if path.is_dir():
        kind = "disk"
    else:
        found = FILE_KINDS.get(path.suffix.lower())
        if found is None:
            raise DataProblem(
                f"cannot read {path.name}: use .jsonl, .json, .csv or .parquet, a "
                f"datasets.save_to_disk() directory, or a hub id"
            )
        kind = found
        if path.stat().st_size == 0:
            raise DataProblem(f"data file is empty: {path}")
    rows = _sample(path, kind, split)
    if not rows:
        raise DataProblem(f"data file has no rows: {path}")
    if preprocess is not None:
        if preprocess.fn is None:
            return DataSource(spec, str(path), kind, fmt, len(rows))  # the worker checks them after it
        rows = preprocess.apply(rows, path.name)
    resolved, problem = check_rows(rows, fmt, objective, columns, tags)
    if problem:
        raise DataProblem(f"{path.name}: {problem}")
    folder = path.parent if kind != "disk" else path
    images, most = check_images(rows, resolved, columns, folder, path.name, tags)
    if resolved == "unpaired" and len(rows) < SAMPLE_ROWS:
        # Only when the whole file was read: a sample of a sorted file can hold one label by chance.
        only = _one_sided_labels(rows, columns, tags)
        if only is not None:
            raise DataProblem(
                f"{path.name}: all {len(rows)} rows have label {str(only).lower()}; KTO learns from both "
                f"desirable (label: true) and undesirable (label: false) completions"
            )
    flags, tools = chat_facts(rows, resolved, columns, tags)
    return DataSource(
        spec, str(path), kind, resolved, len(rows), images=images, images_per_row=most, turn_flags=flags,
        tools=tools,
    )  # fmt: skip


def chat_facts(
    rows: list[tuple[int, Any]], fmt: str, columns: dict[str, str] | None, tags: dict[str, str] | None
) -> tuple[bool, bool]:
    """Of the sampled chat rows (checked already), in one pass: whether some row marks which of its turns
    to train (``loss`` / ``weight``), and whether some row defines tools or calls one."""
    flags = tools = False
    if fmt not in ("messages", "sharegpt"):
        return flags, tools
    for _, row in rows:
        try:
            ex = to_example(apply_columns(row, columns), fmt, vision=None, tags=tags)
        except RowError:
            continue
        msgs = [m for m in ex.get("messages", []) if isinstance(m, Mapping)]
        flags = flags or any("train" in m for m in msgs)
        tools = tools or bool(ex.get("tools")) or any(m.get("tool_calls") for m in msgs)
        if flags and tools:
            break
    return flags, tools


def flags_problem(sources: list[DataSource], train: Mapping[str, Any] | None) -> str | None:
    """Why the run cannot start when rows carry per-message loss flags and ``train:`` says
    ``assistant_only_loss: false`` (every token): the two cannot both hold. None when they agree."""
    if not isinstance(train, Mapping) or train.get("assistant_only_loss") is not False:
        return None
    flagged = [Path(s.location).name for s in sources if s.turn_flags]
    if not flagged:
        return None
    return (
        f"assistant_only_loss: false trains on every token, but the rows of {', '.join(flagged)} mark which "
        f"turns to train (loss: true/false or weight: 0/1), which only the assistant turns can be; remove "
        f"assistant_only_loss: false (flagged rows train on the assistant turns marked to train), or drop "
        f"the flags from the rows"
    )


# The images the kernel opens before a run starts (the first rows' ones); the worker opens every one.
CHECK_IMAGES = 64


def check_images(
    rows: list[tuple[int, Any]],
    fmt: str,
    columns: dict[str, str] | None,
    base: Path,
    name: str,
    tags: dict[str, str] | None = None,
) -> tuple[int, int]:
    """(how many images the sampled rows name, the most in one row); the first CHECK_IMAGES are opened
    with Pillow, and one that is missing or cannot be decoded is a DataProblem naming its row and file.
    URLs are fetched by the worker, not here; their hosts are checked here (contract.images.url_problem)."""
    found = opened = most = 0
    for n, row in rows:
        if not (isinstance(row, dict) and has_images(apply_columns(row, columns))):
            continue
        refs = to_example(apply_columns(row, columns), fmt, vision=True, tags=tags)["images"]
        found += len(refs)
        most = max(most, len(refs))
        for ref in refs:
            if opened >= CHECK_IMAGES:
                continue
            opened += 1
            problem = image_problem(ref, base)
            if problem:
                raise DataProblem(
                    f"{name}: row {n}: the image {describe(ref)} {problem}; fix or remove the row"
                )
    return found, most


def image_problem(ref: Any, base: Path) -> str | None:
    """Why an image reference cannot be used (missing, unreadable, not an image), or None. Kernel-safe:
    Pillow only."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        where, value = image_source(ref, base)
    except ImageRowError as e:
        return f"cannot be read ({e})"
    if where == "url":
        return url_problem(value)
    if where == "object":
        return None
    if where == "path" and not Path(value).is_file():
        return f"is not there (looked for {value})"
    try:
        with Image.open(value if where == "path" else io.BytesIO(value)) as im:
            if too_big := too_many_pixels(im.width, im.height):  # from the header, as the worker reads it
                return f"{too_big}, which the run would refuse; scale it down"
            im.load()
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        return f"is not a readable image ({type(e).__name__}: {str(e)[:200]})"
    return None


def _inspect_hub(
    spec: str,
    fmt: str,
    objective: str,
    columns: dict[str, str] | None,
    split: str | None,
    data_files: str | list[str] | None,
    tags: dict[str, str] | None = None,
) -> DataSource:
    """A Hub dataset: its first data file's first rows checked like a local file's (rows numbered as in
    that file), after the repo's access is checked (missing, private, gated). When the rows cannot be read
    here (offline, a loading script) the format stays as given and the worker checks them."""
    from nbtrain.control.models import hub  # huggingface_hub only when a Hub dataset is named

    try:
        sample, _note = hub.dataset_sample(spec, SAMPLE_ROWS, split=split, data_files=data_files)
    except hub.HubProblem as e:
        raise DataProblem(str(e)) from None
    if sample is None:
        return DataSource(spec, spec, "hub", fmt, 0, data_files=data_files)
    if not sample.rows:
        raise DataProblem(f"{spec}: {sample.file} has no rows")
    resolved, problem = check_rows(sample.rows, fmt, objective, columns, tags)
    if problem:
        raise DataProblem(f"{spec} ({sample.file}): {problem}")
    where = f"{spec} ({sample.file})"
    images, most = check_images(sample.rows, resolved, columns, Path.cwd(), where, tags)
    return DataSource(
        spec,
        spec,
        "hub",
        resolved,
        len(sample.rows),
        data_files=data_files,
        images=images,
        images_per_row=most,
        turn_flags=chat_facts(sample.rows, resolved, columns, tags)[0],
    )


COUNT_MAX_BYTES = 256 * 2**20  # files past this are not read through to count their rows before a start


def count_rows(source: DataSource) -> int | None:
    """How many rows a local data file holds (JSON Lines, CSV, a JSON list), read through once; None for
    what cannot be counted cheaply before a start (the Hub, a saved dataset, parquet, a big file)."""
    path = Path(source.location)
    try:
        if source.kind not in ("jsonl", "csv", "json") or path.stat().st_size > COUNT_MAX_BYTES:
            return None
        if source.kind == "json":
            rows = json.loads(path.read_text(encoding="utf-8"))
            return len(rows) if isinstance(rows, list) else None
        if source.kind == "csv":  # records, not lines: a quoted field may hold line breaks
            with path.open(encoding="utf-8", errors="replace", newline="") as f:
                return max(0, sum(1 for row in csv.reader(f) if row) - 1)
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except (OSError, ValueError, csv.Error):
        return None
