"""How the cost of a live-view refresh grows with the length of a run (it should not).

For metrics.jsonl files of 1k, 10k, 100k and 1M lines, the script catches a tail up with the file, then
appends 100 lines and times one refresh, several times (median): ``poll`` is MetricsTail.poll() alone,
``refresh`` is a whole Dashboard.refresh() (status.json, poll, FigureWidget update). It also reports the
JSON size of the figure of a 100k-step run. ``1st poll`` is reading a whole file at once; ``show`` is
the first (bounded) Dashboard refresh, i.e. how long showing a run of that length blocks the cell.
Results go to bench/results/tail.json.

    python bench/bench_tail.py
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import RunPaths, atomic_write_json, write_status
from nbtrain.control.runs.metrics import DEFAULT_CAP, MetricsTail
from nbtrain.control.runs.run import Run
from nbtrain.ui.dashboard import Dashboard
from nbtrain.ui.figures import build_figure

SIZES = (1_000, 10_000, 100_000, 1_000_000)
APPEND = 100
REPS = 21
RESULTS = Path(__file__).resolve().parent / "results" / "tail.json"


def metrics_line(i: int, t0: float) -> str:
    # what worker/callbacks.py writes for one logged step (formatted directly: json.dumps is 3x slower
    # and 1M lines of setup would dominate the run time)
    return (
        f'{{"t": {t0 + i * 0.5:.3f}, "step": {i}, "epoch": {i / 1000:.4f}, '
        f'"loss": {2 + math.sin(i / 300):.6f}, '
        f'"lr": {1e-4 * (1 - i / 2e6):.6e}, "grad_norm": {1 + (i % 13) / 10:.3f}, "tokens": {512 * i}, '
        f'"tokens_per_s": {4000 + i % 97:.1f}}}\n'
    )


def system_line(i: int, t0: float) -> str:
    return f'{{"t": {t0 + i * 0.5:.3f}, "rank": 0, "rss": {2_000_000_000 + (i % 1000) * 4096}}}\n'


def make_run(root: Path, n: int, *, system: bool = False) -> tuple[RunPaths, float]:
    paths = RunPaths(root)
    paths.make()
    atomic_write_json(paths.resolved, {"config": {}, "name": root.name})
    write_status(paths, "running", step=n, max_steps=10 * n)
    t0 = time.time() - n
    with open(paths.metrics, "w", encoding="utf-8") as f:
        f.write('{"schema": 1, "kind": "metrics"}\n')
        f.writelines(metrics_line(i, t0) for i in range(1, n + 1))
    if system:
        with open(paths.system, "w", encoding="utf-8") as f:
            f.write('{"schema": 1, "kind": "system"}\n')
            f.writelines(system_line(i, t0) for i in range(1, n + 1))
    return paths, t0


def append(paths: RunPaths, start: int, t0: float) -> int:
    with open(paths.metrics, "a", encoding="utf-8") as f:
        f.writelines(metrics_line(i, t0) for i in range(start, start + APPEND))
    return start + APPEND


def bench_size(tmp: Path, n: int) -> dict[str, Any]:
    paths, t0 = make_run(tmp / f"run-{n}", n)
    tail = MetricsTail(paths)
    t = time.perf_counter()
    tail.poll()
    first_poll = time.perf_counter() - t

    dash = Dashboard(Run(paths.root), widget=True)
    t = time.perf_counter()
    dash.refresh()  # what show() does before it returns: one bounded read, then build the widget
    first_refresh = time.perf_counter() - t
    while not dash.tail.caught_up:  # what the thread does next, one chunk per tick
        dash.refresh()

    nxt = n + 1
    poll_s: list[float] = []
    refresh_s: list[float] = []
    idle_s: list[float] = []
    for _ in range(REPS):
        nxt = append(paths, nxt, t0)
        t = time.perf_counter()
        tail.poll()
        poll_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        dash.refresh()
        refresh_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        tail.poll()  # nothing new: what every idle tick of the thread costs
        idle_s.append(time.perf_counter() - t)
    loss = tail.series("loss")
    assert loss is not None and loss.seen == nxt - 1
    return {
        "lines": n,
        "file_mb": round(paths.metrics.stat().st_size / 1e6, 2),
        "first_poll_s": round(first_poll, 3),
        "first_refresh_s": round(first_refresh, 3),
        "poll_ms": round(1e3 * statistics.median(poll_s), 3),
        "refresh_ms": round(1e3 * statistics.median(refresh_s), 3),
        "idle_poll_ms": round(1e3 * statistics.median(idle_s), 3),
        "points_per_trace": len(loss),
    }


def main() -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-") as d:
        tmp = Path(d)
        rows = []
        for n in SIZES:
            rows.append(bench_size(tmp, n))
            print(f"  {n:>9,} lines done", flush=True)

        paths, _ = make_run(tmp / "payload", 100_000, system=True)
        tail = MetricsTail(paths)
        tail.poll()
        status = Run(paths.root).status()
        payload = len(build_figure(tail, status, estimate_bytes=8 * 2**30).to_json())

    print(
        f"{'lines':>10} {'file MB':>8} {'1st poll s':>10} {'show s':>7} {'poll ms':>8} {'refresh ms':>10} "
        f"{'idle ms':>8} {'points':>7}"
    )
    for r in rows:
        print(
            f"{r['lines']:>10,} {r['file_mb']:>8} {r['first_poll_s']:>10} {r['first_refresh_s']:>7} "
            f"{r['poll_ms']:>8} "
            f"{r['refresh_ms']:>10} {r['idle_poll_ms']:>8} {r['points_per_trace']:>7}"
        )
    ratio_poll = rows[-1]["poll_ms"] / rows[0]["poll_ms"]
    ratio_refresh = rows[-1]["refresh_ms"] / rows[0]["refresh_ms"]
    print(
        f"cost(1M)/cost(1k) after appending {APPEND} lines: "
        f"poll {ratio_poll:.2f}, refresh {ratio_refresh:.2f}"
    )
    print(f"figure JSON of a 100k-step run (metrics + system, cap {DEFAULT_CAP}): {payload:,} bytes")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "appended_lines": APPEND,
        "repetitions": REPS,
        "cap": DEFAULT_CAP,
        "rows": rows,
        "ratio_poll_1M_1k": round(ratio_poll, 3),
        "ratio_refresh_1M_1k": round(ratio_refresh, 3),
        "figure_json_bytes_100k_steps": payload,
        "runtime_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
    RESULTS.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **result}, indent=1) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {RESULTS} ({result['runtime_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
