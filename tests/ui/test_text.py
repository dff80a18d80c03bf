"""Plain-text views: the last metric of a run is read from the end of its file, bounded, and a file that
cannot be read leaves the run listed without it."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from nbtrain.contract.rundir import JsonlWriter, RunPaths, atomic_write_json, write_status
from nbtrain.control.runs.run import Run
from nbtrain.ui.text import TAIL_BYTES, last_metric, runs_table


def run_dir(tmp_path: Path, name: str = "r1") -> RunPaths:
    paths = RunPaths(tmp_path / "runs" / name)
    paths.make()
    atomic_write_json(paths.resolved, {"id": name, "name": name, "config": {}})
    write_status(paths, "running", step=1, max_steps=10)
    return paths


def test_last_metric_is_the_last_logged_value_read_from_the_end(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    w = JsonlWriter(paths.metrics, "metrics")
    for step in range(1, 12001):  # more than TAIL_BYTES of records
        w.write({"step": step, "loss": 1.0 / step, "lr": 0.1})
    w.write({"step": 12000, "eval_loss": 0.25})  # the last record has no loss: the one before counts
    w.close()
    assert paths.metrics.stat().st_size > 2 * TAIL_BYTES
    run = Run(paths.root)
    assert last_metric(run) == 1.0 / 12000
    assert last_metric(run, "eval_loss") == 0.25
    assert last_metric(run, "missing") is None


def test_a_key_logged_only_early_is_found_further_back(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    w = JsonlWriter(paths.metrics, "metrics")
    w.write({"step": 0, "train_runtime": 12.5})
    for step in range(1, 12001):
        w.write({"step": step, "loss": 1.0})
    w.close()
    assert last_metric(Run(paths.root), "train_runtime") == 12.5


def test_a_loss_that_went_nan_reads_as_nan_not_an_error(tmp_path: Path) -> None:
    paths = run_dir(tmp_path)
    w = JsonlWriter(paths.metrics, "metrics")
    w.write({"step": 1, "loss": 2.0})
    w.write({"step": 2, "loss": float("nan")})  # written as null, named in "nonfinite"
    w.close()
    loss = last_metric(Run(paths.root))
    assert loss is not None and math.isnan(loss)


def test_a_huge_line_a_fifo_or_a_link_leave_the_run_listed_without_its_loss(tmp_path: Path) -> None:
    huge, fifo, link = (run_dir(tmp_path, n) for n in ("huge", "fifo", "link"))
    with open(huge.metrics, "wb") as f:
        f.write(b'{"step": 1, "loss": 3.0}\n{"pad": "' + b"x" * (8 << 20) + b'"}\n{"step": 2, "loss": 2.0}\n')
    os.mkfifo(fifo.metrics)
    (tmp_path / "elsewhere.jsonl").write_text('{"step": 1, "loss": 7.0}\n')
    link.metrics.symlink_to(tmp_path / "elsewhere.jsonl")
    runs = [Run(p.root) for p in (huge, fifo, link)]
    assert last_metric(runs[0]) == 2.0
    assert last_metric(runs[1]) is None and last_metric(runs[2]) is None
    table = runs_table(runs)
    assert table["name"].tolist() == ["huge", "fifo", "link"]
    assert table["loss"].tolist()[0] == 2.0 and table["loss"].isna().tolist()[1:] == [True, True]


def test_runs_table_created_is_when_the_run_was_created_not_its_last_change(tmp_path: Path) -> None:
    from nbtrain.control.runs import registry

    made = time.time() - 3 * 86400  # registered three days ago; its directory changes today
    paths = run_dir(tmp_path, "20240102-030405-old-beef")
    registry.add("20240102-030405-old-beef", "old", paths.root, created=made)
    write_status(paths, "stopped", step=2, max_steps=10)  # a change now: st_ctime is today
    (paths.root / "touched").write_text("x")
    # outside the runs root, unregistered: the time in its id
    unregistered = run_dir(tmp_path / "elsewhere", "20230506-070809-copied-cafe")
    table = runs_table([Run(paths.root), Run(unregistered.root)])
    assert table["created"].tolist() == [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(made)),
        "2023-05-06 07:08:09",
    ]
