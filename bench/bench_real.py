"""A real pretrained model: SmolLM2-135M-Instruct (nbtrain.example_model), the same LoRA job in nbtrain
(cold and warm), LLaMA-Factory, the bare TRL script and a bare PyTorch + peft loop, side by side in one run;
and the machine's limit, so each system's model FLOP utilisation (MFU) can be read against it.

- The job: bench/peers.lora_job on SmolLM2 and the addition data (LoRA r 8, alpha 16 on what nbtrain's
  ``target_modules: auto`` resolves to, batch 8, lr 1e-3, loss on every token), as bench_llamafactory runs
  it on the tiny models. Steps/s: the median interval between steps after the first two.
- The limit: a ``torch.mm`` loop of 1024 x 1024 fp32 matrices with torch's default threads, measured before
  and after the systems (the median is the figure).
- FLOPs a step really does, per token: LoRA keeps the base frozen, so its matmul weights cost a forward and
  the input gradients (4 x their parameters) and only the adapters also a weight gradient (6 x theirs);
  embeddings are looked up, not multiplied, but a tied LM head multiplies by them (counted once). Tokens per
  step: batch x the rows' mean length as tokenised (no padding counted). Attention's own FLOPs (small at
  these lengths) are left out for every system alike.
- The bare PyTorch + peft loop, the same job written as a minimal program: the model, the same LoRA, AdamW,
  and the same rows rendered by the chat template, shuffled, 8 to a batch, each batch right-padded to its
  longest row (padding masked out of the attention and the loss), forward + backward + step in a plain loop.
  So both do the same useful work per step (the rows' tokens) and pay the same padding. The loop is also
  run on a fixed batch of 8 rows of exactly the mean length (``bare_peft_unpadded``): no padding at all,
  the ceiling that packing the rows would approach; reported beside, not the yardstick.
- Every system runs watched alike: its process tree's peak RSS sampled every 50 ms from this process
  (before 2026-12-05 20:40 the bare loop ran unwatched, so it trained on 2 cores that nothing else used).
- The answers-only job (``nbtrain_answers``, ``bare_peft_answers``): the same job with ``train:
  assistant_only_loss: true``, the loss on the assistant's answer only (the template's system turn and the
  question masked), and the bare loop labelling the prompt's tokens -100 as a minimal program does. Both
  read the same tokens, so the same model FLOPs per step are counted for both (the usual MFU definition);
  nbtrain runs its LM head only where a label is, the loop everywhere.

    python bench/bench_real.py [--repeats 2] [--steps 16]    # writes bench/results/real.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "real.json"

from bench.bench_llamafactory import LLAMAFACTORY, lf_files, run_llamafactory  # noqa: E402
from bench.peers import lora_config, lora_job, rotated, run_nbtrain_as, start_warm  # noqa: E402

SYSTEMS = (
    "nbtrain_warm", "nbtrain", "bare_trl", "llamafactory", "bare_peft", "bare_peft_unpadded",
    "nbtrain_answers", "bare_peft_answers",
)  # fmt: skip

MATMUL = textwrap.dedent(
    """
    import sys, time, torch
    n, secs = 1024, float(sys.argv[1])
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(5):
        a @ b
    done, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        torch.mm(a, b)
        done += 1
    print(2 * n**3 * done / (time.perf_counter() - t))
    """
)

BARE_PEFT = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer
    resolved, length, steps = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
    answers_only = sys.argv[6] == "answers"
    cfg, lo = resolved["config"], resolved["config"]["lora"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=lo["r"], lora_alpha=lo["alpha"], lora_dropout=lo["dropout"],
                                             target_modules=sys.argv[4].split(","), task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    if sys.argv[5] == "unpadded":
        ids = torch.randint(0, model.config.vocab_size, (8, length))
        batches = [dict(input_ids=ids, labels=ids)] * steps
    else:
        tok = AutoTokenizer.from_pretrained(cfg["model"])
        rows = [json.loads(line) for line in open(sys.argv[5]) if line.strip()]
        def tokens(messages, **kw):
            return tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"]
        # answers only: the prompt is what the template renders before the last (assistant) turn
        prompts = [len(tokens(r["messages"][:-1], add_generation_prompt=True)) if answers_only else 0
                   for r in rows]
        rows = [tokens(r["messages"]) for r in rows]
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(42)).tolist()
        batches = []
        for i in range(steps):
            picks = [order[(8 * i + k) % len(rows)] for k in range(8)]
            width = max(len(rows[j]) for j in picks)
            ids = torch.full((8, width), tok.pad_token_id)
            mask = torch.zeros((8, width), dtype=torch.long)
            labels = torch.full((8, width), -100)
            for k, j in enumerate(picks):
                ids[k, : len(rows[j])] = torch.tensor(rows[j])
                mask[k, : len(rows[j])] = 1
                labels[k, prompts[j] : len(rows[j])] = ids[k, prompts[j] : len(rows[j])]
            batches.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    times = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
    gaps = [b - a for a, b in zip(times[2:], times[3:])]
    out = {"steady_steps_per_s": 1 / statistics.median(gaps), "final_loss": loss.item()}
    print("RESULT", json.dumps(out))
    """
)


def matmul_flops(secs: float = 4.0) -> float:
    out = subprocess.run(
        [sys.executable, "-c", MATMUL, str(secs)], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def run_bare_peft(
    resolved: Path,
    length: int,
    steps: int,
    targets: list[str],
    work: Path,
    rows: Path | None,
    answers_only: bool = False,
) -> dict[str, float]:
    """The loop on the job's rows (``rows``), or on one unpadded batch of ``length`` tokens (None); with
    ``answers_only`` the prompt's tokens are labelled -100 (the model still computes their logits, as a
    minimal loop does)."""
    import psutil

    from bench.bench_overhead import watch

    script = work / "bare_peft.py"
    script.write_text(BARE_PEFT)
    argv = [sys.executable, str(script), str(resolved), str(length), str(steps), ",".join(targets),
            "unpadded" if rows is None else str(rows), "answers" if answers_only else "all"]  # fmt: skip
    # watched as every other system is (its peak memory sampled every 50 ms while it runs): the sampling
    # takes a little of the 2 cores from whatever trains, so a loop left unwatched would be measured
    # under lighter load than the systems it is compared with
    log = work / "bare_peft.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        peak = watch(psutil.Process(proc.pid), lambda: proc.poll() is not None)
    text = log.read_text()
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"the bare peft loop failed:\n{text[-3000:]}")
    return {**json.loads(line.removeprefix("RESULT ")), "peak_rss": peak}


def token_facts(model: Path, data: Path) -> float:
    """The rows' mean length in tokens, as the chat template renders them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    lengths = [
        len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
        for r in rows
    ]
    return statistics.mean(lengths)


def paired(samples: dict[str, list[dict[str, float]]], a: str, b: str) -> float:
    """The median over repeats of a's steps/s over b's in the same repeat."""
    return statistics.median(
        x["steady_steps_per_s"] / y["steady_steps_per_s"] for x, y in zip(samples[a], samples[b], strict=True)
    )


# (name, a, b, what): a over b, for the pairs whose systems ran. "steps": steps/s; "mfu": FLOP utilisation,
# the medians' ratio; "paired": each repeat's ratio (the two ran minutes apart, under the same load), then
# their median. The answers-only job counts the same model FLOPs per step as the every-token one (the model's,
# for every token it reads).
RATIOS = (
    ("steps_per_s_ratio_vs_llamafactory", "nbtrain", "llamafactory", "steps"),
    ("warm_steps_per_s_ratio_vs_llamafactory", "nbtrain_warm", "llamafactory", "steps"),
    ("steps_per_s_ratio_vs_bare_trl", "nbtrain", "bare_trl", "steps"),
    ("mfu_ratio_vs_bare_peft", "nbtrain", "bare_peft", "mfu"),
    ("warm_mfu_ratio_vs_bare_peft", "nbtrain_warm", "bare_peft", "mfu"),
    ("mfu_ratio_vs_bare_peft_unpadded", "nbtrain", "bare_peft_unpadded", "mfu"),
    ("mfu_ratio_vs_bare_peft_paired", "nbtrain", "bare_peft", "paired"),
    ("warm_mfu_ratio_vs_bare_peft_paired", "nbtrain_warm", "bare_peft", "paired"),
    ("answers_mfu_ratio_vs_bare_peft", "nbtrain_answers", "bare_peft_answers", "mfu"),
    ("answers_mfu_ratio_vs_bare_peft_paired", "nbtrain_answers", "bare_peft_answers", "paired"),
)


def ratios(
    med: dict[str, dict[str, float]], mfu: dict[str, float], samples: dict[str, list[dict[str, float]]]
) -> dict[str, float]:
    out = {}
    for name, a, b, what in RATIOS:
        if a in med and b in med:
            if what == "steps":
                out[name] = med[a]["steady_steps_per_s"] / med[b]["steady_steps_per_s"]
            elif what == "mfu":
                out[name] = mfu[a] / mfu[b]
            else:
                out[name] = paired(samples, a, b)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument(
        "--systems", default=",".join(SYSTEMS), help="a comma-separated subset of: " + ", ".join(SYSTEMS)
    )
    args = ap.parse_args()
    systems = tuple(s for s in SYSTEMS if s in args.systems.split(","))
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "loadavg_start": os.getloadavg(),
    }
    error = LLAMAFACTORY.setup() if "llamafactory" in systems else None
    if error is not None:
        res["error"] = error
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(error, file=sys.stderr)
        return 1
    if "llamafactory" in systems:
        res["versions"] = {"llamafactory_venv": LLAMAFACTORY.versions()}
    import nbtrain
    from bench.bench_overhead import run_bare
    from nbtrain.examples import write_dataset

    flops = [matmul_flops()]
    print(f"matmul: {flops[0] / 1e9:.0f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-real-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        res["warm_process"] = start_warm()
        model = nbtrain.example_model(name="smollm2-135m-instruct")
        data = write_dataset(work / "data.jsonl", n=400)
        resolved = work / "resolved.json"
        config, cfg = lora_job(model, data, args.steps, resolved)
        # the same job with the loss on the answers only (the prompt, system turn included, masked)
        answers = lora_config(model, data, args.steps, train_extra=", assistant_only_loss: true")
        est = json.loads(resolved.read_text())["estimate"]
        lf = lf_files(work, model, data, "smollm2", args.steps, cfg)
        mean_len = token_facts(model, data)
        samples: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
        for i in range(args.repeats):
            for system in rotated(systems, i):
                if system == "nbtrain_answers":
                    r = run_nbtrain_as(False, answers, work, f"real-{system}-{i}")
                elif system.startswith("nbtrain"):
                    r = run_nbtrain_as(system == "nbtrain_warm", config, work, f"real-{system}-{i}")
                elif system == "bare_trl":
                    r = run_bare(resolved, work)
                elif system == "llamafactory":
                    r = run_llamafactory(lf)
                else:
                    rows = None if system == "bare_peft_unpadded" else data
                    r = run_bare_peft(resolved, round(mean_len), args.steps, cfg["targets"], work, rows,
                                      answers_only=system == "bare_peft_answers")  # fmt: skip
                samples[system].append(r)
                first = f", first step {r['first_step_s']:.1f} s" if "first_step_s" in r else ""
                print(f"  #{i} {system}: {r['steady_steps_per_s']:.3f} steps/s{first}", flush=True)
        from nbtrain.control.launch import warm

        warm.stop()
        os.chdir(ROOT)  # the work folder goes away with the block
    flops.append(matmul_flops())
    peak = statistics.median(flops)
    total, trainable = est["total_params"], est["trainable_params"]
    from nbtrain.control.memory import count_parameters, load_model_config

    pc = count_parameters(load_model_config(model) or {})
    matmul_params = total - pc.norms - (0 if pc.lm_head == 0 else pc.embeddings)  # tied head counted once
    per_token = 4 * matmul_params + 6 * trainable
    step_flops = 8 * mean_len * per_token
    med = {s: {k: statistics.median(x[k] for x in v) for k in v[0]} for s, v in samples.items()}
    mfu = {s: m["steady_steps_per_s"] * step_flops / peak for s, m in med.items()}
    res.update({
        "matmul_flops_per_s": flops, "mean_row_tokens": mean_len, "flops_per_step": step_flops,
        "params": {"total": total, "trainable": trainable, "matmul": matmul_params},
        "median": med, "mfu": mfu,
        **ratios(med, mfu, samples),
        "samples": samples, "loadavg_end": os.getloadavg(),
    })  # fmt: skip
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"matmul {peak / 1e9:.0f} GFLOP/s; a step {step_flops / 1e9:.0f} GFLOP ({mean_len:.1f} tokens/row)")
    print("| system | steps/s | first step s | peak RSS MiB | MFU |")
    print("|---|---|---|---|---|")
    for s in systems:
        m = med[s]
        first = f"{m['first_step_s']:.1f}" if "first_step_s" in m else "-"
        rss = f"{m['peak_rss'] / 2**20:.0f}" if "peak_rss" in m else "-"
        print(f"| {s} | {m['steady_steps_per_s']:.3f} | {first} | {rss} | {mfu[s]:.2f} |")
    for key, value in ratios(med, mfu, samples).items():
        print(f"{key}: {value:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
