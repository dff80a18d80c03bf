"""Plotly figures of a run: the dashboard layout (static or live), run comparison, ``Run.plot()``, and the
one theme every nbtrain figure uses (``THEME``: the dashboard, preview, evaluation and estimate charts).

The live dashboard and the static figure are built from the same trace specs and the same layout, so a
notebook saved after a run shows exactly what the live view showed at the end, at the same size.

What the dashboard draws, and why:

- every panel is against the step (one x-axis, zoomed together); the time of a point is in its hover.
  Memory samples are written with a wall time only, so they are placed on the step axis through the
  wall time of each logged step (:class:`Clock`);
- time is the run's own: elapsed counts every attempt of a resumed run and leaves out the pause between
  a stop and its resume; the ETA comes from the recent steps, with outliers (an evaluation, a checkpoint)
  clipped, so it moves smoothly;
- throughput is drawn smoothed (an exponential moving average over the recent steps) over its raw
  per-step values, which are faint;
- the memory estimate is drawn as what it is comparable to: on a CPU, the process's RSS, so the line adds
  the Python / torch runtime the estimate leaves out; on a GPU, torch's allocator, so the line leaves out
  the CUDA context the allocator does not see. Its legend and hover say what it includes;
- before the first step the frame says what the run is doing ("loading model", a download's progress),
  instead of showing empty axes.

The package, by job: ``theme`` (the plotly template and colours), ``clock`` (a run's own time: elapsed,
ETA, step times, smoothing), ``axes`` (the throughput axis's top, the loss panel's controls),
``memoryline`` (the estimate as drawn), ``panels`` (the frame, trace specs and the empty panels),
``header`` (the progress, header and the layout that follows the run) and ``charts`` (the figures built
whole).
"""

from __future__ import annotations

from nbtrain.ui.figures.axes import ThroughputAxis, throughput_top
from nbtrain.ui.figures.charts import add_traces, build_figure, compare_figure, run_plot
from nbtrain.ui.figures.clock import ema
from nbtrain.ui.figures.header import apply_chrome, chrome, header_parts, header_text, progress, state_color
from nbtrain.ui.figures.memoryline import CPU_RUNTIME_BYTES, GIB, MemoryLine, memory_line
from nbtrain.ui.figures.panels import (
    FIGURE_WIDTH,
    Frame,
    TraceSpec,
    empty_figure,
    make_frame,
    panels_of,
    trace_specs,
)
from nbtrain.ui.figures.theme import COLORS, MUTED, STATE_COLORS, THEME, themed

__all__ = [
    "COLORS",
    "CPU_RUNTIME_BYTES",
    "FIGURE_WIDTH",
    "GIB",
    "MUTED",
    "STATE_COLORS",
    "THEME",
    "Frame",
    "MemoryLine",
    "ThroughputAxis",
    "TraceSpec",
    "add_traces",
    "apply_chrome",
    "build_figure",
    "chrome",
    "compare_figure",
    "ema",
    "empty_figure",
    "header_parts",
    "header_text",
    "make_frame",
    "memory_line",
    "panels_of",
    "progress",
    "run_plot",
    "state_color",
    "themed",
    "throughput_top",
    "trace_specs",
]
