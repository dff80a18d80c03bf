"""Multi-process scaling on CPU: one rank vs two ranks under DDP and under DeepSpeed ZeRO-2, tokens/s.

The ~40M Llama (nbtrain.examples, hidden 512, 12 layers) with LoRA, 8 rows per rank per step, started
through nbtrain as a user would (``distributed: {strategy: ..., num_processes: ...}``). Throughput is
the training tokens (all ranks, as the Trainer counts them) between the 5th and the last logged step,
over the wall time between them, so start-up and warm-up are left out. The configurations alternate
(order rotated each repeat); medians are reported.

Read with care: this machine has 2 cores. One rank can use both (torch's intra-op threads); two ranks
get one core each and add gloo all-reduces. With the compute split evenly ~1x would be the ceiling, so
the ratio says what the distributed plumbing costs, not what a second device buys. The launchers also
set threads differently (THREADS_NOTE): on a busy shared machine two threads in one process can lose
more than a second rank costs, which "1 rank, 1 thread" separates. Results go to
bench/results/scaling.json.

    python bench/bench_scaling.py [--repeats 3] [--steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers import lora_config  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scaling.json"
# label -> (strategy, ranks, OMP_NUM_THREADS for the worker or None for torch's default). "1 rank, 1 thread"
# is there to tell the cost of a second rank from the cost of two threads fighting in one rank.
CONFIGS: dict[str, tuple[str, int, str | None]] = {
    "1 rank": ("none", 1, None),
    "1 rank, 1 thread": ("none", 1, "1"),
    "2 ranks DDP": ("ddp", 2, None),
    "2 ranks ZeRO-2": ("zero2", 2, None),
}
WARMUP_STEPS = 5
THREADS_NOTE = (
    "1 rank runs with torch's default intra-op threads (one per core) unless OMP_NUM_THREADS=1 is set "
    "('1 rank, 1 thread'); under torchrun and deepspeed each of the 2 ranks gets OMP_NUM_THREADS=1 "
    "(their launchers' default)."
)


def throughput(run: Any) -> dict[str, float]:
    from nbtrain.contract.rundir import read_jsonl

    rows = [r for r in read_jsonl(run.paths.metrics) if "loss" in r and "tokens" in r]
    a = next(r for r in rows if r["step"] >= WARMUP_STEPS)
    b = rows[-1]
    dt = b["t"] - a["t"]
    return {"tokens_per_s": (b["tokens"] - a["tokens"]) / dt, "steps_per_s": (b["step"] - a["step"]) / dt}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()

    import nbtrain
    from nbtrain.examples import make_tiny_model, write_dataset

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/nbtrain/torch_extensions"))
    started = time.time()
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-scaling-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        model = make_tiny_model(work / "m40", hidden_size=512, num_layers=12)
        data = write_dataset(work / "data.jsonl", n=800)
        labels = list(CONFIGS)
        for i in range(args.repeats):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                strategy, n, threads = CONFIGS[label]
                config = lora_config(
                    model, data, args.steps, f"distributed: {{strategy: {strategy}, num_processes: {n}}}\n"
                )
                os.environ.pop("OMP_NUM_THREADS", None)
                if threads is not None:  # the detached worker inherits this process's environment
                    os.environ["OMP_NUM_THREADS"] = threads
                run = nbtrain.finetune(config, name=f"scale-{strategy}-{n}-{threads}-{i}")
                os.environ.pop("OMP_NUM_THREADS", None)
                st = run.wait(timeout=1800, check=False)
                if st.state != "completed":
                    raise RuntimeError(f"{label}: {st.describe()}\n{run.logs(40)}")
                world = run.resolved["plan"]["world_size"]
                if world != n:
                    raise RuntimeError(f"{label}: planned {world} ranks, expected {n}")
                r = throughput(run)
                samples[label].append(r)
                print(f"  #{i} {label}: {r['tokens_per_s']:.0f} tokens/s", flush=True)

    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in samples.items()}
    base = med["1 rank"]["tokens_per_s"]
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "shared machine: other helpers ran tests at the same time; configurations alternate",
        "loadavg_end": os.getloadavg(),
        "model": "Llama hidden 512, 12 layers (nbtrain.examples), LoRA r 8, fp32, 8 rows per rank per step",
        "threads": THREADS_NOTE,
        "median": med,
        "speedup_vs_1_rank": {k: v["tokens_per_s"] / base for k, v in med.items()},
        "samples": samples,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print("| configuration | tokens/s | vs 1 rank |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v['tokens_per_s']:.0f} | {v['tokens_per_s'] / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
