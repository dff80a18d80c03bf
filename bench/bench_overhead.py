"""nbtrain vs a bare TRL script with identical arguments: training speed, time to first step, peak RSS
of the whole process tree, and the kernel-side cost of ``%load_ext nbtrain``. Runs alternate
(A B, then B A) and the table reports medians and ratios from the same run, since these machines are
noisy.

    python bench/bench_overhead.py [--repeats 5] [--steps 40]     # writes bench/results/overhead.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The bare script: what a user would write by hand with TRL, given the same arguments nbtrain resolved.
BARE = textwrap.dedent(
    """
    import json, sys, time
    T0 = float(sys.argv[3])
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import SFTConfig, SFTTrainer

    resolved = json.load(open(sys.argv[1]))
    cfg, args = resolved["config"], resolved["train_args"]
    steps, losses = [], []

    class Steps(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            steps.append(time.time())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    set_seed(args.get("seed", 42))
    tok = AutoTokenizer.from_pretrained(cfg["model"])
    ds = load_dataset("json", data_files=cfg["data"]["train"], split="train")
    model = AutoModelForCausalLM.from_pretrained(cfg["model"])
    lo = cfg["lora"]
    model = get_peft_model(model, LoraConfig(r=lo["r"], lora_alpha=lo["alpha"], lora_dropout=lo["dropout"],
                                             task_type="CAUSAL_LM"))
    trainer = SFTTrainer(model=model, args=SFTConfig(output_dir=sys.argv[2], **args), train_dataset=ds,
                         processing_class=tok, callbacks=[Steps()])
    out = trainer.train()
    print("RESULT", json.dumps({"first_step_s": steps[0] - T0, "step_times": steps,
                                "steps_per_s": out.metrics["train_steps_per_second"],
                                "final_loss": losses[-1]}), flush=True)
    """
)


def watch(proc: psutil.Process, done: Any) -> int:
    """Peak RSS of ``proc`` and its children, sampled every 50 ms until ``done()``."""
    peak = 0
    while not done():
        try:
            procs = [proc, *proc.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return peak


def run_nbtrain(config: str, workdir: Path, name: str, skip: int = 2) -> dict[str, float]:
    import nbtrain
    from nbtrain.control.launch import process

    t0 = time.time()
    run = nbtrain.finetune(config, name=name)
    info = process.read_launch(run.paths)
    assert info is not None
    peak = watch(psutil.Process(info["pid"]), lambda: not process.group_alive(info))
    st = run.wait(timeout=1800)
    m = run.metrics()
    m = m[m["loss"].notna()]  # one row per step (logging_steps 1), written as the step ends
    times = m["t"].tolist()
    return {
        "first_step_s": float(times[0]) - t0,
        "steps_per_s": float(st.summary["train_steps_per_second"]),
        "steady_steps_per_s": steady(times, skip),
        "final_loss": float(m["loss"].iloc[-1]),
        "peak_rss": peak,
    }


def steady(step_times: list[float], skip: int = 2) -> float:
    """Steps/s from the median interval between consecutive steps, the first ``skip`` left out
    (warm-up): unlike the Trainer's steps/s over the whole loop, one slow spell of a shared machine
    moves it little."""
    times = step_times[skip:]
    return 1.0 / statistics.median(b - a for a, b in itertools.pairwise(times))


def run_bare(resolved: Path, workdir: Path, skip: int = 2) -> dict[str, float]:
    script = workdir / "bare.py"
    script.write_text(BARE)
    t0 = time.time()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with open(workdir / "bare.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(script), str(resolved), str(workdir / "ckpt"), str(t0)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
        peak = watch(psutil.Process(proc.pid), lambda: proc.poll() is not None)
    line = next(ln for ln in (workdir / "bare.log").read_text().splitlines() if ln.startswith("RESULT"))
    got = json.loads(line.removeprefix("RESULT "))
    got["steady_steps_per_s"] = steady(got.pop("step_times"), skip)
    return {**got, "peak_rss": peak}


def kernel_cost() -> dict[str, float]:
    code = textwrap.dedent(
        """
        import sys, time
        from IPython.core.interactiveshell import InteractiveShell
        sh = InteractiveShell.instance()
        before = set(sys.modules)
        t = time.perf_counter()
        sh.run_line_magic("load_ext", "nbtrain")
        dt = time.perf_counter() - t
        new = set(sys.modules) - before
        heavy = sorted(m for m in ("torch", "transformers", "bitsandbytes", "trl") if m in sys.modules)
        print(dt, len(new), ",".join(heavy) or "-")
        """
    )
    samples = []
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        samples.append((float(out[0]), int(out[1]), out[2]))
    return {"load_ext_s_median": statistics.median(s[0] for s in samples), "modules_imported": samples[0][1],
            "heavy_modules": samples[0][2]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kernel-only", action="store_true", help="re-measure %%load_ext only (kernel_date)")
    args = ap.parse_args()
    from nbtrain.examples import make_tiny_model, write_dataset

    out = ROOT / "bench" / "results" / "overhead.json"
    if args.kernel_only:
        kept = json.loads(out.read_text())
        kept.update(kernel=kernel_cost(), kernel_date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        out.write_text(json.dumps(kept, indent=1) + "\n")
        print(kept["kernel"])
        return 0
    results: dict[str, object] = {"kernel": kernel_cost()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        # Cold, like the bare script: the first cold start also starts a warm process, and the runs after
        # it were forked warm (a first step of ~0.8 s against the script's ~6 s). Warm starts are measured
        # side by side in bench_llamafactory and bench_msswift.
        os.environ["NBTRAIN_WARM"] = "0"
        os.chdir(work)
        write_dataset(work / "data.jsonl", n=400)
        models = {
            "tiny": make_tiny_model(work / "tiny"),
            "40M": make_tiny_model(work / "m40", hidden_size=512, num_layers=12),
        }
        for label, model in models.items():
            config = textwrap.dedent(
                f"""
                model: {model}
                method: lora
                data: {{train: {work / "data.jsonl"}}}
                train: {{max_steps: {args.steps}, per_device_train_batch_size: 8, learning_rate: 1.0e-3,
                         save_strategy: "no"}}
                """
            )
            import nbtrain

            nb, bare = [], []
            for i in range(args.repeats):
                # A B, then B A: neither always runs first (a slow spell of this machine, or caches
                # warmed by the other, would otherwise bias one side). The bare script takes the
                # arguments nbtrain resolved (the same in every repeat).
                if i % 2 == 0:
                    nb.append(run_nbtrain(config, work, f"{label}-{i}"))
                    bare.append(run_bare(nbtrain.get_run(f"{label}-{i}").paths.resolved, work))
                else:
                    bare.append(run_bare(nbtrain.get_run(f"{label}-{i - 1}").paths.resolved, work))
                    nb.append(run_nbtrain(config, work, f"{label}-{i}"))
            med = {k: statistics.median(x[k] for x in nb) for k in nb[0]}
            bmed = {k: statistics.median(x[k] for x in bare) for k in bare[0]}
            results[label] = {
                "nbtrain": med, "bare_trl": bmed,
                "steps_per_s_ratio": med["steps_per_s"] / bmed["steps_per_s"],
                "steady_steps_per_s_ratio": med["steady_steps_per_s"] / bmed["steady_steps_per_s"],
                "first_step_ratio": med["first_step_s"] / bmed["first_step_s"],
                "peak_rss_ratio": med["peak_rss"] / bmed["peak_rss"],
                "samples": {"nbtrain": nb, "bare_trl": bare},
            }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **results}, indent=1) + "\n"
    )
    k = results["kernel"]
    print(f"%load_ext nbtrain: {k['load_ext_s_median'] * 1000:.0f} ms (median of 5), "  # type: ignore[index]
          f"{k['modules_imported']} modules, heavy: {k['heavy_modules']}")  # type: ignore[index]  # fmt: skip
    print(
        "| model | steps/s ratio, median step (nbtrain / bare TRL, target >= 0.98) | steps/s ratio, "
        "Trainer's whole loop | first-step ratio (target <= 1.10) | peak RSS ratio |"
    )
    print("|---|---|---|---|---|")
    for label in ("tiny", "40M"):
        r: Any = results[label]
        print(f"| {label} | {r['steady_steps_per_s_ratio']:.3f} | {r['steps_per_s_ratio']:.3f} "
              f"| {r['first_step_ratio']:.3f} | {r['peak_rss_ratio']:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
