"""nbtrain (cold and warm) vs ms-swift's ``swift sft`` vs LLaMA-Factory vs a bare TRL script: time to first
step, steps/s, peak RSS of the process tree, final loss.

Same tiny model (nbtrain.examples), same data (the addition set, OpenAI-messages rows, which ms-swift
reads as they are), same LoRA (r 8, alpha 16, dropout 0.05 on q_proj/v_proj: what nbtrain's
``target_modules: auto`` resolves to), batch 8 with no gradient accumulation, lr 1e-3 with a linear
schedule and no warm-up, no weight decay, AdamW's default betas, max length 1024, loss on every token,
float32, 40 steps, logging every step, no checkpoints. The five run in turn with the order rotated
each repeat (bench/peers.py), so a slow moment of this shared machine hits all of them; the table
reports medians.

- time to first step: from the moment the process is asked for (``nbtrain.finetune()`` for nbtrain, the
  command line for the others) to the end of the first step;
- steps/s: from the median interval between consecutive steps 5..40 (the first four are warm-up);
- peak RSS: the whole process tree, sampled every 50 ms (``swift sft`` is a Python process that imports
  torch, ~250 MiB, and starts the training script as a child process: both count);
- final loss: the loss logged at the last step. The tools tokenise the same rows with different chat
  formats (nbtrain and TRL: the model's own chat template; ms-swift: its ``phi3`` template, the same
  tokens less the last newline; LLaMA-Factory: its default template), so the losses are close, not equal.

ms-swift runs from its own venv (bench/setup_msswift.sh; it pins transformers < 5.20, trl < 1.0,
peft < 0.21) and LLaMA-Factory from its own (bench/setup_llamafactory.sh); their step times come from
bench/peers.py's step clock. What it takes to get ``swift sft`` to train a local model is in
``OBSTACLES`` and in the results file. Results go to bench/results/msswift.json.

    bash bench/setup_msswift.sh && bash bench/setup_llamafactory.sh     # once (or pass --setup)
    python bench/bench_msswift.py [--repeats 3] [--steps 40]
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

from bench.bench_llamafactory import LLAMAFACTORY, lf_files, run_llamafactory  # noqa: E402
from bench.peers import Peer, lora_job, rotated, run_nbtrain_as, run_peer, start_warm  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "msswift.json"
MSSWIFT = Peer("msswift", "ms-swift", "swift", "swift.cli.sft",
               ("ms-swift", "torch", "transformers", "trl", "peft", "accelerate", "datasets"))  # fmt: skip
SYSTEMS = ("nbtrain_warm", "nbtrain", "bare_trl", "llamafactory", "msswift")
SKIP = 4  # steps/s from the intervals between steps 5..40

# What a user meets getting ms-swift 4.6 to fine-tune a local model directory (here the tiny Llama), each
# seen on this machine (the errors as printed) or read in its source (the file named).
OBSTACLES = [
    "`swift sft --help` lists one option, --tuner_backend: swift/cli/sft.py parses that one with its own "
    "argparse parser (to decide whether to import unsloth) before the real parser, and that parser answers "
    "--help. The arguments are in the docs or in swift/arguments/*.py and swift/trainers/arguments.py.",
    "No --model_type: 'Failed to automatically match `model_type` for `/path/model`. Multiple possible types "
    "found: ['codefuse_codellama', 'llama', 'openbuddy_llama', 'yi']. Please specify `model_type` manually' "
    "(ms-swift matches a model by its hub id or config, not by its architecture alone): --model_type llama.",
    "No --template: 'Failed to automatically match `template_type` ... Multiple possible types found: "
    "['llama', 'atom', 'mengzi', ...16 names]. Please specify `template_type` manually via `--template`'. "
    "ms-swift formats rows with its own templates, not the tokenizer's chat_template: --template phi3 is "
    "the one whose format is the tiny model's (<|user|>\\n...<|end|>\\n<|assistant|>\\n...<|end|>).",
    "Each of those two failures came after ~80 s at load average 9-11 (the `swift` command alone imports "
    "torch: 20 s then), so finding the flags one failure at a time is slow.",
    "Without --gradient_accumulation_steps, ms-swift sets it to ceil(16 / per_device_train_batch_size / "
    "world size) (swift/trainers/arguments.py, 'Setting args.gradient_accumulation_steps: 16'): batch 8 "
    "silently became 16 rows a step, and the defaults' batch 1 became 16 micro-batches a step (a first "
    "run with the defaults took 62 s a step at load average 11, 7 s a step at 5.5): "
    "--gradient_accumulation_steps 1.",
    "A float32 model gets fp16=True in its training arguments (swift/arguments/base_args/model_args.py, "
    "_init_mixed_precision: float16/float32 -> fp16); on this CPU that changed nothing (--fp16 true vs "
    "false, 6 steps each, twice: the same losses, speed within the noise). --fp16 false --bf16 false "
    "keeps the arguments saying what runs.",
    "--check_model (on by default) asks the ModelScope hub about the local directory; offline it retries "
    "('modelscope_hub.legacy_api | Repo unknown: Root=/ page=1 listing failed (NetworkError), retry in "
    "1s/2s/4s') before training starts: --check_model false.",
    "The method is --tuner_type (lora by default); ms-swift 3's --train_type is gone, and an unknown "
    "argument fails with 'ValueError: remaining_argv: [...]' (swift/pipelines/base.py).",
    "Defaults that differ from transformers/TRL and had to be set to compare like with like: "
    "target_modules all-linear (not q/v), lora_alpha 32, learning_rate 1e-4, lr_scheduler_type cosine, "
    "weight_decay 0.1, adam_beta2 0.95, per_device_train_batch_size 1, max_length from the model's config "
    "(512 here), dataloader_num_workers 1 (a worker process), loss on the assistant's answer only "
    "(--loss_scale all for every token, as TRL does on messages rows), save_strategy steps (checkpoints), "
    "report_to tensorboard, dataloader_pin_memory true (a warning on CPU), and output_dir/v0-<timestamp>/ "
    "sub-folders (--add_version false).",
    "Local model directories are loaded with trust_remote_code=True, with a warning and no switch to turn "
    "it off (swift/model/register.py default_trust_remote_code; nbtrain keeps it off unless asked).",
]


def swift_argv(model: Path, data: Path, out: Path, steps: int, cfg: dict[str, Any]) -> list[str]:
    """``swift sft`` for the run nbtrain resolved (see OBSTACLES for why each of the first flags)."""
    from nbtrain.control.config import trainargs

    lora, args = cfg["lora"], cfg["train_args"]
    arg = lambda field: trainargs.value(args, field)  # noqa: E731 - the run's value, else TRL's default
    flags: dict[str, Any] = {
        "model": model, "model_type": "llama", "template": "phi3", "check_model": "false",
        "torch_dtype": "float32", "fp16": "false", "bf16": "false",
        "dataset": data, "tuner_type": "lora",
        "lora_rank": lora["r"], "lora_alpha": lora["alpha"], "lora_dropout": lora["dropout"],
        "target_modules": cfg["targets"], "loss_scale": "all", "max_length": cfg["max_length"],
        "per_device_train_batch_size": args["per_device_train_batch_size"],
        "gradient_accumulation_steps": arg("gradient_accumulation_steps"),
        "learning_rate": args["learning_rate"],
        "lr_scheduler_type": arg("lr_scheduler_type"), "weight_decay": arg("weight_decay"),
        "adam_beta2": arg("adam_beta2"), "max_steps": steps, "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "seed": arg("seed"), "dataloader_num_workers": 0,
        "dataloader_pin_memory": "false", "add_version": "false", "output_dir": out,
    }  # fmt: skip
    argv = [str(MSSWIFT.exe), "sft"]
    for k, v in flags.items():
        argv += [f"--{k}", *(map(str, v) if isinstance(v, list) else [str(v)])]
    return argv


def check_peers(setup: bool) -> list[str]:
    """What is missing to run the peers (after running their set-up scripts, with ``setup``)."""
    problems = []
    for peer in (MSSWIFT, LLAMAFACTORY):
        error = peer.setup() if setup else None
        problem = error or peer.missing()
        if problem:
            problems.append(problem)
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument(
        "--setup", action="store_true", help="run the peers' set-up scripts first (bench/setup_*.sh)"
    )
    args = ap.parse_args()
    problems = check_peers(args.setup)
    if problems:
        print("bench_msswift: cannot run:\n" + "\n".join(f"- {p}" for p in problems), file=sys.stderr)
        return 2
    started = time.time()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "a shared VM: the load average at start and end says how busy it was; the five "
        "systems alternate, so the ratios hold better than the absolute seconds",
        "loadavg_start": os.getloadavg(),
        "repeats": args.repeats,
        "steps": args.steps,
        "versions": {"msswift_venv": MSSWIFT.versions(), "llamafactory_venv": LLAMAFACTORY.versions()},
        "msswift_obstacles": OBSTACLES,
    }

    import importlib.metadata as md

    from bench.bench_overhead import run_bare
    from nbtrain.examples import make_tiny_model, write_dataset

    res["versions"]["nbtrain_venv"] = {p: md.version(p) for p in ("torch", "transformers", "trl", "peft",
                                                                  "accelerate", "datasets")}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-msswift-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        res["warm_process"] = start_warm()
        data = write_dataset(work / "data.jsonl", n=400)
        model = make_tiny_model(work / "model-tiny")
        resolved = work / "resolved.json"
        config, cfg = lora_job(model, data, args.steps, resolved)
        lf = lf_files(work, model, data, "tiny", args.steps, cfg)
        sw = work / "msswift"
        sw.mkdir()
        argv = swift_argv(model, data, sw / "out", args.steps, cfg)
        samples: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}

        def one(system: str, i: int) -> dict[str, float]:
            if system.startswith("nbtrain"):
                return run_nbtrain_as(system == "nbtrain_warm", config, work, f"{system}-{i}", skip=SKIP)
            if system == "bare_trl":
                return run_bare(resolved, work, skip=SKIP)
            if system == "llamafactory":
                return run_llamafactory(lf, skip=SKIP)
            return run_peer(argv, sw, sw / "swift.log", skip=SKIP)

        try:
            for i in range(args.repeats):
                for system in rotated(SYSTEMS, i):
                    r = one(system, i)
                    samples[system].append(r)
                    print(f"  #{i} {system}: first step {r['first_step_s']:.2f} s, "
                          f"{r['steady_steps_per_s']:.1f} steps/s, peak RSS {r['peak_rss'] / 2**20:.0f} MiB, "
                          f"final loss {r['final_loss']:.3f}", flush=True)  # fmt: skip
        finally:
            from nbtrain.control.launch import warm

            warm.stop()
        res["msswift_command"] = " ".join(argv).replace(str(work), "$WORK").replace(str(ROOT) + "/", "")
        res["llamafactory_config"] = (lf / "cfg.yaml").read_text().replace(str(work), "$WORK")
    med = {s: {k: statistics.median(x[k] for x in v) for k in v[0]} for s, v in samples.items()}
    sw_med = med["msswift"]
    res["median"] = med
    res["vs_msswift"] = {  # each system / ms-swift; below 1 is less time, fewer steps/s, less memory
        s: {
            "first_step": m["first_step_s"] / sw_med["first_step_s"],
            "steps_per_s": m["steady_steps_per_s"] / sw_med["steady_steps_per_s"],
            "peak_rss": m["peak_rss"] / sw_med["peak_rss"],
        }
        for s, m in med.items()
        if s != "msswift"
    }
    res["samples"] = samples
    res["loadavg_end"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")

    print("| system | first step s | steps/s (median step, 5-40) | peak RSS MiB | final loss | "
          "first step / ms-swift | steps/s / ms-swift | peak RSS / ms-swift |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for s in SYSTEMS:
        m, v = med[s], res["vs_msswift"].get(s, {"first_step": 1.0, "steps_per_s": 1.0, "peak_rss": 1.0})
        cells = [
            f"{m['first_step_s']:.2f}",
            f"{m['steady_steps_per_s']:.1f}",
            f"{m['peak_rss'] / 2**20:.0f}",
            f"{m['final_loss']:.3f}",
        ] + [f"{v[k]:.2f}" for k in ("first_step", "steps_per_s", "peak_rss")]
        print(f"| {s} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
