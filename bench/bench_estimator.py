"""Estimator accuracy on CPU: the model-state bytes each rank really holds vs the estimate of
``nbtrain.control.memory``.

Two-rank runs of the tiny model (LoRA and full fine-tune, fp32) under DDP (ZeRO-0) and ZeRO-1/2/3. Each
rank measures the tensors holding its parameters, gradients, fp32 master copy and optimizer state at the
optimizer step (``ModelStateMeter`` in nbtrain/worker/measure.py: the runs are probe runs, the only ones
that install it); the estimate is the estimator's answer for the inputs the run really had (its
resolved.json). The measuring and the comparison are the ones
tests/worker/test_memory_measured.py asserts on (imported from it, not repeated here); this script
reports the per-strategy ratios instead of a pass/fail. Peak memory against the estimate needs a GPU:
bench/gpu.py. Results go to bench/results/estimator.json.

    python bench/bench_estimator.py [--parallel 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "estimator.json"
STRATEGY_LABEL = {"ddp": "ZeRO-0 (DDP)", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=2, help="runs started at once (each has 2 ranks)")
    args = ap.parse_args()

    from dataclasses import replace

    import nbtrain
    from nbtrain.control.start import prepare, start
    from nbtrain.examples import make_tiny_model, write_dataset
    from tests.conftest import lora_yaml
    from tests.worker.test_memory_measured import RUNS, STEPS, estimate_of, expected_parts, train_end

    os.environ.setdefault(
        "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "nbtrain" / "torch_extensions")
    )
    started = time.time()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-estimator-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)  # lora_yaml names ./tiny-llama and data/add.jsonl
        make_tiny_model(work / "tiny-llama")
        write_dataset(work / "data" / "add.jsonl")
        model_config = json.loads((work / "tiny-llama" / "config.json").read_text())

        names = list(RUNS)
        t0 = time.monotonic()
        for i in range(0, len(names), args.parallel):
            group = names[i : i + args.parallel]
            runs = []
            for name in group:
                method, strategy = RUNS[name]
                body = lora_yaml(STEPS, method=method) + f"distributed:\n  strategy: {strategy}\n"
                runs.append(start(replace(prepare(body, name=name), probe=True)))  # measured: a probe run
            for run in runs:
                st = run.wait(timeout=1200, check=False)
                if st.state != "completed":
                    raise RuntimeError(f"{run.name}: {st.describe()}\n{run.logs(40)}")
        wall = time.monotonic() - t0

        for name, (method, strategy) in RUNS.items():
            run = nbtrain.get_run(name)
            est = estimate_of(run, model_config)
            want = expected_parts(est)
            for e in train_end(run):
                got = {
                    "param_bytes": e["param_bytes"],
                    "grad_bytes": e["grad_bytes"],
                    "master+optimizer_state": e["master_bytes"] + e["optimizer_state_bytes"],
                    "model_state_bytes": e["model_state_bytes"],
                }
                rows.append({
                    "method": method, "strategy": strategy, "rank": e["rank"],
                    "measured": got, "estimated": want,
                    "ratio": {k: (got[k] / want[k] if want[k] else None) for k in got},
                })  # fmt: skip

    summary: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['method']}-{r['strategy']}"
        s = summary.setdefault(key, {"method": r["method"], "strategy": STRATEGY_LABEL[r["strategy"]],
                                     "measured_bytes_per_rank": [], "estimated_bytes_per_rank": [],
                                     "ratio_per_rank": []})  # fmt: skip
        s["measured_bytes_per_rank"].append(r["measured"]["model_state_bytes"])
        s["estimated_bytes_per_rank"].append(r["estimated"]["model_state_bytes"])
        s["ratio_per_rank"].append(round(r["ratio"]["model_state_bytes"], 4))
    worst = max(abs(x - 1) for s in summary.values() for x in s["ratio_per_rank"])
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "shared machine (other helpers ran tests); bytes do not depend on load",
        "model": "tiny Llama (nbtrain.examples), fp32, 2 ranks over gloo",
        "steps": STEPS,
        "wall_s": round(wall, 1),
        "worst_abs_error": round(worst, 4),
        "summary": summary,
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print("| method | strategy | measured B/rank | estimated B/rank | measured / estimated |")
    print("|---|---|---|---|---|")
    for s in summary.values():
        print(f"| {s['method']} | {s['strategy']} | {s['measured_bytes_per_rank'][0]:,} "
              f"| {s['estimated_bytes_per_rank'][0]:,.0f} "
              f"| {', '.join(f'{x:.4f}' for x in s['ratio_per_rank'])} |")  # fmt: skip
    print(f"worst |measured/estimated - 1| = {worst:.2%} ({len(rows)} rank reports, {wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
