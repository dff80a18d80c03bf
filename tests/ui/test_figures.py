"""Static figures: the dashboard layout, run comparison, Run.plot(), and the rules a designer set for them
(one step axis, titled axes, distinct colours, smoothed throughput, a comparable estimate line, a stable
ETA, elapsed over every attempt, the phase before the first step, one theme)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import plotly.io as pio
import pytest

from nbtrain.contract.rundir import atomic_write_json
from nbtrain.control.memory import CUDA_CONTEXT_BYTES
from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.control.runs.run import RunStatus
from nbtrain.ui.figures import (
    CPU_RUNTIME_BYTES,
    GIB,
    THEME,
    build_figure,
    compare_figure,
    ema,
    memory_line,
    progress,
    run_plot,
    throughput_top,
)
from tests.control.runs.test_metrics import RunFiles


@pytest.fixture
def files(tmp_path: Path) -> Iterator[RunFiles]:
    f = RunFiles(tmp_path / "run1", name="sft-demo", max_steps=100)
    yield f
    f.close()


def by_name(fig: Any) -> dict[str, Any]:
    return {t.name: t for t in fig.data}


def by_key(fig: Any) -> dict[tuple[str, ...], Any]:
    return {tuple(t.meta): t for t in fig.data}


def polled(files: RunFiles) -> MetricsTail:
    tail = MetricsTail(files.paths)
    tail.poll()
    return tail


def named(fig: Any, name: str) -> list[Any]:
    return [a for a in fig.layout.annotations if a.name == name]


def test_figure_has_a_trace_per_series_holding_the_files_data(files: RunFiles) -> None:
    recs = files.steps(1, 11)
    files.step(11, eval_loss=1.5)
    recs.append(files.steps(12, 13)[0])
    s0 = [files.sample(0, t) for t in (0.5, 4.5, 9.0)]
    s1 = files.sample(1, 6.0, gpu_mem_alloc=2 * GIB, gpu_mem_reserved=3 * GIB, gpu_mem_peak=2.5 * GIB)
    fig = build_figure(polled(files), RunStatus("running", step=12, max_steps=100))
    traces = by_key(fig)
    assert set(traces) == {
        ("metric", "loss"),
        ("smooth", "loss"),
        ("metric", "eval_loss"),
        ("metric", "lr"),
        ("metric", "grad_norm"),
        ("metric", "tokens_per_s"),
        ("smooth", "tokens_per_s"),
        ("memory", "0", "rss"),
        ("memory", "1", "rss"),
        ("memory", "1", "gpu_mem_alloc"),
        ("memory", "1", "gpu_mem_reserved"),
        ("memory", "1", "gpu_mem_peak"),
    }
    steps = [r["step"] for r in recs[:10]] + [11] + [12]
    assert list(traces[("metric", "loss")].x) == steps
    assert list(traces[("metric", "lr")].x) == steps
    assert list(traces[("metric", "eval_loss")].x) == [11] and list(traces[("metric", "eval_loss")].y) == [
        1.5
    ]
    assert list(traces[("metric", "grad_norm")].y)[:10] == [r["grad_norm"] for r in recs[:10]]
    assert list(traces[("metric", "tokens_per_s")].y)[:10] == [r["tokens_per_s"] for r in recs[:10]]
    # memory in GiB on the step axis: a sample half-way between steps 4 and 5 is drawn at 4.5; one taken
    # before the first step, between the run's start (its first record here, no launch.json) and step 1
    rss0 = traces[("memory", "0", "rss")]
    assert np.allclose(rss0.x, [0.0, 4.5, 9.0])
    assert np.allclose(rss0.y, [r["rss"] / GIB for r in s0])
    assert np.allclose(traces[("memory", "1", "gpu_mem_peak")].y, [s1["gpu_mem_peak"] / GIB])
    # the hover says when: the run's elapsed time at that step
    # (counted from the first record, the sample at 0.5 s: there is no launch.json here)
    assert list(traces[("metric", "loss")].customdata[:3]) == ["0:00 elapsed", "0:01 elapsed", "0:02 elapsed"]
    assert "%{customdata}" in traces[("metric", "loss")].hovertemplate
    # loss and eval_loss share the top panel; memory traces share theirs
    assert traces[("metric", "loss")].xaxis == traces[("metric", "eval_loss")].xaxis
    rss, peak = traces[("memory", "0", "rss")], traces[("memory", "1", "gpu_mem_peak")]
    assert rss.yaxis == peak.yaxis != traces[("metric", "loss")].yaxis


def test_every_panel_is_against_the_step_with_titled_axes(files: RunFiles) -> None:
    files.steps(1, 5)
    files.sample(0, 2.0)
    fig = build_figure(polled(files), RunStatus("running", step=4), extra=("rewards/margins",))
    xaxes = sorted((k for k in fig.layout if k.startswith("xaxis")), key=lambda k: int(k[5:] or 1))
    yaxes = sorted((k for k in fig.layout if k.startswith("yaxis")), key=lambda k: int(k[5:] or 1))
    assert len(xaxes) == len(yaxes) == 6
    assert {fig.layout[x].title.text for x in xaxes} == {"step"}
    # one x-axis: every panel zooms with the loss panel's
    assert all(fig.layout[x].matches == "x" for x in xaxes if x != "xaxis")
    ytitles = [fig.layout[y].title.text for y in yaxes]
    assert ytitles == ["loss", "learning rate", "L2 norm", "tokens/s", "GiB", "rewards/margins"]
    assert by_key(fig)[("memory", "0", "rss")].xaxis == "x5"  # memory too: no axis of minutes


def test_each_curve_has_a_colour_of_its_own(files: RunFiles) -> None:
    files.steps(1, 4)
    files.step(4, eval_loss=1.0)
    for t in (1.0, 2.0):
        files.sample(0, t)
        files.sample(1, t)
    fig = build_figure(polled(files), RunStatus("running"), estimate_bytes=GIB)
    colours: dict[str, set[str]] = {}
    for trace in fig.data:
        panel = trace.meta[-1] if trace.meta[0] != "memory" else f"rank {trace.meta[1]}"
        colours.setdefault(trace.line.color, set()).add(panel)
    # one colour per metric or rank (throughput's raw and smoothed lines are the same metric)
    assert all(len(panels) == 1 for panels in colours.values()), colours
    loss = by_key(fig)[("metric", "loss")].line.color
    assert loss != by_key(fig)[("memory", "0", "rss")].line.color


def test_throughput_is_smoothed_over_recent_steps_with_the_raw_values_faint(files: RunFiles) -> None:
    assert throughput_top(polled(files)) is None  # no throughput yet: plotly's own axis
    rng = random.Random(1)
    raw = [1000.0 + rng.choice((-1, 1)) * rng.uniform(200, 800) for _ in range(60)]
    for i, v in enumerate(raw, start=1):
        files.step(i, tokens_per_s=v)
    fig = build_figure(polled(files), RunStatus("running", step=60))
    per_step, smooth = by_key(fig)[("metric", "tokens_per_s")], by_key(fig)[("smooth", "tokens_per_s")]
    assert list(per_step.y) == raw and per_step.opacity < 0.5 < smooth.opacity
    assert smooth.line.width > per_step.line.width
    s = np.asarray(smooth.y)
    assert np.allclose(s, ema(np.asarray(raw)))
    assert np.std(np.diff(s[10:])) < np.std(np.diff(raw[10:])) / 5  # smooth, not the spikes
    # every value under the axis's top: nothing to say about spikes
    assert max(raw) < fig.layout.yaxis4.range[1]
    assert not [a for a in fig.layout.annotations if a.name == "throughput-peak"]
    assert abs(s[-20:].mean() - np.mean(raw[-20:])) < 150  # and still the level of the recent steps
    # the axis is the curve's: one spike of the faint raw line (10x) goes past the top, not flattens it
    files.step(61, tokens_per_s=20_000.0)
    fig = build_figure(polled(files), RunStatus("running", step=61))
    top = fig.layout.yaxis4.range[1]
    assert (
        max(by_key(fig)[("smooth", "tokens_per_s")].y) < top < 5000
        and fig.layout.yaxis4.title.text == "tokens/s"
    )
    # and the panel says how high the spike went, so the cut line does not pass for the data's top
    (note,) = [a for a in fig.layout.annotations if a.name == "throughput-peak"]
    assert "20k" in note.text and "above the axis" in note.text


def test_ema_starts_at_the_first_value_and_skips_gaps() -> None:
    out = ema(np.array([10.0, np.nan, 10.0, 20.0]), span=3)
    assert out[0] == 10.0 and out[1] == 10.0 and out[2] == 10.0
    assert 10.0 < out[3] < 20.0


def test_a_cpu_estimate_line_adds_the_runtime_its_rss_holds(files: RunFiles) -> None:
    files.steps(1, 4)
    files.sample(0, 1.0)
    est = {"per_device_bytes": 48 * 2**20, "parts": {"weights": 2**20}, "inputs": {"device": "cpu"}}
    atomic_write_json(files.paths.resolved, {"config": {}, "name": "x", "estimate": est})
    fig = run_plot(files.run)
    line = by_key(fig)[("estimate",)]
    level = (48 * 2**20 + CPU_RUNTIME_BYTES) / GIB
    assert list(line.y) == [level, level] and list(line.x) == [0.0, 3.0]  # across the steps drawn
    assert line.name == "estimate + runtime" and line.yaxis == by_key(fig)[("memory", "0", "rss")].yaxis
    (label,) = named(fig, "estimate")
    assert label.text == "estimate 48 MiB + runtime 0.45 GiB = 0.50 GiB" and label.y == level
    assert "weights 1 MiB" in label.hovertext and "compare with RSS" in label.hovertext


def test_a_gpu_estimate_line_leaves_out_the_cuda_context_the_allocator_does_not_see() -> None:
    est = {"per_device_bytes": 10 * GIB, "inputs": {"device": "cuda", "world_size": 1}}
    line = memory_line(est)
    assert line is not None and line.bytes == 10 * GIB - CUDA_CONTEXT_BYTES
    assert "CUDA context" in line.label_text and "GPU reserved" in line.hover
    bare = memory_line(6 * GIB)
    assert bare is not None and bare.bytes == 6 * GIB and bare.label == "estimate"
    assert memory_line({"note": "no bytes"}) is None and memory_line(None) is None


def test_title_shows_state_progress_elapsed_eta_and_last_loss(files: RunFiles) -> None:
    files.steps(1, 11)  # one step per second
    st = RunStatus("running", step=10, max_steps=100)
    title = build_figure(polled(files), st, name="sft-demo", now=files.t0 + 1 + 125).layout.title.text
    assert "sft-demo" in title and "running" in title
    assert "step 10/100" in title
    assert "elapsed 2:05" in title
    assert "1 min 30 s left" in title  # 90 steps left at 1 step/s
    assert f"loss {3.0 / 10**0.5:.4f}" in title
    bar = [s for s in build_figure(polled(files), st).layout.shapes if s.name == "progress"]
    assert bar[0].x1 == pytest.approx(0.1)  # the progress bar under the title


def test_title_of_a_failed_run_shows_its_error_and_no_eta(files: RunFiles) -> None:
    files.steps(1, 5)
    err = {"type": "OutOfMemoryError", "message": "CUDA out of memory <tried 2 GiB>"}
    st = RunStatus("failed", step=4, max_steps=100, error=err, updated=files.t0 + 10)
    fig = build_figure(polled(files), st)
    title = fig.layout.title.text
    assert "failed" in title and " left" not in title
    assert "elapsed 0:09" in title  # stops at the final status write
    (line,) = named(fig, "error")
    assert "OutOfMemoryError" in line.text and "&lt;tried 2 GiB&gt;" in line.text


def test_a_run_logging_every_5_steps_shows_time_left_and_its_first_loss_once_two_steps_are_timed(
    tmp_path: Path,
) -> None:
    # lab 6's shape: logging_steps 5, slow steps; status.json has the worker's step timing, no record yet
    f = RunFiles(tmp_path / "lab6", max_steps=100, train_args={"logging_steps": 5})
    now = f.t0 + 60
    one = RunStatus("running", step=1, max_steps=100, step_seconds=20.0, step_ended=now, steps_timed=1)
    fig = build_figure(polled(f), one, now=now)
    assert " left" not in fig.layout.title.text  # one step (with its warm-up) says little
    (phase,) = named(fig, "phase")
    assert "training: first loss at step 5" in phase.text
    two = RunStatus("running", step=2, max_steps=100, step_seconds=20.0, step_ended=now, steps_timed=2)
    fig = build_figure(polled(f), two, now=now)
    assert "step 2/100" in fig.layout.title.text and "32 min 40 s left" in fig.layout.title.text
    (phase,) = named(fig, "phase")
    assert "training: first loss at step 5, in about 60 s" in phase.text
    f.close()


def test_a_stopped_runs_elapsed_stops_at_its_stop_however_long_it_sits(files: RunFiles) -> None:
    files.steps(1, 11)
    st = RunStatus("stopped", step=10, max_steps=100, updated=files.t0 + 12)
    p = progress(polled(files), st, now=files.t0 + 7200)
    assert p.elapsed == pytest.approx(11.0) and p.eta is None  # from its first record (no launch.json)


def test_eta_moves_smoothly_through_noisy_steps_and_evaluation_pauses(tmp_path: Path) -> None:
    # 300 steps: durations around 1 s in two modes (0.6 / 1.4 s, as steps of two lengths alternate at
    # random), a 20 s evaluation every 50 steps, and a slow first step.
    f = RunFiles(tmp_path / "eta", max_steps=300)
    rng = random.Random(7)
    t = f.t0 + 30.0
    etas: list[float] = []
    for i in range(1, 301):
        t += 8.0 if i == 1 else rng.choice((0.6, 1.4))
        if i % 50 == 0:
            t += 20.0
        f.metrics.write({"t": t, "step": i, "loss": 1.0})
        if i >= 10:
            tail = MetricsTail(f.paths)
            tail.poll()
            p = progress(tail, RunStatus("running", step=i, max_steps=300), now=t)
            assert p.eta is not None
            etas.append(p.eta)
    f.close()
    eta = np.array(etas)
    # from one step to the next the ETA drops by about the step that passed (1 s): relative to the ETA, what
    # else it moves stays small (the issue saw 4:38 -> 7:43 -> 3:16), and smaller once there are many steps
    # (near the end a second is a large part of what is left: there, relative to a minute)
    moved = np.abs(eta[:-1] - eta[1:] - 1.0) / np.maximum(eta[:-1], 60.0)
    assert moved.max() < 0.10, moved.max()
    assert moved[40:].max() < 0.05, moved[40:].max()  # an evaluation's 20 s pause moves it by ~3%
    # and it is about right: within 20% of the true remaining time at step 10 (evaluations aside)
    assert eta[0] == pytest.approx(290 * 1.0, rel=0.2)


def test_elapsed_counts_every_attempt_and_leaves_out_the_pause_between(files: RunFiles) -> None:
    # attempt 1: launched at t0, steps 1-10 at t0+1..t0+10, stopped; the resume at step 8 (its last
    # checkpoint) starts attempt 2 an hour later; its steps 9-12 come 5 s after that launch.
    # (the metrics.jsonl and resolved.json that control/start.resume leaves: records up to the checkpoint
    # kept, resolved.json's resume, a new launch.json)
    recs = files.steps(1, 11)
    files.sample(0, 5.0)
    files.sample(0, 10.5)  # attempt 1's last sample, after its checkpoint: set aside by the resume
    later = files.t0 + 3600.0
    atomic_write_json(files.paths.resolved, {"config": {}, "name": "x", "resume": {"step": 8, "attempt": 2}})
    atomic_write_json(files.paths.launch, {"start_time": later})
    lines = [{"schema": 1, "kind": "metrics"}, *(r for r in recs if r["step"] <= 8)]
    files.paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
    for i, step in enumerate(range(9, 13)):
        files.metrics.write({"t": later + 5 + i, "step": step, "loss": 1.0})
    files.system.write({"t": later + 5.5, "rank": 0, "rss": 2e9})
    tail = polled(files)
    p = progress(tail, RunStatus("running", step=12, max_steps=20), now=later + 10)
    # attempt 1 ran 9.5 s (from its first record, the launch time it had is gone, to its last), attempt 2
    # so far 10 s: the hour between them is no elapsed time
    assert p.elapsed == pytest.approx(19.5)
    fig = build_figure(tail, RunStatus("running", step=12, max_steps=20), now=later + 10)
    rss = by_key(fig)[("memory", "0", "rss")]
    # memory stays on the step axis across the resume: never before 0, never backwards, and the sample
    # of the part of attempt 1 that the resume set aside is not drawn
    assert list(rss.x) == pytest.approx([5.0, 9.5])
    assert list(rss.customdata) == ["0:04 elapsed", "0:15 elapsed"]


def test_before_the_first_step_the_frame_says_what_the_run_is_doing(files: RunFiles) -> None:
    dl = {"repo": "org/x", "done": 3.1e9, "total": 15.2e9, "rate": 4e7}
    st = RunStatus("starting", phase="downloading model", download=dl)
    fig = build_figure(polled(files), st)
    (phase,) = named(fig, "phase")
    assert "downloading model org/x 3.1 / 15.2 GB, 40.0 MB/s" in phase.text
    assert not any(fig.layout[k].visible for k in fig.layout if k[1:5] == "axis")
    assert all(a.visible is False for a in fig.layout.annotations if str(a.name).startswith("panel:"))
    assert fig.layout.showlegend is False
    # the first logged step brings the charts back
    files.steps(1, 2)
    fig = build_figure(polled(files), RunStatus("running", step=1))
    assert not named(fig, "phase") and all(fig.layout[k].visible for k in fig.layout if k[1:5] == "axis")


def test_a_run_that_failed_before_its_first_step_shows_the_error_and_the_log_tail(files: RunFiles) -> None:
    log = "\n".join(f"line {i}" for i in range(20)) + "\nsafetensors_rust.SafetensorError: HeaderTooLarge"
    err = {"type": "SafetensorError", "message": "HeaderTooLarge in model.safetensors", "log_tail": log}
    fig = build_figure(polled(files), RunStatus("failed", error=err))
    (phase,) = named(fig, "phase")
    (tail,) = named(fig, "log")
    assert "failed before the first step: SafetensorError" in phase.text
    assert "HeaderTooLarge" in tail.text and "line 19" in tail.text and "line 3<" not in tail.text


def test_figure_of_a_run_without_records_has_empty_core_traces(files: RunFiles) -> None:
    fig = build_figure(polled(files), RunStatus("queued"))
    assert [tuple(t.meta) for t in fig.data] == [
        ("metric", "loss"),
        ("smooth", "loss"),
        ("metric", "lr"),
        ("metric", "grad_norm"),
        ("metric", "tokens_per_s"),
        ("smooth", "tokens_per_s"),
    ]
    assert all(len(t.x) == 0 for t in fig.data)
    assert "queued" in named(fig, "phase")[0].text


def test_extra_keys_get_panels_of_their_own(files: RunFiles) -> None:
    files.step(1, **{"rewards/margins": 0.5, "rewards/accuracies": 0.75})
    extra = ("rewards/margins", "rewards/accuracies", "lr", "rewards/margins")  # repeats are dropped
    fig = build_figure(polled(files), RunStatus("running"), extra=extra)
    assert len(fig.data) == 8
    traces = by_name(fig)
    assert list(traces["rewards/margins"].y) == [0.5]
    assert traces["rewards/margins"].yaxis != traces["rewards/accuracies"].yaxis
    titles = {a.text for a in fig.layout.annotations}
    assert {"<b>rewards/margins</b>", "<b>rewards/accuracies</b>"} <= titles
    assert fig.layout.height > build_figure(polled(files), RunStatus("running")).layout.height


def test_the_notebooks_compute_metrics_get_panels_of_their_own(files: RunFiles) -> None:
    """Records list what hooks: compute_metrics returned (as the worker logs it, eval_<name>): each such
    metric is drawn in a panel of its own, its evaluations as points; other unknown keys are not."""
    files.steps(1, 5)
    evals = {"eval_loss": 1.4, "eval_entropy": 2.0}  # the trainer's own eval keys: no panel of their own
    files.step(5, **evals, eval_exact=0.25, eval_f1=0.5, notebook_metrics=["eval_exact", "eval_f1"])
    files.steps(6, 10)
    files.step(10, **evals, eval_exact=0.75, eval_f1=0.6, notebook_metrics=["eval_exact", "eval_f1"])
    tail = polled(files)
    assert list(tail.notebook_metrics) == ["eval_exact", "eval_f1"]
    fig = build_figure(tail, RunStatus("running", step=10, max_steps=100), extra=("rewards/margins",))
    traces = by_key(fig)
    assert ("metric", "eval_entropy") not in traces
    exact = traces[("metric", "eval_exact")]
    assert list(exact.x) == [5, 10] and list(exact.y) == [0.25, 0.75] and exact.mode == "lines+markers"
    assert exact.yaxis != traces[("metric", "eval_f1")].yaxis != traces[("metric", "rewards/margins")].yaxis
    titles = [a.text for a in fig.layout.annotations if (a.name or "").startswith("panel:")]
    assert titles[-3:] == ["<b>rewards/margins</b>", "<b>eval_exact</b>", "<b>eval_f1</b>"]
    # a run without them keeps the dashboard's panels
    plain = RunFiles(files.paths.root.parent / "plain", max_steps=100)
    plain.steps(1, 5)
    plain.step(5, **evals, eval_exact=0.25)
    assert ("metric", "eval_exact") not in by_key(build_figure(polled(plain), RunStatus("running")))
    plain.close()


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
    assert list(by_key(fig)[("metric", "loss")].y) == [r["loss"] for r in recs]
    assert list(by_key(fig)[("estimate",)].y) == [4.0, 4.0]
    assert "completed" in fig.layout.title.text and "plotted" in fig.layout.title.text
    f.close()


def test_figure_of_a_long_run_stays_small(tmp_path: Path) -> None:
    f = RunFiles(tmp_path / "long")
    f.steps(1, 20_001)
    tail = MetricsTail(f.paths, cap=500)
    tail.poll()
    fig = build_figure(tail, RunStatus("running", step=20_000))
    assert all(len(t.x) <= 500 for t in fig.data)
    assert len(fig.to_json()) < 200_000
    f.close()


def test_every_nbtrain_figure_uses_the_one_theme(files: RunFiles) -> None:
    from nbtrain.control.jobs.evaluate import EvalReport
    from nbtrain.control.memory import estimate
    from nbtrain.ui.estimate_chart import estimate_figure
    from nbtrain.ui.figures import themed
    from nbtrain.ui.preview import length_histogram

    files.steps(1, 3)
    theme = pio.templates[THEME]
    report = EvalReport(
        Path("r.json"), {"models": {"tuned": {"loss": 1.0, "perplexity": 2.7}}, "run_id": "x"}
    )
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}  # fmt: skip
    stats = {"rows": 3, "rows_limit": 2000}
    figures = {
        "dashboard": build_figure(polled(files), RunStatus("running")),
        "compare": compare_figure([files.run]),
        "preview": length_histogram({"lengths": [5, 5, 5], "stats": stats, "max_length": 64}),
        "estimate": estimate_figure(estimate(config, device="cpu")),
        "eval": themed(report.figure()),
    }
    for what, fig in figures.items():
        assert fig.layout.template == theme, what


def test_a_single_point_is_drawn_as_a_marker_until_a_second_one_makes_a_line(files: RunFiles) -> None:
    files.steps(1, 2)
    fig = build_figure(polled(files), RunStatus("running", step=1, max_steps=100))
    loss = by_key(fig)[("metric", "loss")]
    assert list(loss.x) == [1] and loss.mode == "lines+markers"  # a line of one point draws nothing
    files.steps(2, 4)
    fig = build_figure(polled(files), RunStatus("running", step=3, max_steps=100))
    assert by_key(fig)[("metric", "loss")].mode == "lines"


def test_the_loss_panel_switches_its_scale_and_smooths_its_curve_in_the_browser(files: RunFiles) -> None:
    """TensorBoard's two controls, as plotly buttons over the loss panel: linear or log scale, raw or
    smoothed curve (the smoothed twin drawn once asked, the raw line faint behind it). They name the two
    loss traces by position, which every figure keeps first."""
    rng = random.Random(2)
    for i in range(1, 41):
        files.step(i, loss=3.0 / i + rng.uniform(0, 0.3))
    files.step(40, eval_loss=0.5)
    fig = build_figure(polled(files), RunStatus("running", step=40))
    raw, smooth = fig.data[0], fig.data[1]
    assert tuple(raw.meta) == ("metric", "loss") and tuple(smooth.meta) == ("smooth", "loss")
    assert raw.visible is not False and smooth.visible is False  # the raw curve until asked
    assert np.allclose(smooth.y, ema(np.asarray(raw.y)))
    menus = {m.name: m for m in fig.layout.updatemenus}
    scale = {b.label: b.args for b in menus["loss-scale"].buttons}
    assert scale == {"linear": ({"yaxis.type": "linear"},), "log": ({"yaxis.type": "log"},)}
    curve = {b.label: b.args for b in menus["loss-curve"].buttons}
    assert curve["smoothed"] == ({"visible": [True, True], "opacity": [0.3, 1.0]}, (0, 1))
    assert curve["raw"][0]["visible"] == [True, False]
    # over the loss panel, above its plot
    assert all(m.y > fig.layout.yaxis.domain[1] for m in fig.layout.updatemenus)
