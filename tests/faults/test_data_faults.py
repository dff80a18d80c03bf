"""Data files that cannot be read (issue 2/9): invalid UTF-8, rows nested 100k deep, a truncated parquet, a
row far too long. The kernel's check and the worker's loader each give one error naming the file, the row
and the cause, never a decoder, recursion or Arrow traceback. Fast: nothing trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.contract import formats
from nbtrain.control.prepare import validate
from nbtrain.examples import write_dataset
from nbtrain.worker.data import DataError, load_raw


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_dataset(tmp_path / "add.jsonl")
    return tmp_path


def config_for(path: Path) -> str:
    return (
        f"model: ./tiny-llama\nmethod: lora\ndata:\n  train: {path}\n  format: auto\ntrain:\n  max_steps: 2\n"
    )


def check_problem(workdir: Path, path: Path) -> str:
    (problem,) = [p for p in validate(config_for(path)) if p.path.startswith("data")]
    return problem.message


def good_lines(data: Path) -> bytes:
    return (data / "add.jsonl").read_bytes()


def test_invalid_utf8_is_named_by_line_in_the_check_and_in_the_worker(workdir: Path, data: Path) -> None:
    bad = data / "bytes.jsonl"
    bad.write_bytes(good_lines(data)[:400].rsplit(b"\n", 1)[0] + b'\n{"text": "\xff\xfe"}\n')
    lineno = bad.read_bytes().count(b"\n")
    assert f"line {lineno} of bytes.jsonl is not UTF-8 text" in check_problem(workdir, bad)
    for streaming in (False, True):
        with pytest.raises(DataError, match=f"line {lineno} of bytes.jsonl is not UTF-8 text"):
            load_raw(str(bad), "jsonl", streaming=streaming)


def test_a_row_nested_100k_deep_is_refused_by_line(workdir: Path, data: Path) -> None:
    deep = data / "deep.jsonl"
    deep.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + good_lines(data).decode())
    assert "line 1 of deep.jsonl is nested too deeply" in check_problem(workdir, deep)
    with pytest.raises(DataError, match=r"line 1 of deep\.jsonl is nested too deeply"):
        load_raw(str(deep), "jsonl")


def test_a_truncated_parquet_names_the_file_and_the_fix(workdir: Path, data: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in good_lines(data).decode().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), data / "whole.parquet")
    whole = (data / "whole.parquet").read_bytes()
    cut = data / "cut.parquet"
    cut.write_bytes(whole[: len(whole) // 2])
    message = check_problem(workdir, cut)
    assert "cannot read cut.parquet as parquet" in message and "truncated or corrupt" in message
    with pytest.raises(DataError, match=r"cannot read .*cut\.parquet as parquet"):
        load_raw(str(cut), "parquet")


def test_a_row_over_the_size_bound_is_refused_without_reading_it_whole(
    workdir: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats, "MAX_ROW_BYTES", 4096)  # the bound, small: the rule is what is tested
    big = data / "big.jsonl"
    big.write_bytes(good_lines(data) + b'{"text": "' + b"x" * 10_000 + b'"}\n')
    lineno = big.read_bytes().count(b"\n")
    assert f"line {lineno} of big.jsonl is over" in check_problem(workdir, big)
    with pytest.raises(DataError, match=f"line {lineno} of big.jsonl is over"):
        load_raw(str(big), "jsonl")
    at_bound = data / "at.jsonl"  # exactly the bound, its newline past it: a row like any other
    at_bound.write_bytes(b'{"text": "' + b"y" * (4096 - 12) + b'"}\n')
    assert len(at_bound.read_bytes()) == 4097
    assert load_raw(str(at_bound), "jsonl").num_rows == 1
