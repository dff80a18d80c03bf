"""The GPU section, as one script: tokens/s, peak memory and MFU for LoRA and QLoRA on random-initialised
1B- and 7B-shaped Llamas, nbtrain's auto plan vs the plain TRL defaults.

Models: TinyLlama-1.1B's shape (hidden 2048, 22 layers, GQA 32/4, MLP 5632) and Llama-2-7B's (hidden
4096, 32 layers, 32 heads, MLP 11008), vocab 32000, random weights saved in bf16 (no hub); the tiny
model's tokenizer (its ids all lie inside the 32000-row embedding). Data: plain-text rows far longer
than 1024 tokens, so every sequence is exactly 1024 tokens and tokens/step = effective batch x 1024.

- ``nbtrain auto``: a %%finetune config with ``per_device_train_batch_size: auto`` and ``precision:
  auto``; the plan picks precision, micro-batch and gradient accumulation (recorded in the results).
- ``TRL defaults``: what a user writes by hand -- SFTConfig with its defaults (batch 8, its precision
  and gradient-checkpointing defaults), peft LoraConfig(r 8, alpha 16), for QLoRA BitsAndBytesConfig
  NF4 with bf16 compute + prepare_model_for_kbit_training.

Throughput is measured between the 3rd and the last step (start-up and warm-up left out); peak memory is
``torch.cuda.max_memory_allocated`` in the training process (nbtrain: its system.jsonl). MFU counts
6 x parameters + the attention term (12 x layers x hidden x seq) FLOPs per token -- the usual definition,
so a LoRA run, which skips the frozen weights' gradients, cannot reach 100% -- against the GPU's dense
bf16 peak (table below; ``--peak-tflops`` overrides). For nbtrain's runs the estimate's tensors are
compared with the measured peak as well. Results go to bench/results/gpu.json.

    python bench/gpu.py [--sizes 1b,7b] [--methods lora,qlora] [--steps 12]   # needs an NVIDIA GPU
    python bench/gpu.py --dry-run     # anywhere: the whole pipeline on CPU, tiny shape, 4 steps, no file

Without a GPU (and without --dry-run) it says so and exits 0, writing nothing. The full matrix (2 sizes
x 2 methods x 2 modes) takes about 10 minutes on one H100/H200, most of it building and loading the 7B.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
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
RESULTS = ROOT / "bench" / "results" / "gpu.json"
WARMUP_STEPS = 3
SEQ = 1024  # --dry-run: 32, so the CPU rehearsal takes seconds per run

SHAPES: dict[str, dict[str, int]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
    },
    "7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    },
    # --dry-run: the same code paths on CPU in seconds, with the tokenizer's own ~600 tokens (a 32000
    # vocab's logits were most of the rehearsal's compute)
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
    },
}

# Dense bf16 peak FLOP/s (no sparsity), by a substring of the NVML name.
PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "A10G": 125e12,
    "A10": 125e12,
    "L4": 121e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
}

# The hand-written TRL script: SFTConfig defaults except what every run must set (steps, logging, no
# checkpoints, no reporting); extra SFTConfig arguments come as JSON (--dry-run: use_cpu on a CPU).
BARE = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    model_dir, data, out, method, steps, extra = sys.argv[1:7]
    extra = json.loads(extra)
    cuda = torch.cuda.is_available()
    compute = torch.bfloat16 if cuda else torch.float32
    times = []

    class Times(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            times.append((state.global_step, time.time()))

    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data, split="train")
    kw = {"dtype": compute}
    if method == "qlora":
        kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                       bnb_4bit_compute_dtype=compute)
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    if method == "qlora":
        model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM"))
    args = SFTConfig(output_dir=out, max_steps=int(steps), logging_steps=1, save_strategy="no",
                     report_to="none", **extra)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[Times()])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    result = {"times": times, "peak_bytes": peak, "micro_batch": args.per_device_train_batch_size,
              "grad_accum": args.gradient_accumulation_steps, "bf16": args.bf16, "fp16": args.fp16,
              "gradient_checkpointing": args.gradient_checkpointing, "max_length": args.max_length}
    print("RESULT", json.dumps(result), flush=True)
    """
)


def build_model(shape: str, path: Path) -> Path:
    """A random-initialised Llama of ``shape`` with the tiny model's tokenizer, saved in bf16. Built in a
    child process (on the GPU when there is one: seconds instead of minutes for 7B), so this process
    never holds GPU memory while the runs measure theirs."""
    code = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
        from nbtrain.examples import make_tiny_model
        path = Path({str(path)!r})
        tok = AutoTokenizer.from_pretrained(make_tiny_model(path.parent / (path.name + "-tok")))
        tok.save_pretrained(path)
        cfg = LlamaConfig(max_position_embeddings=4096, tie_word_embeddings=False,
                          pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, **{SHAPES[shape]!r})
        torch.manual_seed(0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(path)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return path


def params_of(shape: str) -> int:
    s = SHAPES[shape]
    h, i, n, heads, kv = (s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"],
                          s["num_attention_heads"], s["num_key_value_heads"])  # fmt: skip
    attn = h * h * 2 + 2 * h * (h // heads * kv)  # q, o + k, v
    return n * (attn + 3 * h * i + 2 * h) + 2 * s["vocab_size"] * h + h


def flops_per_token(shape: str, seq: int) -> float:
    s = SHAPES[shape]
    return 6 * params_of(shape) + 12 * s["num_hidden_layers"] * s["hidden_size"] * seq


def throughput(times: list[tuple[int, float]], tokens_per_step: int) -> float:
    a = next(x for x in times if x[0] >= WARMUP_STEPS)
    b = times[-1]
    return (b[0] - a[0]) * tokens_per_step / (b[1] - a[1])


def run_nbtrain(
    model: Path, data: Path, method: str, steps: int, seq: int, name: str, mode: str = "nbtrain auto"
) -> dict[str, Any]:
    """One nbtrain run of ``mode`` (MODES: the auto plan, or it with one fast path turned the other way)."""
    import nbtrain
    from nbtrain.contract.rundir import read_json, read_jsonl
    from nbtrain.control.config import trainargs
    from nbtrain.control.launch import process

    more = MODES[mode]
    config = textwrap.dedent(
        f"""
        model: {model}
        method: {method}
        data: {{train: {data}, format: text}}
        precision: auto
        train: {{max_steps: {steps}, per_device_train_batch_size: auto, max_length: {seq},
                 logging_steps: 1, save_strategy: "no"{", " + more if more else ""}}}
        """
    )
    run = nbtrain.finetune(config, name=name)
    st = run.wait(timeout=3600, check=False)
    # The run is done once it says so; its process may still be letting go of the GPU, and the next run's
    # plan would count that memory as taken by others (run 2 on the H200 did: checkpointing on, not off).
    info = process.read_launch(run.paths)
    deadline = time.monotonic() + 120
    while info is not None and process.group_alive(info) and time.monotonic() < deadline:
        time.sleep(0.2)
    if st.state != "completed":
        raise RuntimeError(f"nbtrain {name}: {st.describe()}\n{run.logs(40)}")
    resolved = read_json(run.paths.resolved)
    args, plan = resolved["train_args"], resolved["plan"]
    micro = int(args["per_device_train_batch_size"])
    accum = int(trainargs.value(args, "gradient_accumulation_steps", resolved["config"]["objective"]))
    times = [(int(r["step"]), float(r["t"])) for r in read_jsonl(run.paths.metrics) if "loss" in r]
    peaks = [r["gpu_mem_peak"] for r in read_jsonl(run.paths.system) if "gpu_mem_peak" in r]
    est = plan.get("estimate") or {}
    tensors = est["per_device_bytes"] - est["parts"]["overhead"] if est else None
    peak = max(peaks) if peaks else None
    return {
        "tokens_per_s": throughput(times, micro * accum * plan["world_size"] * seq),
        "peak_bytes": peak, "micro_batch": micro, "grad_accum": accum, "precision": plan["precision"],
        "gradient_checkpointing": trainargs.value(args, "gradient_checkpointing"),
        "use_liger_kernel": bool(args.get("use_liger_kernel")),
        "optim": args.get("optim"), "torch_compile": bool(args.get("torch_compile")),
        "attn_implementation": (args.get("model_init_kwargs") or {}).get("attn_implementation")
        or plan.get("attn_implementation") or "sdpa",
        "plan_reasons": plan["reasons"],
        "estimate_tensor_bytes": tensors,
        "peak_vs_estimate": (peak / tensors) if peak and tensors else None,
    }  # fmt: skip


def run_bare(
    model: Path, data: Path, method: str, steps: int, work: Path, extra: dict[str, Any]
) -> dict[str, Any]:
    script = work / "bare_gpu.py"
    script.write_text(BARE)
    argv = [sys.executable, str(script), str(model), str(data), str(work / "bare-out"), method, str(steps),
            json.dumps(extra)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        err = "\n".join(ln for ln in out.stderr.splitlines() if "it/s]" not in ln and "it]" not in ln)
        raise RuntimeError(
            f"bare TRL {method} failed (rc {out.returncode}):\n{out.stdout[-2000:]}\n{err[-4000:]}"
        )
    r = json.loads(line.removeprefix("RESULT "))
    times = [(int(s), float(t)) for s, t in r["times"]]
    return {
        "tokens_per_s": throughput(times, r["micro_batch"] * r["grad_accum"] * r["max_length"]),
        "peak_bytes": r["peak_bytes"], "micro_batch": r["micro_batch"], "grad_accum": r["grad_accum"],
        "precision": "bf16" if r["bf16"] else "fp16" if r["fp16"] else "fp32",
        "gradient_checkpointing": r["gradient_checkpointing"],
    }  # fmt: skip


# nbtrain's auto plan, and it with one of the plan's fast paths turned the other way (the train: keys);
# the hand-written TRL script with its defaults (and with Liger's kernels).
MODES: dict[str, str] = {
    "nbtrain auto": "",
    "nbtrain liger-off": "use_liger_kernel: false",
    "nbtrain liger-on": "use_liger_kernel: true",
    "nbtrain sdpa": "model_init_kwargs: {attn_implementation: sdpa}",
    "nbtrain adamw-unfused": "optim: adamw_torch",
    "nbtrain compile": "torch_compile: true",
    "TRL defaults": "",
    "TRL defaults liger": "",
}


def modes(method: str, gpu: bool, size: str = "1b") -> list[str]:
    """nbtrain's auto plan against TRL's defaults, and on a GPU each fast path the plan takes turned the
    other way: Liger's kernels where liger-kernel is installed (for LoRA also TRL's defaults with them),
    flash-attention (for LoRA) where flash-attn is, the fused AdamW and torch.compile (which the plan
    leaves off; LoRA). Larger shapes than the 1B: the auto plan and TRL's defaults only."""
    out = ["nbtrain auto", "TRL defaults"]
    if not gpu or size != "1b":
        return out
    if importlib.util.find_spec("liger_kernel") is not None:
        out.insert(1, "nbtrain liger-off")
        if method == "lora":
            out.append("TRL defaults liger")
    if method == "lora":
        if importlib.util.find_spec("flash_attn") or importlib.util.find_spec("flash_attn_interface"):
            out.insert(1, "nbtrain sdpa")  # the plan picks flash-attention where installed: the other way
        out[1:1] = ["nbtrain adamw-unfused", "nbtrain compile"]
    return out


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes",
                 "liger-kernel", "flash-attn"):  # fmt: skip
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def write(res: dict[str, Any], dry_run: bool) -> None:
    """The results file and its Markdown report beside it (gpu.md's sibling, ``REPORT``); a CPU rehearsal
    writes nothing (it is no result)."""
    if dry_run:
        return
    out = Path(res["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    out.with_name(out.stem + "_report.md").write_text(report(res))


def gpu_test_files() -> list[str]:
    """The test files that hold ``gpu``-marked tests (found by their text: collecting the whole suite
    would take longer than running these)."""
    files = (ROOT / "tests").rglob("test_*.py")
    return sorted(str(f.relative_to(ROOT)) for f in files if "pytest.mark.gpu" in f.read_text())


def run_gpu_tests(timeout: float, log: Path) -> dict[str, Any]:
    """``pytest -m gpu`` over gpu_test_files(), cut off after ``timeout`` seconds; its output to ``log``."""
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", "gpu",
            *gpu_test_files()]  # fmt: skip
    started = time.monotonic()
    try:
        out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        text, rc = text + f"\n(cut off after {timeout:.0f} s)", None
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error", "deselected")}
    ends = [ln for ln in text.splitlines() if " in " in ln and re.search(r"\d+ (passed|failed|skipped)", ln)]
    last = ends[-1] if ends else ""
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last):
        counts[word.rstrip("s") if word.startswith("error") else word] += int(n)
    return {"rc": rc, **counts, "seconds": round(time.monotonic() - started, 1), "summary": last.strip("= "),
            "log": str(log)}  # fmt: skip


def report(res: dict[str, Any]) -> str:
    """The short Markdown report of a results file: machine, versions, the gpu tests, the table."""
    lines = [f"# bench/gpu.py, {res['date']}", "", f"Machine: {res['machine']}. "
             + ", ".join(f"{k} {v}" for k, v in res["versions"].items() if v) + ".", ""]  # fmt: skip
    t = res.get("tests")
    if t:
        lines += [f"gpu-marked tests: {t['summary'] or 'no summary'} (rc {t['rc']}, {t['seconds']} s; log "
                  f"{Path(t['log']).name})", ""]  # fmt: skip
    lines += [*table(res["rows"]), ""]
    if res.get("skipped_rows"):
        lines += ["Not run (the time budget): " + "; ".join(res["skipped_rows"]), ""]
    lines.append("Finished." if res["finished"] else "Cut off before the end.")
    return "\n".join(lines) + "\n"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| model | method | mode | tokens/s | peak GiB | micro x accum | MFU |", "|---" * 7 + "|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['size']} | {r['method']} | {r['mode']} | failed | - | - | - |")
            continue
        peak = f"{r['peak_bytes'] / 2**30:.1f}" if r["peak_bytes"] else "-"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        out.append(f"| {r['size']} | {r['method']} | {r['mode']} | {r['tokens_per_s']:.0f} | {peak} "
                   f"| {r['micro_batch']}x{r['grad_accum']} | {mfu} |")  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1b,7b")
    ap.add_argument("--methods", default="lora,qlora")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU, if not listed"
    )
    ap.add_argument("--dry-run", action="store_true", help="the whole pipeline on CPU with a tiny shape")
    ap.add_argument("--modes", default="", help=f"comma-separated, of {', '.join(MODES)} (default: modes())")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    ap.add_argument(
        "--all", action="store_true",
        help="the one GPU command: the gpu-marked tests first, then the benchmark rows, most telling first, "
        "while --budget lasts",
    )  # fmt: skip
    ap.add_argument("--budget", type=float, default=450.0, help="--all: seconds for everything (default 450)")
    args = ap.parse_args()
    unknown = [m for m in args.modes.split(",") if m and m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; modes are {', '.join(MODES)}")

    from nbtrain.contract.errors import NbtrainError
    from nbtrain.hardware import probe

    started = time.time()
    deadline = time.monotonic() + args.budget if args.all else float("inf")
    hw = probe()
    if not hw.gpus and not args.dry_run:
        print(f"bench/gpu.py: no NVIDIA GPU found through NVML ({hw.nvml_error}); nothing measured. "
              "Run it where a GPU is available, or with --dry-run to check the set-up here.")  # fmt: skip
        return 0
    sizes = ["tiny"] if args.dry_run else args.sizes.split(",")
    steps = 4 if args.dry_run else args.steps
    gpu_name = hw.gpus[0].name if hw.gpus else None
    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops else next(
        (v for k, v in PEAK_BF16.items() if gpu_name and k in gpu_name), None
    )  # fmt: skip
    # on a CPU the hand-written script must say so (TRL's defaults assume an accelerator for bf16)
    extra: dict[str, Any] = {"use_cpu": True, "bf16": False} if not hw.gpus else {}
    seq = 32 if args.dry_run else SEQ
    if seq != SEQ:
        extra["max_length"] = seq

    from tests.worker.test_memory_measured import long_text_data

    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        + (f"{len(hw.gpus)} x {gpu_name}" if hw.gpus else "no GPU"),
        "dry_run": args.dry_run, "seq_len": seq, "steps": steps,
        "peak_flops_bf16": peak_flops, "versions": versions(), "finished": False,
        "out": str(args.out.resolve()), "rows": [], "skipped_rows": [],
    }  # fmt: skip
    if args.all:  # the tests first, with at most 40% of the budget (they take ~90 s on an H200)
        log_dir = Path(tempfile.mkdtemp(prefix="nbtrain-gpu-tests-")) if args.dry_run else args.out.parent
        res["tests"] = run_gpu_tests(min(300.0, 0.4 * args.budget), log_dir / "gpu_tests.log")
        print(f"gpu-marked tests: {res['tests']['summary']} ({res['tests']['seconds']} s)", flush=True)
        write(res, args.dry_run)
    durations: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-gpu-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        data = long_text_data(work / "long.jsonl", rows=256)
        for size in sizes:
            asked = args.modes.split(",") if args.modes else None
            plan = [
                (m, mode) for m in args.methods.split(",") for mode in asked or modes(m, bool(hw.gpus), size)
            ]
            # a row takes about as long as the longest so far (a larger shape: its build too)
            need = (max(durations) if durations else 0.0) * (1 if size in ("1b", "tiny") else 4)
            if time.monotonic() + need > deadline:
                res["skipped_rows"] += [f"{size} {m} {mode}" for m, mode in plan]
                continue
            t = time.monotonic()
            model = build_model(size, work / f"llama-{size}")
            print(f"{size}: {params_of(size) / 1e9:.2f}B parameters, built in {time.monotonic() - t:.0f} s",
                  flush=True)  # fmt: skip
            for method, mode in plan:
                if durations and time.monotonic() + max(durations) > deadline:
                    res["skipped_rows"].append(f"{size} {method} {mode}")
                    continue
                t = time.monotonic()
                try:
                    if mode.startswith("nbtrain"):
                        name = f"{size}-{method}-{len(res['rows'])}"
                        r = run_nbtrain(model, data, method, steps, seq, name, mode)
                    else:
                        more = {**extra, "use_liger_kernel": True} if "liger" in mode else extra
                        r = run_bare(model, data, method, steps, work, more)
                # a failing row (a kernel missing here, a plan refused) must not lose the rest
                except (RuntimeError, ValueError, NbtrainError) as e:
                    failed = {"size": size, "method": method, "mode": mode, "error": str(e)[-3000:]}
                    res["rows"].append(failed)
                    print(f"  {size} {method} {mode}: FAILED {str(e)[-1500:]}", flush=True)
                    write(res, args.dry_run)
                    continue
                finally:
                    durations.append(time.monotonic() - t)
                mfu = r["tokens_per_s"] * flops_per_token(size, seq) / peak_flops if peak_flops else None
                row = {"size": size, "params": params_of(size), "method": method, "mode": mode, **r,
                       "mfu": mfu, "seconds": round(durations[-1], 1)}  # fmt: skip
                res["rows"].append(row)
                write(res, args.dry_run)  # after every row: a run cut off by its limit keeps what it measured
                peak = f"{r['peak_bytes'] / 2**30:.1f} GiB" if r["peak_bytes"] else "-"
                print(f"  {size} {method} {mode}: {r['tokens_per_s']:.0f} tokens/s, peak {peak}, "
                      f"micro-batch {r['micro_batch']}x{r['grad_accum']}, {r['precision']}"
                      + (f", MFU {mfu:.1%}" if mfu is not None else ""), flush=True)  # fmt: skip
            shutil.rmtree(model)  # the 7B takes 13 GB of disk
    res["finished"] = True
    write(res, args.dry_run)
    print("\n".join(table(res["rows"])))
    if res["skipped_rows"]:
        print("not run (the time budget): " + "; ".join(res["skipped_rows"]))
    if args.dry_run:
        mean = statistics.fmean(r["tokens_per_s"] for r in res["rows"] if "error" not in r)
        print(f"dry run on CPU: {len(res['rows'])} runs ({mean:.0f} tokens/s on average), nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
