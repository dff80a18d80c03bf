"""Cell latency in a kernel that shows a live dashboard of a running training vs an idle kernel.

One detached training of the tiny model runs throughout (logging every step, so metrics.jsonl grows as
fast as it ever does). Two real kernels (jupyter_client) load nbtrain; one of them attaches the run's
live dashboard (``%finetune attach``: a FigureWidget updated by a background thread), the other shows
nothing. The same trivial cell is then executed in both, in alternating batches (A B A B ...), so both
see the same machine load and the training's own CPU use; the ratio of their p50/p95 is the
dashboard's cost to the user typing in that notebook. The round trip is timed from the client
(execute_request sent -> reply received and kernel idle), with the messages already queued drained
before each cell. Results go to bench/results/latency.json.

    python bench/bench_latency.py [--rounds 10] [--batch 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "latency.json"
CELL = "x = sum(range(100))"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def drain(kc: Any) -> int:
    """Read every message already queued on iopub (widget updates between cells); returns how many."""
    n = 0
    while True:
        try:
            kc.get_iopub_msg(timeout=0)
        except queue.Empty:
            return n
        n += 1


def run_cell(kc: Any, code: str, timeout: float = 120) -> dict[str, Any]:
    reply: dict[str, Any] = kc.execute_interactive(code, timeout=timeout, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {code!r}: {reply['content']}")
    return reply


def user_expr(kc: Any, expr: str) -> Any:
    """The value of ``expr`` in the kernel (as text/plain)."""
    reply = kc.execute_interactive("", user_expressions={"v": expr}, timeout=60, output_hook=lambda msg: None)
    v = reply["content"]["user_expressions"]["v"]
    if v.get("status") != "ok":
        raise RuntimeError(f"{expr!r} failed in the kernel: {v}")
    return json.loads(v["data"]["text/plain"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=50)
    args = ap.parse_args()

    from jupyter_client.manager import start_new_kernel

    import nbtrain
    from nbtrain.examples import make_tiny_model, write_dataset

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-latency-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        model = make_tiny_model(work / "tiny")
        write_dataset(work / "data.jsonl", n=400)
        config = textwrap.dedent(
            f"""
            model: {model}
            method: lora
            data: {{train: {work / "data.jsonl"}}}
            train: {{max_steps: 200000, per_device_train_batch_size: 8, learning_rate: 1.0e-3,
                     save_strategy: "no", logging_steps: 1}}
            """
        )
        run = nbtrain.finetune(config, name="latency")
        kernels: dict[str, tuple[Any, Any]] = {}
        try:
            deadline = time.monotonic() + 300
            while run.status().state != "running" or len(run.metrics()) < 5:
                if run.status().done or time.monotonic() > deadline:
                    raise RuntimeError(f"the training did not start: {run.status()}\n{run.logs(30)}")
                time.sleep(0.5)

            for label in ("dashboard", "idle"):
                km, kc = start_new_kernel(kernel_name="python3", cwd=str(work), env=dict(os.environ))
                kernels[label] = (km, kc)
                run_cell(kc, "%load_ext nbtrain")
            run_cell(kernels["dashboard"][1], "%finetune attach latency")
            dash = kernels["dashboard"][1]
            views = "[v.updates for v in __import__('nbtrain.ui.verbs.views', fromlist=['VIEWS']).VIEWS]"

            for _, kc in kernels.values():  # warm-up: first cells pay for lazy imports
                for _ in range(10):
                    run_cell(kc, CELL)

            updates_before = user_expr(dash, views)
            samples: dict[str, list[float]] = {"dashboard": [], "idle": []}
            iopub: dict[str, int] = {"dashboard": 0, "idle": 0}
            steps_before = run.status().step
            t_measure = time.monotonic()
            for r in range(args.rounds):
                order = ("dashboard", "idle") if r % 2 == 0 else ("idle", "dashboard")
                for label in order:
                    kc = kernels[label][1]
                    for _ in range(args.batch):
                        iopub[label] += drain(kc)
                        t = time.perf_counter()
                        run_cell(kc, CELL)
                        samples[label].append(time.perf_counter() - t)
            measure_s = time.monotonic() - t_measure
            updates_after = user_expr(dash, views)
            st = run.status()
            if st.state != "running":
                raise RuntimeError(f"the training ended during the measurement: {st.describe()}")
            steps = st.step - steps_before
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            run.stop(timeout=60)

    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "shared machine (other helpers ran tests); the training itself uses the CPU too",
        "loadavg_end": os.getloadavg(),
        "cell": CELL,
        "cells_per_kernel": args.rounds * args.batch,
        "training_steps_during_measurement": steps,
        "measure_s": round(measure_s, 1),
        "dashboard_updates_during_measurement": updates_after[-1] - updates_before[-1],
        "iopub_messages_between_cells": iopub,
    }
    for label, xs in samples.items():
        res[label] = {
            "p50_ms": round(1e3 * percentile(xs, 0.5), 2),
            "p95_ms": round(1e3 * percentile(xs, 0.95), 2),
            "mean_ms": round(1e3 * statistics.fmean(xs), 2),
        }
    res["p50_ratio"] = res["dashboard"]["p50_ms"] / res["idle"]["p50_ms"]
    res["p95_ratio"] = res["dashboard"]["p95_ms"] / res["idle"]["p95_ms"]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['cells_per_kernel']} cells per kernel while {steps} steps trained and the dashboard "
          f"updated {res['dashboard_updates_during_measurement']} times")  # fmt: skip
    print("| kernel | p50 ms | p95 ms |")
    print("|---|---|---|")
    for label in ("idle", "dashboard"):
        print(f"| {label} | {res[label]['p50_ms']} | {res[label]['p95_ms']} |")
    print(f"dashboard / idle: p50 {res['p50_ratio']:.2f}, p95 {res['p95_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
