"""Packing (padding-free, TRL's bfd) vs padded batches on variable-length chat data: effective
(non-padding) tokens per second of the same model, through nbtrain's own runs, side by side.

Both arms train on about the same number of real tokens per optimizer step, so the difference is the
padding: unpacked, 8 rows per step padded to the longest row of the batch; packed, one sequence of 512
tokens per step holding several whole rows (``packing: true``: TRL's best-fit-decreasing packing,
padding-free). On CPU, transformers' SDPA attention turns the packed position_ids into a block-diagonal
mask, so documents do not attend to each other, but the attention is computed densely over the whole
packed sequence (flash-attention's varlen kernels on a GPU skip the masked blocks): one 512-token
sequence per step keeps that cost comparable to the padded arm's. Runs alternate
(A B A B ...) and the table reports medians and the ratio from the same run, since these machines are
noisy. Tokens/s is TRL's ``num_tokens`` (non-padding tokens) over wall time between logged steps,
after the first few steps; tokens per CPU-second divides the same tokens by the worker's CPU time over
the same steps (sampled when those steps are logged), which other processes on a shared machine
disturb much less than wall time.

    python bench/bench_packing.py [--repeats 2] [--steps 20]     # writes bench/results/packing.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WARMUP = 3  # logged steps left out of the rate (imports, first allocations, dataloader start)


def cpu_seconds_at_steps(run: Any, steps: tuple[int, int]) -> dict[int, float]:
    """The worker's CPU time (user + system) when each of ``steps`` was logged, polled until it exits."""
    import psutil

    from nbtrain.control.launch import process

    info = None
    while info is None:
        info = process.read_launch(run.paths)
        time.sleep(0.05)
    proc = psutil.Process(info["pid"])
    seen: dict[int, float] = {}
    while len(seen) < len(steps):
        try:
            t = proc.cpu_times()
            cpu = t.user + t.system
        except psutil.Error:
            break  # exited
        done = len(run.paths.metrics.read_text().splitlines()) - 1 if run.paths.metrics.exists() else 0
        for step in steps:
            if step not in seen and done >= step:
                seen[step] = cpu
        time.sleep(0.02)
    return seen


def effective_rate(run: Any, cpu: dict[int, float]) -> dict[str, float]:
    m = run.metrics()
    m = m[m["num_tokens"].notna()]
    a, b = m.iloc[WARMUP], m.iloc[-1]
    steps = int(b["step"] - a["step"])
    tokens = float(b["num_tokens"] - a["num_tokens"])
    seconds = float(b["t"] - a["t"])
    cpu_s = cpu[int(b["step"])] - cpu[int(a["step"])]
    return {
        "tokens_per_s": tokens / seconds,
        "tokens_per_cpu_s": tokens / cpu_s,
        "tokens_per_step": tokens / steps,
        "s_per_step": seconds / steps,
        "final_loss": float(m["loss"].iloc[-1]),
    }


def padding_share(resolved: dict[str, Any], batch: int) -> float:
    """The share of padding in unpacked batches of ``batch`` rows, from the real tokenised lengths."""
    from nbtrain.worker.jobs.preview import tokenised
    from nbtrain.worker.model import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        ds, _ = tokenised(resolved, load_tokenizer(resolved["config"]), 2000, tmp)
        lengths = [len(x) for x in ds["input_ids"]]
    real = padded = 0
    for i in range(0, len(lengths) - batch + 1, batch):
        chunk = lengths[i : i + batch]
        real += sum(chunk)
        padded += max(chunk) * batch
    return 1 - real / padded


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import nbtrain
    from nbtrain.examples import make_tiny_model, variable_length_rows

    arms = {
        "padded": "per_device_train_batch_size: 8, max_length: 512",
        "packed": "per_device_train_batch_size: 1, max_length: 512, packing: true",
    }
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        rows = variable_length_rows(2000, seed=0)
        (work / "var.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        # Wider than the test model, so a step's time is compute (what padding wastes), not overhead.
        model = make_tiny_model(work / "m", hidden_size=512, num_layers=2)
        for i in range(args.repeats):
            for arm, train in arms.items():
                config = textwrap.dedent(
                    f"""
                    model: {model}
                    method: full
                    data: {{train: {work / "var.jsonl"}}}
                    train: {{max_steps: {args.steps}, {train}, learning_rate: 5.0e-4, logging_steps: 1,
                             save_strategy: "no", assistant_only_loss: true}}
                    """
                )
                run = nbtrain.finetune(config, name=f"{arm}-{i}")
                cpu = cpu_seconds_at_steps(run, (WARMUP + 1, args.steps))
                st = run.wait(timeout=1800)
                if st.state != "completed":
                    print(run.logs(40), file=sys.stderr)
                    return 1
                samples[arm].append(effective_rate(run, cpu))
                print(f"{arm} #{i}: {samples[arm][-1]}", flush=True)
        resolved = nbtrain.get_run("padded-0").resolved
        padding = padding_share(resolved, 8)
    med = {arm: {k: statistics.median(s[k] for s in samples[arm]) for k in samples[arm][0]} for arm in arms}
    # Paired: each round's packed run against the padded run just before it. The machine's speed drifts
    # (other processes, frequency) by several times over minutes, more than the arms differ, so the
    # median of same-round ratios is the figure; medians of each arm over all rounds are shown too.
    pairs = list(zip(samples["packed"], samples["padded"], strict=True))
    paired = [p["tokens_per_s"] / u["tokens_per_s"] for p, u in pairs]
    paired_cpu = [p["tokens_per_cpu_s"] / u["tokens_per_cpu_s"] for p, u in pairs]
    ratio, cpu_ratio = statistics.median(paired), statistics.median(paired_cpu)
    results = {
        "model": "Llama, hidden 512, 2 layers, vocab ~1000 (nbtrain.examples.make_tiny_model), full FT, CPU",
        "data": "2000 chat rows of 1-16 sums (variable_length_rows): 18-215 tokens, skewed short",
        "arms": arms,
        "steps": args.steps,
        "padding_share_unpacked_batch8": padding,
        "median": med,
        "effective_tokens_per_s_ratio": ratio,
        "effective_tokens_per_cpu_s_ratio": cpu_ratio,
        "paired_round_ratios": paired,
        "paired_round_cpu_ratios": paired_cpu,
        "target": ">= 1.5",
        "samples": samples,
    }
    out = ROOT / "bench" / "results" / "packing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **results}, indent=1) + "\n"
    )
    print("| arm | non-padding tokens/s | tokens per CPU-s | tokens/step | s/step |")
    print("|---|---|---|---|---|")
    for arm in arms:
        r = med[arm]
        print(f"| {arm} | {r['tokens_per_s']:.0f} | {r['tokens_per_cpu_s']:.0f} | {r['tokens_per_step']:.0f} "
              f"| {r['s_per_step']:.3f} |")  # fmt: skip
    print(f"padding in unpacked batches of 8: {padding:.0%}")
    print(f"effective tokens/s, packed / padded (median of rounds): {ratio:.2f}x (target >= 1.5x), "
          f"per CPU-s {cpu_ratio:.2f}x; rounds: {', '.join(f'{x:.2f}x' for x in paired)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
