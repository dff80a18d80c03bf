"""Static figures: the dashboard layout, run comparison and Run.plot()."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nbtrain.runs import RunStatus
from nbtrain.ui.figures import GIB, build_figure, compare_figure, run_plot
from nbtrain.ui.tail import MetricsTail
from tests.ui.test_tail import RunFiles


@pytest.fixture
def files(tmp_path: Path) -> Iterator[RunFiles]:
    f = RunFiles(tmp_path / "run1", name="sft-demo", max_steps=100)
    yield f
    f.close()


def by_name(fig: Any) -> dict[str, Any]:
    return {t.name: t for t in fig.data}


def test_figure_has_a_trace_per_series_holding_the_files_data(files: RunFiles) -> None:
    recs = files.steps(1, 11)
    files.step(11, eval_loss=1.5)
    recs.append(files.steps(12, 13)[0])
    s0 = [files.sample(0, t) for t in (0.0, 30.0, 60.0)]
    s1 = files.sample(1, 30.0, gpu_mem_alloc=2 * GIB, gpu_mem_reserved=3 * GIB, gpu_mem_peak=2.5 * GIB)
    tail = MetricsTail(files.paths)
    tail.poll()
    fig = build_figure(tail, RunStatus("running", step=12, max_steps=100))
    traces = by_name(fig)
    assert set(traces) == {
        "loss",
        "eval_loss",
        "lr",
        "grad_norm",
        "tokens/s",
        "rank 0 RSS",
        "rank 1 RSS",
        "rank 1 GPU allocated",
        "rank 1 GPU reserved",
        "rank 1 GPU peak",
    }
    steps = [r["step"] for r in recs[:10]] + [11] + [12]
    assert list(traces["loss"].x) == steps
    assert list(traces["lr"].x) == steps
    assert list(traces["eval_loss"].x) == [11] and list(traces["eval_loss"].y) == [1.5]
    assert list(traces["grad_norm"].y)[:10] == [r["grad_norm"] for r in recs[:10]]
    assert list(traces["tokens/s"].y)[:10] == [r["tokens_per_s"] for r in recs[:10]]
    # memory in GiB against minutes since the run started (here: its first record, no launch.json)
    rss0 = traces["rank 0 RSS"]
    start = min(s0[0]["t"], recs[0]["t"])
    assert np.allclose(rss0.x, [(r["t"] - start) / 60 for r in s0])
    assert np.allclose(rss0.y, [r["rss"] / GIB for r in s0])
    assert np.allclose(traces["rank 1 GPU peak"].y, [s1["gpu_mem_peak"] / GIB])
    # loss and eval_loss share the top panel; memory traces share theirs
    assert traces["loss"].xaxis == traces["eval_loss"].xaxis
    assert traces["rank 0 RSS"].yaxis == traces["rank 1 GPU peak"].yaxis != traces["loss"].yaxis
    assert not fig.layout.shapes


def test_memory_estimate_is_a_horizontal_line_on_the_memory_panel(files: RunFiles) -> None:
    files.sample(0, 1.0)
    tail = MetricsTail(files.paths)
    tail.poll()
    fig = build_figure(tail, RunStatus("running"), estimate_bytes=6 * GIB)
    (line,) = fig.layout.shapes
    assert line.y0 == line.y1 == 6.0
    assert line.yref == by_name(fig)["rank 0 RSS"].yaxis


def test_title_shows_state_progress_elapsed_eta_and_last_loss(files: RunFiles) -> None:
    files.steps(1, 11)  # one step per second
    tail = MetricsTail(files.paths)
    tail.poll()
    st = RunStatus("running", step=10, max_steps=100)
    title = build_figure(tail, st, name="sft-demo", now=files.t0 + 1 + 125).layout.title.text
    assert "sft-demo" in title and "running" in title
    assert "step 10/100" in title
    assert "elapsed 2:05" in title
    assert "ETA 1:30" in title  # 90 steps left at 1 step/s
    assert f"loss {3.0 / 10**0.5:.4f}" in title


def test_title_of_a_failed_run_shows_its_error_and_no_eta(files: RunFiles) -> None:
    files.steps(1, 5)
    tail = MetricsTail(files.paths)
    tail.poll()
    err = {"type": "OutOfMemoryError", "message": "CUDA out of memory <tried 2 GiB>"}
    st = RunStatus("failed", step=4, max_steps=100, error=err, updated=files.t0 + 10)
    title = build_figure(tail, st).layout.title.text
    assert "failed" in title and "ETA" not in title
    assert "OutOfMemoryError" in title and "&lt;tried 2 GiB&gt;" in title
    assert "elapsed 0:09" in title  # stops at the final status write


def test_figure_of_a_run_without_records_has_empty_core_traces(files: RunFiles) -> None:
    tail = MetricsTail(files.paths)
    tail.poll()
    fig = build_figure(tail, RunStatus("queued"))
    assert [t.name for t in fig.data] == ["loss", "lr", "grad_norm", "tokens/s"]
    assert all(len(t.x) == 0 for t in fig.data)


def test_extra_keys_get_panels_of_their_own(files: RunFiles) -> None:
    files.step(1, **{"rewards/margins": 0.5, "rewards/accuracies": 0.75})
    tail = MetricsTail(files.paths)
    tail.poll()
    extra = ("rewards/margins", "rewards/accuracies", "lr", "rewards/margins")  # repeats are dropped
    fig = build_figure(tail, RunStatus("running"), extra=extra)
    assert len(fig.data) == 6
    traces = by_name(fig)
    assert list(traces["rewards/margins"].y) == [0.5]
    assert traces["rewards/margins"].yaxis != traces["rewards/accuracies"].yaxis
    titles = {a.text for a in fig.layout.annotations}
    assert {"rewards/margins", "rewards/accuracies"} <= titles


def test_compare_figure_overlays_the_loss_of_each_run_labelled_by_name_and_id(tmp_path: Path) -> None:
    a = RunFiles(tmp_path / "run-a", name="lr-high")
    b = RunFiles(tmp_path / "run-b", name="lr-low")
    ra = a.steps(1, 6)
    rb = b.steps(1, 9)
    b.step(9, eval_loss=0.7)
    fig = compare_figure([a.run, b.run])
    traces = by_name(fig)
    assert list(traces["lr-high (run-a)"].y) == [r["loss"] for r in ra]
    assert list(traces["lr-low (run-b)"].x) == [r["step"] for r in rb] + [9]
    assert list(traces["lr-low (run-b) eval_loss"].y) == [0.7]
    assert len(fig.data) == 3
    a.close()
    b.close()


def test_run_plot_reads_the_whole_run_and_its_recorded_estimate(tmp_path: Path) -> None:
    f = RunFiles(tmp_path / "run1", name="plotted", estimate={"per_device_bytes": 4 * GIB})
    recs = f.steps(1, 21)
    f.sample(0, 1.0)
    f.status("completed", step=20, max_steps=20)
    fig = run_plot(f.run)
    assert list(by_name(fig)["loss"].y) == [r["loss"] for r in recs]
    assert fig.layout.shapes[0].y0 == 4.0
    assert "completed" in fig.layout.title.text and "plotted" in fig.layout.title.text
    f.close()


def test_figure_of_a_long_run_stays_small(tmp_path: Path) -> None:
    f = RunFiles(tmp_path / "long")
    f.steps(1, 20_001)
    tail = MetricsTail(f.paths, cap=500)
    tail.poll()
    fig = build_figure(tail, RunStatus("running", step=20_000))
    assert all(len(t.x) <= 500 for t in fig.data)
    assert len(fig.to_json()) < 100_000
    f.close()
