from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.rundir import (
    JsonlWriter,
    RunPaths,
    atomic_write_text,
    iter_jsonl,
    read_json,
    read_jsonl,
    tail_text,
    write_status,
)


def test_status_is_replaced_atomically_and_keeps_other_fields(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r")
    paths.make()
    write_status(paths, "running", step=3, max_steps=10, pid=123)
    write_status(paths, "running", step=4)
    st = read_json(paths.status)
    assert (st["state"], st["step"], st["max_steps"], st["pid"], st["error"]) == ("running", 4, 10, 123, None)
    assert not [p for p in paths.root.iterdir() if p.name.endswith(".tmp")]


def test_failed_status_carries_an_error_and_later_states_clear_it(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r")
    paths.make()
    write_status(paths, "failed", error={"type": "X", "message": "boom"})
    assert read_json(paths.status)["error"]["message"] == "boom"
    write_status(paths, "queued")
    assert read_json(paths.status)["error"] is None


def test_unknown_state_is_refused(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r")
    paths.make()
    with pytest.raises(ValueError, match="unknown run state"):
        write_status(paths, "exploded")


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_text(target, "old")

    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(TypeError):
        atomic_write_text(target, Boom())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_jsonl_header_names_schema_and_readers_skip_it(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl", "metrics")
    w.write({"step": 1, "loss": 2.0})
    w.close()
    first = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert first == {"schema": 1, "kind": "metrics"}
    assert read_jsonl(tmp_path / "m.jsonl") == [{"step": 1, "loss": 2.0}]


def test_iter_jsonl_resumes_from_offset_and_waits_for_partial_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    w = JsonlWriter(p, "metrics")
    w.write({"step": 1})
    w.close()
    got = list(iter_jsonl(p))
    assert [r for _, r in got] == [{"step": 1}]
    offset = got[-1][0]
    with open(p, "a") as f:
        f.write('{"step": 2}\n{"step": ')  # the writer is mid-line
    got2 = list(iter_jsonl(p, offset))
    assert [r for _, r in got2] == [{"step": 2}]
    with open(p, "a") as f:
        f.write("3}\n")
    got3 = list(iter_jsonl(p, got2[-1][0]))
    assert [r for _, r in got3] == [{"step": 3}]


def test_tail_text_reads_only_the_end(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_text("\n".join(f"line {i}" for i in range(100_000)))
    assert tail_text(p, 2) == "line 99998\nline 99999"
    assert tail_text(tmp_path / "missing", 5) == ""
