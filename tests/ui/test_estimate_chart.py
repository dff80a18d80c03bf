"""The estimate chart: a stacked bar per device made of the estimate's parts, capacity marked, host bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.io as pio
import pytest

from nbtrain.control.memory import PARTS, Estimate, GiB, estimate
from nbtrain.ui.estimate_chart import HOST, MAX_BARS, estimate_figure

CONFIG = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "model_configs" / "Qwen2.5-0.5B" / "config.json").read_text()
)


def bars(fig: Any) -> dict[str, Any]:
    return {t.name: t for t in fig.data if t.type == "bar"}


def test_one_segment_per_part_with_the_estimates_bytes() -> None:
    est = estimate(CONFIG, method="lora", strategy="ddp", world_size=4)
    fig = estimate_figure(est)
    segments = bars(fig)
    assert list(segments) == list(PARTS)
    for part, trace in segments.items():
        assert list(trace.x) == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
        assert list(trace.customdata) == [est.parts[part]] * 4
        assert list(trace.y) == pytest.approx([est.parts[part] / GiB] * 4)
    assert fig.layout.barmode == "stack"


def test_capacity_is_marked_on_every_device() -> None:
    est = estimate(CONFIG, method="full", world_size=1, micro_batch=64, seq_len=2048)  # ~24 GiB: 80 is drawn
    fig = estimate_figure(est, capacity_bytes=80 * GiB)
    (cap,) = [t for t in fig.data if t.type == "scatter"]
    assert cap.name == "GPU capacity"
    assert list(cap.x) == ["GPU 0"]
    assert list(cap.y) == [80.0]


def test_no_capacity_and_no_host_bar_without_offload() -> None:
    fig = estimate_figure(estimate(CONFIG, method="lora"))
    assert [t.type for t in fig.data] == ["bar"] * len(PARTS)
    assert HOST not in bars(fig)["weights"].x


def test_offloading_adds_a_host_bar_of_the_offloaded_parts() -> None:
    est = estimate(CONFIG, method="full", strategy="zero3", offload="optimizer+params", world_size=2)
    fig = estimate_figure(est, capacity_bytes=80 * GiB, cpu_capacity_bytes=256 * GiB)
    segments = bars(fig)
    for part, trace in segments.items():
        assert list(trace.x) == ["GPU 0", "GPU 1", HOST]
        assert trace.customdata[-1] == est.cpu_parts.get(part, 0)
    assert sum(t.customdata[-1] for t in segments.values()) == sum(est.cpu_parts.values())
    # 256 GiB of host RAM is far above these bars: written at the chart's corner, not drawn squashing them
    assert not [t for t in fig.data if t.type == "scatter" and t.name == "host RAM"]
    assert "host RAM 256.0 GiB" in fig.layout.annotations[0].text
    near = estimate_figure(
        est, capacity_bytes=80 * GiB, cpu_capacity_bytes=int(sum(est.cpu_parts.values()) * 2)
    )
    (host,) = [t for t in near.data if t.type == "scatter" and t.name == "host RAM"]
    assert list(host.customdata) == [int(sum(est.cpu_parts.values()) * 2)]


def test_many_devices_share_one_bar() -> None:
    est: Estimate = estimate(CONFIG, method="lora", strategy="zero2", world_size=4 * MAX_BARS, nodes=4)
    fig = estimate_figure(est)
    assert list(bars(fig)["weights"].x) == [f"each GPU (x{4 * MAX_BARS})"]


def test_the_fit_rules_usable_line_and_verdict_are_on_the_chart() -> None:
    from nbtrain.control.plan.fit import fits
    from nbtrain.hardware import GPU, Hardware

    card = GPU(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, 30 * GiB, (8, 0))  # another process holds 50 GiB
    est = estimate(CONFIG, method="full", micro_batch=64, seq_len=4096)  # ~39 GiB: over the 30 usable
    fit = fits(est, Hardware(gpus=[card], ram_total=256 * GiB, ram_available=200 * GiB))
    assert not fit.ok
    fig = estimate_figure(est, fit=fit)
    marks = {t.name: t for t in fig.data if t.type == "scatter"}
    assert list(marks["GPU capacity"].customdata) == [80 * GiB]
    assert list(marks["usable (fit rule)"].customdata) == [30 * GiB]
    assert f"does not fit: {fit.why}" in fig.layout.title.text


def test_a_cpu_estimate_is_drawn_in_mib_with_the_runtime_and_the_ram_written_not_drawn() -> None:
    from nbtrain.ui.figures import CPU_RUNTIME_BYTES, THEME

    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}  # fmt: skip
    est = estimate(tiny, method="lora", device="cpu", micro_batch=4)
    fig = estimate_figure(est, capacity_bytes=24 * GiB)
    # not an empty chart with one RAM line: the bars fill it, in MiB, and 24 GiB of RAM is a note
    assert fig.layout.yaxis.title.text == "MiB"
    assert [t.type for t in fig.data] == ["bar"] * (len(PARTS) + 1)
    runtime = bars(fig)["runtime (not estimated)"]
    assert list(runtime.customdata) == [CPU_RUNTIME_BYTES]
    assert "RAM 24.0 GiB" in fig.layout.annotations[0].text
    assert "per CPU process" in fig.layout.title.text and "runtime" in fig.layout.title.text
    assert fig.layout.template == pio.templates[THEME]


def test_the_estimate_report_is_titled_as_an_estimate(workdir: Path) -> None:
    import nbtrain
    from tests.conftest import lora_yaml

    report = nbtrain.estimate(lora_yaml(10))
    text = report.text()
    assert text.startswith("nbtrain estimate: ") and "dry run" not in text
    fig = report.figure()
    assert fig is not None and max(sum(t.y) for t in fig.data if t.type == "bar") > 0
    assert fig.layout.yaxis.title.text == "MiB"  # the tiny model: a chart that shows its bars
