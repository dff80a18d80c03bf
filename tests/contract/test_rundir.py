from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract import rundir
from nbtrain.contract.rundir import (
    JsonlWriter,
    NotRegularFile,
    RunPaths,
    atomic_write_text,
    iter_jsonl,
    open_regular,
    read_json,
    read_jsonl,
    read_tail,
    request_control,
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


def test_nan_and_infinity_are_written_as_valid_json_and_flagged(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    w = JsonlWriter(paths.metrics, "metrics")
    w.write({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "lr": 0.1})
    w.close()
    line = paths.metrics.read_text(encoding="utf-8").splitlines()[-1]
    assert "NaN" not in line and "Infinity" not in line
    rec = json.loads(line)  # strict JSON, as the browser parses it
    assert rec == {"step": 1, "loss": None, "grad_norm": None, "lr": 0.1, "nonfinite": ["loss", "grad_norm"]}
    write_status(paths, "failed", summary={"train_loss": float("nan")})
    assert json.loads(paths.status.read_text(encoding="utf-8"))["summary"]["train_loss"] is None


def test_a_nul_padded_or_undecodable_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "metrics.jsonl"
    f.write_bytes(b'{"step": 1, "loss": 2.0}\n' + b"\x00" * 64 + b"\n" + b"\xff\xfe{bad\n" + b'{"step": 2}\n')
    assert [r["step"] for r in read_jsonl(f)] == [1, 2]


# ----------------------------------------------------------------- files that are not regular files


def returns_within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread; fails (instead of hanging the suite) when it has not returned in time."""
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test below
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_fifo_is_refused_at_once_by_every_reader_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.log"
    os.mkfifo(fifo)  # nobody writes it: a plain open() would wait for a writer forever
    with pytest.raises(NotRegularFile, match=r"rank0\.log is a FIFO \(named pipe\), not a regular file"):
        returns_within(5, lambda: open_regular(fifo))
    with pytest.raises(NotRegularFile):
        returns_within(5, lambda: read_json(fifo))
    with pytest.raises(NotRegularFile):
        returns_within(5, lambda: list(iter_jsonl(fifo)))
    with pytest.raises(NotRegularFile):
        returns_within(5, lambda: read_tail(fifo))
    assert "is a FIFO" in returns_within(5, lambda: tail_text(fifo))  # a message, for error reports


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("secret\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.log").symlink_to(secret)
    with pytest.raises(NotRegularFile, match="is a symbolic link"):
        open_regular(run / "rank0.log")
    assert "secret" not in tail_text(run / "rank0.log") and "symbolic link" in tail_text(run / "rank0.log")
    # with below=, a directory link on the way is refused too
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rank0.log").write_text("secret\n")
    (run / "logs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotRegularFile, match=r"logs is a symbolic link, not a directory"):
        open_regular(run / "logs" / "rank0.log", below=run)
    assert open_regular(run / "logs" / "rank0.log").read() == b"secret\n"  # without below: only the file
    (run / "real").mkdir()
    (run / "real" / "f").write_text("ok")
    with open_regular(run / "real" / "f", below=run) as f:
        assert f.read() == b"ok"
    with pytest.raises(FileNotFoundError):
        open_regular(run / "real" / "missing", below=run)
    with pytest.raises(NotRegularFile, match="is a directory"):
        open_regular(run / "real")


def test_read_json_is_bounded_and_a_too_deep_file_is_a_value_error(tmp_path: Path) -> None:
    big = tmp_path / "status.json"
    big.write_text(json.dumps({"pad": "x" * 5000}))
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        read_json(big, max_bytes=1000)
    assert read_json(big, max_bytes=10_000)["pad"] == "x" * 5000
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deep"):
        read_json(deep)


def test_a_line_longer_than_any_record_is_skipped_and_reading_goes_on(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    long_line = json.dumps({"step": 2, "pad": "x" * 5000}) + "\n"
    p.write_text('{"step": 1}\n' + long_line + '{"step": 3}\n' + "y" * 3000)
    got = list(iter_jsonl(p, max_line=1000))
    assert [r["step"] for _, r in got] == [1, 3]
    assert got[-1][0] == p.stat().st_size - 3000  # the unterminated tail is left for later
    assert [r["step"] for _, r in iter_jsonl(p)] == [1, 2, 3]  # the default bound is far above a record


def test_a_control_request_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    paths.control.mkdir(exist_ok=True)
    paths.control_file("stop").symlink_to(victim)
    request_control(paths, "stop")
    assert victim.read_text() == "keep me"
    assert not paths.control_file("stop").is_symlink() and float(paths.control_file("stop").read_text()) > 0
    os.mkfifo(paths.control_file("checkpoint"))  # writing a FIFO would wait for a reader forever
    returns_within(5, lambda: request_control(paths, "checkpoint"))
    assert paths.control_file("checkpoint").is_file()


# ------------------------------------------------------------------------------ checkpoints


def write_checkpoint(paths: RunPaths, step: int, *, state: bool = True, marked: bool = True) -> Path:
    """A checkpoint-N as the Trainer leaves it (trainer_state.json written last), and the worker's mark."""
    d = paths.checkpoints / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"w" * 64)
    if state:
        (d / rundir.TRAINER_STATE).write_text(json.dumps({"global_step": step}))
    if marked:
        rundir.mark_complete(d)
    return d


def test_an_unmarked_checkpoint_holding_a_whole_trainer_state_is_marked_on_repair(
    tmp_path: Path,
) -> None:
    # A kill after the Trainer's last write, before the worker's mark, with the older one rotated away.
    paths = RunPaths(tmp_path)
    only = write_checkpoint(paths, 8, marked=False)
    assert rundir.latest_complete_checkpoint(paths) == only
    assert rundir.latest_complete_checkpoint(paths, repair=True) == only
    assert (only / rundir.COMPLETE_MARKER).is_file() and (only / "adapter_model.safetensors").exists()


def test_repair_deletes_only_remnants_without_a_whole_trainer_state(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    good = write_checkpoint(paths, 4)
    cut = write_checkpoint(paths, 6, state=False, marked=False)  # killed while written
    wrong = write_checkpoint(paths, 7, marked=False)
    (wrong / rundir.TRAINER_STATE).write_text('{"global_step": 3}')  # a copy, not this step's state
    torn = write_checkpoint(paths, 9, marked=False)
    (torn / rundir.TRAINER_STATE).write_text('{"global_st')
    assert rundir.latest_complete_checkpoint(paths) == good  # reading changes nothing
    assert cut.exists() and torn.exists()
    assert rundir.latest_complete_checkpoint(paths, repair=True) == good
    assert good.exists() and not cut.exists() and not wrong.exists() and not torn.exists()


def test_rotation_keeps_the_newest_complete_the_best_and_anything_newer(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    for step in (1, 2, 3, 4):
        write_checkpoint(paths, step)
    remnant = write_checkpoint(paths, 0, state=False, marked=False)
    being_written = write_checkpoint(paths, 5, state=False, marked=False)
    gone = rundir.rotate_checkpoints(paths, 1, also_keep=paths.checkpoints / "checkpoint-2")
    assert sorted(d.name for d in gone) == ["checkpoint-0", "checkpoint-1", "checkpoint-3"]
    left = sorted(d.name for _, d in rundir.checkpoints(paths))
    assert left == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    assert not remnant.exists() and being_written.exists()


def test_rotation_never_removes_the_only_complete_checkpoint(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    only = write_checkpoint(paths, 3)
    newer = write_checkpoint(paths, 4, marked=False)  # saved, not yet marked: rotation must wait for it
    assert rundir.rotate_checkpoints(paths, 1) == []
    assert only.exists() and newer.exists()
    assert rundir.rotate_checkpoints(paths, 0) == []  # keep: 0 still keeps the newest complete one


def test_a_removal_cut_short_leaves_nothing_that_reads_as_a_checkpoint(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    keep = write_checkpoint(paths, 3)
    half = paths.checkpoints / ".removing-checkpoint-2"  # killed inside remove_checkpoint's rmtree
    half.mkdir()
    (half / rundir.TRAINER_STATE).write_text(json.dumps({"global_step": 2}))
    assert [d for _, d in rundir.checkpoints(paths)] == [keep]
    assert rundir.latest_complete_checkpoint(paths, repair=True) == keep and not half.exists()
    rundir.remove_checkpoint(keep)
    assert not keep.exists() and list(paths.checkpoints.iterdir()) == []
