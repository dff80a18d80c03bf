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
    model: Path,
    data: Path,
    method: str,
    steps: int,
    seq: int,
    name: str,
    liger: bool | None = None,
    sdpa: bool = False,
) -> dict[str, Any]:
    import nbtrain
    from nbtrain.contract.rundir import read_json, read_jsonl
    from nbtrain.control.launch import process

    liger_key = "" if liger is None else f", use_liger_kernel: {str(liger).lower()}"  # None: the plan's
    if sdpa:
        liger_key += ", model_init_kwargs: {attn_implementation: sdpa}"
    config = textwrap.dedent(
        f"""
        model: {model}
        method: {method}
        data: {{train: {data}, format: text}}
        precision: auto
        train: {{max_steps: {steps}, per_device_train_batch_size: auto, max_length: {seq},
                 logging_steps: 1, save_strategy: "no"{liger_key}}}
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
    micro, accum = int(args["per_device_train_batch_size"]), int(args.get("gradient_accumulation_steps", 1))
    times = [(int(r["step"]), float(r["t"])) for r in read_jsonl(run.paths.metrics) if "loss" in r]
    peaks = [r["gpu_mem_peak"] for r in read_jsonl(run.paths.system) if "gpu_mem_peak" in r]
    est = plan.get("estimate") or {}
    tensors = est["per_device_bytes"] - est["parts"]["overhead"] if est else None
    peak = max(peaks) if peaks else None
    return {
        "tokens_per_s": throughput(times, micro * accum * plan["world_size"] * seq),
        "peak_bytes": peak, "micro_batch": micro, "grad_accum": accum, "precision": plan["precision"],
        "gradient_checkpointing": args.get("gradient_checkpointing", True),
        "use_liger_kernel": bool(args.get("use_liger_kernel")),
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


MODES = (
    "nbtrain auto",
    "nbtrain liger-off",
    "nbtrain liger-on",
    "nbtrain sdpa",
    "TRL defaults",
    "TRL defaults liger",
)


def modes(method: str, gpu: bool) -> list[str]:
    """nbtrain's auto plan against TRL's defaults, and on a GPU each fast path the plan takes, turned off:
    Liger's kernels (``use_liger_kernel``: RMSNorm, SwiGLU, rotary; for LoRA also TRL's defaults with
    them) where liger-kernel is installed, flash-attention 2 (for LoRA) where flash-attn is."""
    out = ["nbtrain auto", "TRL defaults"]
    if gpu and importlib.util.find_spec("liger_kernel") is not None:
        out.insert(1, "nbtrain liger-off")
        if method == "lora":
            out.append("TRL defaults liger")
    if gpu and method == "lora" and importlib.util.find_spec("flash_attn") is not None:
        out.insert(1, "nbtrain sdpa")  # the plan picks flash-attention 2 where installed: the other way
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
    if dry_run:  # a CPU rehearsal is no result
        return
    out = Path(res["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")


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
    args = ap.parse_args()
    unknown = [m for m in args.modes.split(",") if m and m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; modes are {', '.join(MODES)}")

    from nbtrain.contract.errors import NbtrainError
    from nbtrain.hardware import probe

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

    started = time.time()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        + (f"{len(hw.gpus)} x {gpu_name}" if hw.gpus else "no GPU"),
        "dry_run": args.dry_run, "seq_len": seq, "steps": steps,
        "peak_flops_bf16": peak_flops, "versions": versions(), "finished": False,
        "out": str(args.out.resolve()), "rows": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-gpu-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        data = long_text_data(work / "long.jsonl", rows=256)
        for size in sizes:
            t = time.monotonic()
            model = build_model(size, work / f"llama-{size}")
            print(f"{size}: {params_of(size) / 1e9:.2f}B parameters, built in {time.monotonic() - t:.0f} s",
                  flush=True)  # fmt: skip
            for method in args.methods.split(","):
                for mode in args.modes.split(",") if args.modes else modes(method, bool(hw.gpus)):
                    try:
                        if mode.startswith("nbtrain"):
                            name = f"{size}-{method}-{len(res['rows'])}"
                            liger = {"nbtrain liger-off": False, "nbtrain liger-on": True}.get(mode)
                            r = run_nbtrain(model, data, method, steps, seq, name, liger=liger,
                                            sdpa=mode == "nbtrain sdpa")  # fmt: skip
                        else:
                            more = {**extra, "use_liger_kernel": True} if "liger" in mode else extra
                            r = run_bare(model, data, method, steps, work, more)
                    # a failing row (a kernel missing here, a plan refused) must not lose the rest
                    except (RuntimeError, ValueError, NbtrainError) as e:
                        res["rows"].append(
                            {"size": size, "method": method, "mode": mode, "error": str(e)[-3000:]}
                        )
                        print(f"  {size} {method} {mode}: FAILED {str(e)[-1500:]}", flush=True)
                        write(res, args.dry_run)
                        continue
                    mfu = r["tokens_per_s"] * flops_per_token(size, seq) / peak_flops if peak_flops else None
                    row = {"size": size, "params": params_of(size), "method": method, "mode": mode, **r,
                           "mfu": mfu}  # fmt: skip
                    res["rows"].append(row)
                    write(
                        res, args.dry_run
                    )  # after every row: a run cut off by its time limit keeps what it measured
                    peak = f"{r['peak_bytes'] / 2**30:.1f} GiB" if r["peak_bytes"] else "-"
                    print(f"  {size} {method} {mode}: {r['tokens_per_s']:.0f} tokens/s, peak {peak}, "
                          f"micro-batch {r['micro_batch']}x{r['grad_accum']}, {r['precision']}"
                          + (f", MFU {mfu:.1%}" if mfu is not None else ""), flush=True)  # fmt: skip
            shutil.rmtree(model)  # the 7B takes 13 GB of disk
    res["finished"] = True
    write(res, args.dry_run)
    print("| model | method | mode | tokens/s | peak GiB | micro x accum | MFU |")
    print("|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if "error" in r:
            print(f"| {r['size']} | {r['method']} | {r['mode']} | failed | - | - | - |")
            continue
        peak = f"{r['peak_bytes'] / 2**30:.1f}" if r["peak_bytes"] else "-"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"| {r['size']} | {r['method']} | {r['mode']} | {r['tokens_per_s']:.0f} | {peak} "
              f"| {r['micro_batch']}x{r['grad_accum']} | {mfu} |")  # fmt: skip
    if args.dry_run:
        mean = statistics.fmean(r["tokens_per_s"] for r in res["rows"] if "error" not in r)
        print(f"dry run on CPU: {len(res['rows'])} runs ({mean:.0f} tokens/s on average), nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
