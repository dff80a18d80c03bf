"""The one metrics reader: JsonlTail (incremental reads of a JSONL file) and MetricsTail (a live view's
bounded history of both files)."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nbtrain.contract.rundir import JsonlWriter, NotRegularFile, RunPaths, atomic_write_json, write_status
from nbtrain.control.runs.metrics import JsonlTail, MetricsTail, Series, downsample_minmax, read_records
from nbtrain.control.runs.run import Run


class RunFiles:
    """A run directory written with the same code a worker uses (no mocks)."""

    def __init__(
        self, root: Path, *, name: str = "demo", max_steps: int | None = None, **resolved: Any
    ) -> None:
        self.paths = RunPaths(root)
        self.paths.make()
        atomic_write_json(
            self.paths.resolved, {"config": {"model": "./tiny-llama"}, "name": name, **resolved}
        )
        write_status(self.paths, "running", step=0, max_steps=max_steps)
        self.metrics = JsonlWriter(self.paths.metrics, "metrics")
        self.system = JsonlWriter(self.paths.system, "system")
        self.t0 = time.time()

    @property
    def run(self) -> Run:
        return Run(self.paths.root)

    def step(self, i: int, **extra: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "t": self.t0 + i,
            "step": i,
            "epoch": i / 100,
            "loss": 3.0 / math.sqrt(i),
            "lr": 1e-3 * (1 - i / 1000),
            "grad_norm": 1.0 + (i % 7) / 10,
            "tokens": 512 * i,
            "tokens_per_s": 1000.0 + i,
            **extra,
        }
        self.metrics.write(rec)
        return rec

    def steps(self, a: int, b: int, **extra: Any) -> list[dict[str, Any]]:
        return [self.step(i, **extra) for i in range(a, b)]

    def sample(self, rank: int, t: float, **mem: float) -> dict[str, Any]:
        rec = {"t": self.t0 + t, "rank": rank, "rss": 1e9 + 1e6 * t, **mem}
        self.system.write(rec)
        return rec

    def status(self, state: str, **kw: Any) -> None:
        write_status(self.paths, state, **kw)

    def close(self) -> None:
        self.metrics.close()
        self.system.close()


@pytest.fixture
def files(tmp_path: Path) -> Iterator[RunFiles]:
    f = RunFiles(tmp_path / "run1", max_steps=100)
    yield f
    f.close()


def test_second_read_reads_only_the_bytes_appended_since_the_first(files: RunFiles) -> None:
    files.steps(1, 4)
    reader = JsonlTail(files.paths.metrics)
    assert [r["step"] for r in reader.read()] == [1, 2, 3]
    # Rewrite what was already read, same length, to other valid records: a reader that went back over
    # those bytes would hand out steps 7, 8, 9.
    old = files.paths.metrics.read_bytes()
    files.paths.metrics.write_bytes(
        old.replace(b'"step": 1,', b'"step": 7,').replace(b'"step": 2,', b'"step": 8,')
    )
    files.step(4)
    assert [r["step"] for r in reader.read()] == [4]
    assert reader.offset == files.paths.metrics.stat().st_size and reader.caught_up


def test_a_torn_last_line_is_left_until_it_is_whole(files: RunFiles) -> None:
    files.steps(1, 3)
    torn = '{"t": 1.0, "step": 3, "lo'
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write(torn)
    reader = JsonlTail(files.paths.metrics)
    assert [r["step"] for r in reader.read()] == [1, 2]
    assert reader.offset == files.paths.metrics.stat().st_size - len(torn)
    assert reader.read() == []
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write('ss": 0.5}\n')
    assert reader.read() == [{"t": 1.0, "step": 3, "loss": 0.5}]


def test_run_metrics_is_every_record_the_reader_returns(files: RunFiles) -> None:
    written = files.steps(1, 5)
    with open(files.paths.metrics, "ab") as f:
        f.write(b"\0" * 40 + b"\n")  # a NUL-padded line after a crash: not a record, and no error
        f.write(b'{"t": 9.0, "step": 5, "loss"')  # torn
    frame = files.run.metrics()
    assert frame["step"].tolist() == [r["step"] for r in written]
    assert frame["loss"].tolist() == [r["loss"] for r in written]
    assert frame.to_dict("records") == read_records(files.paths.metrics)
    files.sample(0, 1.0)
    assert files.run.system()["rank"].tolist() == [0]


def test_a_read_limited_to_n_records_resumes_where_it_stopped(files: RunFiles) -> None:
    files.steps(1, 11)
    reader = JsonlTail(files.paths.metrics)
    got = reader.read(max_records=4)
    assert [r["step"] for r in got] == [1, 2, 3, 4] and not reader.caught_up
    assert [r["step"] for r in reader.read()] == list(range(5, 11)) and reader.caught_up


def test_a_reader_past_the_end_of_a_replaced_file_starts_again_and_says_so(files: RunFiles) -> None:
    files.steps(1, 11)
    reader = JsonlTail(files.paths.metrics)
    reader.read()
    assert not reader.restarted
    files.close()
    files.paths.metrics.unlink()
    assert reader.read() == [] and reader.restarted and reader.offset == 0
    w = JsonlWriter(files.paths.metrics, "metrics")
    w.write({"step": 1, "loss": 9.0})
    w.close()
    assert reader.read() == [{"step": 1, "loss": 9.0}] and not reader.restarted


def test_a_fifo_in_place_of_the_metrics_file_is_refused_at_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    os.mkfifo(paths.metrics)  # nobody writes it: a plain open() would block the reader forever
    start = time.monotonic()
    with pytest.raises(NotRegularFile, match=r"metrics\.jsonl is a FIFO"):
        JsonlTail(paths.metrics, below=paths.root).read()
    with pytest.raises(NotRegularFile):
        MetricsTail(paths).poll()
    assert time.monotonic() - start < 5


def test_a_metrics_file_linked_outside_the_run_is_refused(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    outside = tmp_path / "other.jsonl"
    outside.write_text('{"step": 1, "secret": 1}\n')
    paths.metrics.symlink_to(outside)
    with pytest.raises(NotRegularFile, match=r"metrics\.jsonl is a symbolic link"):
        JsonlTail(paths.metrics).read()
    paths.metrics.unlink()
    paths.metrics.write_text("")
    (paths.root / "sub").symlink_to(tmp_path)  # a directory link on the way, under below=
    with pytest.raises(NotRegularFile, match="sub is a symbolic link, not a directory"):
        JsonlTail(paths.root / "sub" / "other.jsonl", below=paths.root).read()


def test_a_line_too_long_for_a_record_is_skipped_counted_and_never_held(files: RunFiles) -> None:
    files.steps(1, 3)
    reader = JsonlTail(files.paths.metrics, max_line=4096)
    reader.CHUNK = 1000  # several chunks per line: the skip works across chunk boundaries
    assert [r["step"] for r in reader.read()] == [1, 2]
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write('{"step": 3, "pad": "' + "x" * 10_000)  # no end yet
    assert reader.read() == [] and reader.skipped == 1
    assert len(reader._pending) == 0  # dropped as soon as it was too long, not held until its end
    size = files.paths.metrics.stat().st_size
    assert reader.offset == size  # moved past what was skipped: no later read goes over it again
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write("x" * 5000 + '"}\n')
    files.step(4)
    assert [r["step"] for r in reader.read()] == [4] and reader.skipped == 1  # one line, counted once
    assert reader.bytes_read == files.paths.metrics.stat().st_size  # every byte read once


def test_a_reader_made_afresh_inside_a_skipped_line_drops_the_rest_of_it(files: RunFiles) -> None:
    files.step(1)
    start = files.paths.metrics.stat().st_size
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        # a line too long for a record, whose end (from byte 6000 on) is itself a valid record: only a
        # reader that knows it starts inside a line can tell it is not one
        f.write("z" * (6000 - start) + '{"step": 99, "loss": 0.0}\n')
    files.step(2)
    first = JsonlTail(files.paths.metrics, max_line=4096)
    first.CHUNK = 1000
    assert [r["step"] for r in first.read(max_bytes=6000)] == [1]  # stops inside the long line
    assert first.skipped == 1 and not first.caught_up and first.offset == 6000
    again = JsonlTail(files.paths.metrics, first.offset, max_line=4096)  # what the server does per request
    assert [r["step"] for r in again.read()] == [2] and again.skipped == 0


def test_a_partial_last_line_is_completed_later_without_rereading_it(files: RunFiles) -> None:
    files.steps(1, 3)
    reader = JsonlTail(files.paths.metrics)
    reader.read()
    line = json.dumps({"t": 1.0, "step": 3, "loss": 0.5, "pad": "p" * 3000}) + "\n"
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write(line[:2000])
    before = reader.bytes_read
    for _ in range(5):  # a view polling while the line is being written
        assert reader.read() == []
    assert reader.bytes_read == before + 2000  # its start was read once, then remembered
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write(line[2000:])
    assert [r["step"] for r in reader.read()] == [3]
    assert reader.bytes_read == files.paths.metrics.stat().st_size


def test_start_at_tail_reads_only_the_last_whole_records(files: RunFiles) -> None:
    written = files.steps(1, 200)
    size = files.paths.metrics.stat().st_size
    reader = JsonlTail(files.paths.metrics)
    reader.start_at_tail(1000)
    got = reader.read()
    assert got and got == written[-len(got) :]  # whole records only: no torn first line
    assert reader.bytes_read <= 1000 and len(got) < len(written)
    # starting exactly on a line boundary keeps that line
    line = len(json.dumps(written[-1]) + "\n")
    exact = JsonlTail(files.paths.metrics)
    exact.start_at_tail(line)
    assert exact.read() == written[-1:]
    whole = JsonlTail(files.paths.metrics)
    whole.start_at_tail(size * 2)
    assert whole.read() == written


def test_a_byte_budget_goes_through_a_huge_line_over_several_reads(files: RunFiles) -> None:
    files.step(1)
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write('{"pad": "' + "x" * (5 << 20) + '"}\n')
    files.step(2)
    reader = JsonlTail(files.paths.metrics)
    got = reader.read(max_bytes=1 << 20)
    assert [r["step"] for r in got] == [1] and not reader.caught_up
    reads = 1
    while not reader.caught_up:
        got += reader.read(max_bytes=1 << 20)
        reads += 1
    assert [r["step"] for r in got] == [1, 2] and reader.skipped == 1 and reads >= 5


def test_recent_keeps_the_last_rows_whole(files: RunFiles) -> None:
    written = files.steps(1, 11)
    tail = MetricsTail(files.paths, rows=3)
    tail.poll()
    assert list(tail.recent) == written[-3:]
    assert list(MetricsTail(files.paths).recent) == []


def test_poll_returns_only_records_appended_since_the_last_poll(files: RunFiles) -> None:
    tail = MetricsTail(files.paths)
    first = files.steps(1, 6)
    assert tail.poll() == 5
    assert tail.poll() == 0
    second = files.steps(6, 9)
    assert tail.poll() == 3
    loss = tail.series("loss")
    assert loss is not None
    assert list(loss.x) == [r["step"] for r in first + second]
    assert list(loss.y) == [r["loss"] for r in first + second]
    assert tail.records == 8
    assert tail.last["loss"] == second[-1]["loss"]
    assert tail.first["loss"] == first[0]["loss"]


def test_each_poll_starts_reading_at_the_end_of_what_it_already_read(files: RunFiles) -> None:
    tail = MetricsTail(files.paths)
    files.steps(1, 50)
    tail.poll()
    size = files.paths.metrics.stat().st_size
    assert tail._metrics_file.bytes_read == size
    files.step(50)
    tail.poll()
    assert tail._metrics_file.bytes_read == files.paths.metrics.stat().st_size  # each byte read once


def test_a_poll_with_a_byte_budget_reads_part_and_says_it_is_not_caught_up(files: RunFiles) -> None:
    files.steps(1, 101)
    tail = MetricsTail(files.paths)
    polls = 0
    while True:
        tail.poll(max_bytes=1000)
        polls += 1
        if tail.caught_up:
            break
    loss = tail.series("loss")
    assert loss is not None and list(loss.x) == list(range(1, 101))
    assert polls > 5


def test_half_written_last_line_is_read_once_it_is_complete(files: RunFiles) -> None:
    tail = MetricsTail(files.paths)
    files.steps(1, 3)
    line = json.dumps({"t": 1.0, "step": 3, "loss": 0.5}) + "\n"
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write(line[:15])
    assert tail.poll() == 2
    assert tail.poll() == 0
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write(line[15:])
    assert tail.poll() == 1
    loss = tail.series("loss")
    assert loss is not None
    assert list(loss.x) == [1, 2, 3]
    assert loss.y[-1] == 0.5


def test_history_of_100k_steps_stays_bounded_and_keeps_first_last_and_extremes(files: RunFiles) -> None:
    n, cap = 100_000, 2000
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        for i in range(1, n + 1):
            value = 2.0 + math.sin(i / 500)
            if i == 31_337:
                value = 50.0  # a spike
            if i == 77_777:
                value = -1.0  # a dip
            f.write(json.dumps({"t": float(i), "step": i, "loss": value, "lr": 1e-4}) + "\n")
    tail = MetricsTail(files.paths, cap=cap)
    tail.poll()
    for key in ("loss", "lr"):
        s = tail.series(key)
        assert s is not None
        assert len(s) <= cap
        assert s.seen == n
        assert s.x[0] == 1 and s.x[-1] == n
    loss = tail.series("loss")
    assert loss is not None
    assert loss.y.max() == 50.0 and loss.x[np.argmax(loss.y)] == 31_337
    assert loss.y.min() == -1.0 and loss.x[np.argmin(loss.y)] == 77_777
    assert np.all(np.diff(loss.x) > 0)
    # the reduced part stays spread over the whole run, not squeezed towards its end
    assert np.max(np.diff(loss.x)) < n / 200


def test_history_stays_bounded_when_read_in_many_small_polls(files: RunFiles) -> None:
    tail = MetricsTail(files.paths, cap=64)
    for a in range(1, 2001, 50):
        files.steps(a, a + 50)
        tail.poll()
        loss = tail.series("loss")
        assert loss is not None
        assert len(loss) <= 64
    assert loss is not None
    assert loss.x[0] == 1 and loss.x[-1] == 2000
    assert loss.y[0] == 3.0  # the first loss is the largest here, and survives


def test_downsample_keeps_a_gap_where_a_whole_bucket_is_nan() -> None:
    x = np.arange(1000, dtype=np.float64)
    y = np.ones(1000)
    y[400:600] = np.nan
    keep = downsample_minmax(x, y, 20)
    assert len(keep) <= 42
    assert np.isnan(y[keep]).any()
    assert keep[0] == 0 and keep[-1] == 999


def test_series_rejects_a_cap_too_small_to_reduce() -> None:
    with pytest.raises(ValueError, match="cap"):
        Series(cap=4)


def test_any_other_numeric_key_is_available_by_name(files: RunFiles) -> None:
    files.step(1, **{"rewards/margins": 0.25, "note": "text", "flag": True})
    files.step(2, **{"rewards/margins": 0.5})
    tail = MetricsTail(files.paths)
    tail.poll()
    margins = tail.series("rewards/margins")
    assert margins is not None
    assert list(margins.y) == [0.25, 0.5]
    assert tail.series("note") is None and tail.series("flag") is None
    assert "rewards/margins" in tail.keys


def test_memory_is_kept_per_rank_against_time(files: RunFiles) -> None:
    a = files.sample(0, 1.0)
    b = files.sample(1, 1.5, gpu_mem_alloc=2e9, gpu_mem_reserved=3e9, gpu_mem_peak=2.5e9)
    c = files.sample(0, 2.0)
    tail = MetricsTail(files.paths)
    tail.poll()
    assert tail.ranks == [0, 1]
    rss0 = tail.memory(0, "rss")
    assert rss0 is not None
    assert list(rss0.x) == [a["t"], c["t"]] and list(rss0.y) == [a["rss"], c["rss"]]
    peak1 = tail.memory(1, "gpu_mem_peak")
    assert peak1 is not None and list(peak1.y) == [b["gpu_mem_peak"]]
    assert tail.memory(0, "gpu_mem_alloc") is None


def test_records_with_non_finite_coordinates_do_not_break_the_tail(files: RunFiles) -> None:
    # json.loads turns 1e400 into inf and NaN into nan: a bad line must not stop the live view
    with open(files.paths.system, "a", encoding="utf-8") as f:
        f.write('{"t": 1.0, "rank": 1e400, "rss": 5}\n{"t": NaN, "rank": 0, "rss": 6}\n')
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write('{"t": 1.0, "step": 1e400, "loss": NaN}\n')
    tail = MetricsTail(files.paths)
    tail.poll()
    rss = tail.memory(0, "rss")
    assert rss is not None and list(rss.y) == [5.0]
    loss = tail.series("loss")
    assert loss is not None and np.isnan(loss.y[0])


def test_a_replaced_file_resets_the_history(files: RunFiles) -> None:
    files.steps(1, 11)
    tail = MetricsTail(files.paths)
    tail.poll()
    files.close()
    files.paths.metrics.unlink()
    w = JsonlWriter(files.paths.metrics, "metrics")
    w.write({"t": 1.0, "step": 1, "loss": 9.0})
    w.close()
    tail.poll()
    loss = tail.series("loss")
    assert loss is not None and list(loss.y) == [9.0]


def test_speed_comes_from_recent_records_and_start_from_launch_json(files: RunFiles) -> None:
    files.steps(1, 11)  # one step per second
    tail = MetricsTail(files.run)
    tail.poll()
    assert tail.steps_per_second() == pytest.approx(1.0)
    assert tail.started() == files.t0 + 1
    atomic_write_json(files.paths.launch, {"start_time": files.t0 - 30})
    assert tail.started() == files.t0 - 30


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    tail = MetricsTail(tmp_path / "nothing-here")
    assert tail.poll() == 0
    assert tail.keys == [] and tail.ranks == [] and tail.started() is None
