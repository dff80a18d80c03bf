"""MetricsTail: incremental reads of the run directory's JSONL files and a bounded history."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nbtrain.ui.tail as tail_mod
from nbtrain.rundir import JsonlWriter, RunPaths, atomic_write_json, write_status
from nbtrain.runs import Run
from nbtrain.ui.tail import MetricsTail, Series, downsample_minmax


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


def test_each_poll_starts_reading_at_the_end_of_what_it_already_read(
    files: RunFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets: list[int] = []
    real = tail_mod.iter_jsonl

    def spy(path: Path, offset: int = 0) -> Any:
        if path == files.paths.metrics:
            offsets.append(offset)
        return real(path, offset)

    monkeypatch.setattr(tail_mod, "iter_jsonl", spy)
    tail = MetricsTail(files.paths)
    files.steps(1, 50)
    tail.poll()
    size = files.paths.metrics.stat().st_size
    files.step(50)
    tail.poll()
    assert offsets == [0, size]


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
