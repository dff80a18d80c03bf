"""The memory estimate as a stacked bar chart: one bar per device, a part per segment, capacity marked.

Each GPU gets a bar (every rank holds the same under the strategies nbtrain plans, so the bars are equal;
past ``MAX_BARS`` devices one bar stands for all). When the run offloads to the host, a last bar shows
the host RAM per node, built from the offloaded parts. Given the fit rule's verdict
(nbtrain.control.plan.fit), the chart marks what that rule counts as usable beside each capacity and says
in its title whether the run fits, in the same words ``start`` and the comparison table use.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from nbtrain.control.memory import PARTS, Estimate, GiB, MiB
from nbtrain.control.plan.fit import Fit
from nbtrain.control.prepare import estimate_table
from nbtrain.hardware import Hardware
from nbtrain.ui.figures import CPU_RUNTIME_BYTES, MUTED, THEME

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared

MAX_BARS = 8
HOST = "host RAM (per node)"
RUNTIME = "runtime (not estimated)"
PART_COLORS = {
    "weights": "#2563eb",
    "adapters": "#0891b2",
    "gradients": "#ea580c",
    "optimizer": "#db2777",
    "activations": "#059669",
    "overhead": "#94a3b8",
}
# Marks above this many times the tallest bar are written, not drawn: drawn, they squash the bars flat.
FAR = 4.0


def _size(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


# What a device bar is called, by the plan's device; an Apple MPS GPU's memory is the machine's RAM.
DEVICE_KINDS = {"cuda": "GPU", "npu": "NPU", "mps": "MPS GPU"}


def device_labels(estimate: Estimate) -> list[str]:
    """One label per device bar: "GPU 0".. (or "CPU process 0"..), or a single bar for many devices."""
    n = int(estimate.inputs["world_size"])
    kind = DEVICE_KINDS.get(estimate.inputs["device"], "CPU process")
    if n > MAX_BARS:
        return [f"each {kind} (x{n})"]
    return [f"{kind} {i}" for i in range(n)]


def _marker(
    name: str, x: list[str], value: int, color: str, dash: str, hover: str, unit: float
) -> go.Scatter:
    # A short horizontal marker over each bar reads as "the top of this card".
    return go.Scatter(
        name=name,
        x=x,
        y=[value / unit] * len(x),
        customdata=[value] * len(x),
        mode="markers",
        marker={"symbol": "line-ew-open", "size": 44, "color": color, "line": {"width": 3, "dash": dash}},
        hovertemplate=f"{hover}: {_size(value)}<extra>%{{x}}</extra>",
    )


def estimate_figure(
    estimate: Estimate,
    capacity_bytes: int | None = None,
    *,
    cpu_capacity_bytes: int | None = None,
    fit: Fit | None = None,
) -> go.Figure:
    """Stacked bars of ``estimate.parts`` per device, the device capacity as a marked line, and a
    host-RAM bar of ``estimate.cpu_parts`` when the run offloads. Bytes are in each bar's customdata; the
    axis is in GiB, or MiB when every bar is under 1 GiB.

    On a CPU, each process also holds the Python / torch runtime the estimate does not count: it is drawn
    as a last, hatched part (``CPU_RUNTIME_BYTES``), the same the dashboard adds to its estimate line. A
    capacity far above the bars (``FAR`` times) is written beside them instead of squashing them flat.

    ``fit`` (``nbtrain.control.plan.fit.fits`` of this estimate) supplies the capacities when they are not
    given, adds the usable line of each, and puts its verdict in the title."""
    if fit is not None:
        capacity_bytes = capacity_bytes if capacity_bytes is not None else fit.capacity or None
        if cpu_capacity_bytes is None and fit.host_capacity:
            cpu_capacity_bytes = fit.host_capacity
    devices = device_labels(estimate)
    offloads = bool(estimate.cpu_parts)
    cuda = estimate.inputs["device"] in ("cuda", "npu")  # a device with its own memory (MPS shares the RAM)
    per = DEVICE_KINDS.get(estimate.inputs["device"], "CPU process")
    x = [*devices, HOST] if offloads else devices
    runtime = 0 if cuda else CPU_RUNTIME_BYTES
    tallest = max(estimate.per_device_bytes + runtime, sum(estimate.cpu_parts.values()), 1)
    unit, unit_name = (GiB, "GiB") if tallest >= GiB else (MiB, "MiB")
    fig = go.Figure()
    for part in PARTS:
        values = [estimate.parts[part]] * len(devices)
        if offloads:
            values.append(estimate.cpu_parts.get(part, 0))
        fig.add_trace(
            go.Bar(
                name=part,
                x=x,
                y=[v / unit for v in values],
                customdata=values,
                marker_color=PART_COLORS[part],
                hovertemplate=f"{part}: %{{y:.2f}} {unit_name}<extra>%{{x}}</extra>",
            )
        )
    if runtime:
        fig.add_trace(
            go.Bar(
                name=RUNTIME,
                x=devices,
                y=[runtime / unit] * len(devices),
                customdata=[runtime] * len(devices),
                marker={
                    "color": "white",
                    "line": {"color": MUTED, "width": 1},
                    "pattern": {"shape": "/", "fgcolor": MUTED, "size": 6},
                },
                hovertemplate="Python / torch runtime, measured, not part of the estimate: "
                f"%{{y:.2f}} {unit_name}<extra>%{{x}}</extra>",
            )
        )
    written: list[str] = []

    def mark(name: str, xs: list[str], value: int, color: str, dash: str, hover: str) -> None:
        if value > FAR * tallest:
            written.append(f"{hover} {_size(value)}")
        else:
            fig.add_trace(_marker(name, xs, value, color, dash, hover, unit))

    if capacity_bytes is not None:
        mark(f"{per} capacity" if cuda else "RAM", devices, capacity_bytes, "black", "solid",
             f"{per} capacity" if cuda else "RAM")  # fmt: skip
    if fit is not None and fit.usable and fit.need:
        # A CPU run's processes share the RAM (fit.need is their sum): each bar gets its share of it.
        share = fit.usable * estimate.per_device_bytes // fit.need
        mark("usable (fit rule)", devices, share, "#b91c1c", "dash", "usable (fit rule)")
    if offloads and cpu_capacity_bytes is not None:
        mark("host RAM", [HOST], cpu_capacity_bytes, "#777", "solid", "host RAM")
    if offloads and fit is not None and fit.host_usable:
        mark("host RAM usable", [HOST], fit.host_usable, "#b91c1c", "dash", "host RAM usable")
    i = estimate.inputs
    strategy = i["strategy"] + (f" + offload {i['offload']}" if i["offload"] != "none" else "")
    title = (
        f"<b>Estimated peak memory: {_size(estimate.per_device_bytes)} per {per}</b> "
        f"({i['method']}, {strategy}, {i['precision']})"
    )
    subtitle = []
    if runtime:
        subtitle.append(f"+ {_size(runtime)} Python / torch runtime per process (hatched)")
    if estimate.disk_bytes:  # offload: nvme; the host bar is then its pinned swap buffers
        subtitle.append(f"{_size(estimate.disk_bytes)} per node swapped to disk (nvme_path)")
    if fit is not None:
        subtitle.append(f"{'' if fit.ok else 'does not fit: '}{fit.why}")
    if subtitle:
        title += "<br><sub>" + html.escape("; ".join(subtitle)) + "</sub>"
    if written:
        fig.add_annotation(
            text="<br>".join(html.escape(w) for w in written) + "<br><i>(far above the bars)</i>",
            xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="top", align="right",
            showarrow=False, font={"size": 11, "color": MUTED},
        )  # fmt: skip
    fig.update_layout(
        template=THEME,
        barmode="stack",
        title=title,
        yaxis_title=unit_name,
        legend_traceorder="reversed",  # legend top-to-bottom matches the stack
        height=420,
        margin={"t": 84},
    )
    return fig


def prepared_figure(prep: Prepared) -> go.Figure | None:
    """The chart of a prepared run's estimate with the fit rule's verdict, or None without an estimate."""
    got = prep.memory()
    if got is None:
        return None
    est, fit = got
    return estimate_figure(est, fit=fit)


@dataclass
class EstimateReport:
    """``nbtrain.estimate``: the plan's estimate, and every method x strategy on this hardware."""

    prepared: Prepared
    table: list[dict[str, Any]]

    def figure(self) -> Any:
        """The plan's estimate as a chart (plotly), or None without an estimate."""
        return prepared_figure(self.prepared)

    def text(self) -> str:
        summary = self.prepared.summary().split("\n  resolved config:")[0]
        # the plan's summary is headed as a dry run's; this is the estimate
        head, _, rest = summary.partition("\n")
        if head.startswith("nbtrain dry run: "):
            head = f"nbtrain estimate: {self.prepared.name} (nothing started)"
        lines = [head + ("\n" + rest if rest else "")]
        if self.table:
            lines.append("  method x strategy on this machine:")
            for r in self.table:
                off = f"+{r['offload']}" if r["offload"] != "none" else ""
                verdict = "fits" if r["fits"] else "NO"
                gib = r["per_device_bytes"] / 2**30
                lines.append(
                    f"    {verdict:<5} {r['method']:<5} {r['strategy'] + off:<22} x{r['world_size']:<3} "
                    f"{gib:7.2f} GiB  {r['why']}"
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text())}</pre>"


def estimate(
    config: str | Path | dict[str, Any], *, hardware: Hardware | None = None, on: str | None = None
) -> EstimateReport:
    """Will it fit? The memory estimate of ``config`` as planned here (or ``on`` hardware you name:
    "8xA100-40GB", "2x8xH100-80GB", "1xT4"), and the alternatives."""
    prep, table = estimate_table(config, hardware=hardware, on=on)
    return EstimateReport(prep, table)
