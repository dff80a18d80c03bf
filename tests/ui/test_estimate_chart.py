"""The estimate chart: a stacked bar per device made of the estimate's parts, capacity marked, host bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nbtrain.memory import PARTS, Estimate, GiB, estimate
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
    est = estimate(CONFIG, method="full", world_size=1)
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
    host = [t for t in fig.data if t.type == "scatter" and t.name == "host RAM"]
    assert list(host[0].y) == [256.0]


def test_many_devices_share_one_bar() -> None:
    est: Estimate = estimate(CONFIG, method="lora", strategy="zero2", world_size=4 * MAX_BARS, nodes=4)
    fig = estimate_figure(est)
    assert list(bars(fig)["weights"].x) == [f"each GPU (x{4 * MAX_BARS})"]
