"""The memory estimate as a stacked bar chart: one bar per device, a part per segment, capacity marked.

Each GPU gets a bar (every rank holds the same under the strategies nbtrain plans, so the bars are equal;
past ``MAX_BARS`` devices one bar stands for all). When the run offloads to the host, a last bar shows
the host RAM per node, built from the offloaded parts.
"""

from __future__ import annotations

import plotly.graph_objects as go

from nbtrain.memory import PARTS, Estimate, GiB

MAX_BARS = 8
HOST = "host RAM (per node)"
PART_COLORS = {
    "weights": "#1f77b4",
    "adapters": "#17becf",
    "gradients": "#ff7f0e",
    "optimizer": "#d62728",
    "activations": "#2ca02c",
    "overhead": "#7f7f7f",
}


def device_labels(estimate: Estimate) -> list[str]:
    """One label per device bar: "GPU 0".. (or "CPU process 0"..), or a single bar for many devices."""
    n = int(estimate.inputs["world_size"])
    kind = "GPU" if estimate.inputs["device"] == "cuda" else "CPU process"
    if n > MAX_BARS:
        return [f"each {kind} (x{n})"]
    return [f"{kind} {i}" for i in range(n)]


def estimate_figure(
    estimate: Estimate, capacity_bytes: int | None = None, *, cpu_capacity_bytes: int | None = None
) -> go.Figure:
    """Stacked bars of ``estimate.parts`` per device (GiB), the device capacity as a marked line, and a
    host-RAM bar of ``estimate.cpu_parts`` when the run offloads. Bytes are in each bar's customdata."""
    devices = device_labels(estimate)
    offloads = bool(estimate.cpu_parts)
    x = [*devices, HOST] if offloads else devices
    fig = go.Figure()
    for part in PARTS:
        values = [estimate.parts[part]] * len(devices)
        if offloads:
            values.append(estimate.cpu_parts.get(part, 0))
        fig.add_trace(
            go.Bar(
                name=part,
                x=x,
                y=[v / GiB for v in values],
                customdata=values,
                marker_color=PART_COLORS[part],
                hovertemplate=f"{part}: %{{y:.2f}} GiB<extra>%{{x}}</extra>",
            )
        )
    if capacity_bytes is not None:
        # A short horizontal marker over each device bar reads as "the top of this card".
        fig.add_trace(
            go.Scatter(
                name="GPU capacity" if estimate.inputs["device"] == "cuda" else "RAM",
                x=devices,
                y=[capacity_bytes / GiB] * len(devices),
                customdata=[capacity_bytes] * len(devices),
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 44, "color": "black", "line": {"width": 3}},
                hovertemplate="capacity: %{y:.1f} GiB<extra>%{x}</extra>",
            )
        )
    if offloads and cpu_capacity_bytes is not None:
        fig.add_trace(
            go.Scatter(
                name="host RAM",
                x=[HOST],
                y=[cpu_capacity_bytes / GiB],
                customdata=[cpu_capacity_bytes],
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 44, "color": "#777", "line": {"width": 3}},
                hovertemplate="host RAM: %{y:.1f} GiB<extra></extra>",
            )
        )
    i = estimate.inputs
    strategy = i["strategy"] + (f" + offload {i['offload']}" if i["offload"] != "none" else "")
    fig.update_layout(
        barmode="stack",
        title=(
            f"Estimated peak memory: {estimate.per_device_bytes / GiB:.1f} GiB per device "
            f"({i['method']}, {strategy}, {i['precision']})"
        ),
        yaxis_title="GiB",
        legend_traceorder="reversed",  # legend top-to-bottom matches the stack
        height=420,
    )
    return fig
