"""Time to first step and peak RSS: nbtrain vs ``llamafactory-cli train`` vs a bare TRL script.

Same model (the tiny Llama and a ~40M one built by nbtrain.examples, as bench_overhead does), same data
(the addition set; LLaMA-Factory reads it through a dataset_info.json entry in its OpenAI-messages
layout), same LoRA (r 8, alpha 16, dropout 0.05 on q_proj/v_proj: what nbtrain's ``target_modules: auto``
resolves to), batch 8, lr 1e-3, max length 1024, loss on every token, gradient checkpointing (each tool's
default), logging every step. The three run in turn with the order rotated each repeat, so a slow
moment of this shared machine hits all three; the table reports medians.

- nbtrain: ``nbtrain.finetune()`` (a detached worker), timed from the call -- what a cell costs; cold
  (``NBTRAIN_WARM=0``: a new Python process imports the stack) and warm (forked by the warm process,
  nbtrain.worker.warm, started once before the repeats, as ``%load_ext nbtrain`` starts it).
- bare TRL: bench_overhead's script, the same arguments nbtrain resolved.
- LLaMA-Factory: ``llamafactory-cli train cfg.yaml`` in its own venv (bench/setup_llamafactory.sh);
  its step times come from bench/peers.py's step clock. It pins older libraries
  (transformers 5.6, trl 0.24, peft 0.18, accelerate 1.11, datasets 4.0), recorded in the results.

Time to first step is measured from the moment the process is asked for to the end of the first step;
peak RSS is the whole process tree, sampled every 50 ms (psutil). Where nbtrain's time goes comes from
one extra run of the real worker in-process with timers around its phases (imports, model load, data
preparation...). Results go to bench/results/llamafactory.json.

    python bench/bench_llamafactory.py [--repeats 3] [--steps 20]
      # first runs bash bench/setup_llamafactory.sh (bench/.venv-llamafactory; a no-op once it works)
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
RESULTS = ROOT / "bench" / "results" / "llamafactory.json"

from bench.peers import Peer, lora_job, rotated, run_nbtrain_as, run_peer, start_warm  # noqa: E402

LLAMAFACTORY = Peer(
    "llamafactory", "LLaMA-Factory", "llamafactory-cli", "llamafactory.train.tuner",
    ("llamafactory", "torch", "transformers", "trl", "peft", "accelerate", "datasets"),
)  # fmt: skip
SYSTEMS = ("nbtrain_warm", "nbtrain", "bare_trl", "llamafactory")

# The real worker (python -m nbtrain.worker RUN_DIR), run in-process with timers around its phases. The
# timers wrap the real methods and call them unchanged.
PHASES = textwrap.dedent(
    """
    import json, sys, time
    t_python = time.time()
    run_dir, t0 = sys.argv[1], float(sys.argv[2])
    spans = []

    def timed(owner, attr, label):
        fn = getattr(owner, attr)
        def wrapper(*a, **k):
            s = time.time()
            try:
                return fn(*a, **k)
            finally:
                spans.append((label, s, time.time()))
        setattr(owner, attr, wrapper)

    from nbtrain.worker.lean import hide_unused_packages  # as the worker does, before any library
    hide_unused_packages(json.load(open(run_dir + "/resolved.json")))
    s = time.time()
    import torch, transformers, datasets, peft, trl  # noqa
    from trl import SFTConfig, SFTTrainer
    from transformers import Trainer  # noqa
    spans.append(("imports", s, time.time()))
    from nbtrain.worker import __main__ as worker
    from nbtrain.worker.recipes import common, sft
    timed(common, "load_tokenizer", "tokenizer")  # the recipe's steps, as the names its setup() calls
    timed(common, "load_run_data", "data")
    timed(sft, "load_model", "model")
    timed(SFTTrainer, "__init__", "trainer_init")
    timed(SFTTrainer, "_prepare_dataset", "tokenize")
    timed(sft.SFTRecipe, "train", "train")
    rc = worker.main([run_dir])
    print("SPANS", json.dumps({"rc": rc, "t_python": t_python, "spans": spans}), flush=True)
    """
)


def lf_files(work: Path, model: Path, data: Path, label: str, steps: int, cfg: dict[str, Any]) -> Path:
    """LLaMA-Factory's dataset_info.json and training YAML for the same run nbtrain resolved."""
    lf = work / f"lf-{label}"
    lf.mkdir(exist_ok=True)
    (lf / "add.jsonl").write_bytes(data.read_bytes())
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages"}
    entry = {"file_name": "add.jsonl", "formatting": "sharegpt", "columns": columns, "tags": tags}
    (lf / "dataset_info.json").write_text(json.dumps({"add": entry}))
    from nbtrain.control.config import trainargs

    lora, args = cfg["lora"], cfg["train_args"]
    yaml = {
        "model_name_or_path": str(model), "trust_remote_code": False,
        "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": lora["r"], "lora_alpha": lora["alpha"], "lora_dropout": lora["dropout"],
        "lora_target": ",".join(cfg["targets"]),
        "dataset": "add", "dataset_dir": str(lf), "cutoff_len": cfg["max_length"],
        "train_on_prompt": True,  # TRL's SFTTrainer computes the loss on every token of a messages row
        "overwrite_cache": True, "output_dir": str(lf / "out"), "overwrite_output_dir": True,
        "logging_steps": 1, "per_device_train_batch_size": args["per_device_train_batch_size"],
        "learning_rate": args["learning_rate"], "max_steps": steps, "save_strategy": "no",
        "report_to": "none", "seed": trainargs.value(args, "seed"), "dataloader_num_workers": 0,
    }  # fmt: skip
    (lf / "cfg.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in yaml.items()))
    return lf


def run_llamafactory(lf: Path, skip: int = 2) -> dict[str, float]:
    out = lf / "out"
    if out.exists():
        for f in out.iterdir():
            if f.is_file():
                f.unlink()
    argv = [str(LLAMAFACTORY.exe), "train", str(lf / "cfg.yaml")]
    r = run_peer(argv, lf, lf / "lf.log", env={"DISABLE_VERSION_CHECK": "1"}, skip=skip)
    res = json.loads((out / "all_results.json").read_text())
    return {**r, "steps_per_s": float(res["train_steps_per_second"])}


def phases(config: str, work: Path) -> dict[str, float]:
    """Where nbtrain's time to first step goes: kernel side, then the worker's phases."""
    import nbtrain
    from nbtrain.contract.rundir import read_jsonl
    from nbtrain.control.runs.run import create_run_dir

    t = time.time()
    prep = nbtrain.prepare(config)
    run = create_run_dir(prep.name + "-phases", prep.resolved.text, prep.to_dict())
    kernel = time.time() - t
    script = work / "phases.py"
    script.write_text(PHASES)
    t0 = time.time()
    out = subprocess.run([sys.executable, str(script), str(run.dir), str(t0)], capture_output=True, text=True,
                         check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("SPANS")), None)
    if line is None:
        raise RuntimeError(f"the phase run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    got = json.loads(line.removeprefix("SPANS "))
    spans: dict[str, float] = {}
    starts: dict[str, float] = {}
    for label, s, e in got["spans"]:
        spans[label] = spans.get(label, 0.0) + (e - s)
        starts.setdefault(label, s)
    first = next(r["t"] for r in read_jsonl(run.paths.metrics) if "loss" in r)
    parts = {
        "kernel: validate, plan, write run dir": kernel,
        "python start + nbtrain import": got["t_python"] - t0,
        "imports (torch, transformers, datasets, peft, trl)": spans["imports"],
        "training arguments, seed": starts["tokenizer"] - (starts["imports"] + spans["imports"]),
        "tokenizer load": spans["tokenizer"],
        "data load + format check (nbtrain)": spans["data"],
        "model load + LoRA": spans["model"],
        "tokenize dataset (TRL)": spans.get("tokenize", 0.0),
        "trainer init (rest)": spans["trainer_init"] - spans.get("tokenize", 0.0),
        "optimizer, dataloader, first step": first - starts["train"],
    }
    parts["other"] = (first - t0) - sum(v for k, v in parts.items() if not k.startswith("kernel"))
    return {k: round(v, 3) for k, v in parts.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", default="tiny,40M")
    args = ap.parse_args()
    started = time.time()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "a shared VM: the load average at start and end says how busy it was; the three "
        "systems alternate, so the ratios hold better than the absolute seconds",
        "loadavg_start": os.getloadavg(),
    }
    error = LLAMAFACTORY.setup()
    if error is not None:  # the peer could not be installed here: that is the result, recorded as such
        res["error"] = error
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(error, file=sys.stderr)
        return 1
    res["versions"] = {"llamafactory_venv": LLAMAFACTORY.versions()}

    import importlib.metadata as md

    from bench.bench_overhead import run_bare
    from nbtrain.examples import make_tiny_model, write_dataset

    res["versions"]["nbtrain_venv"] = {p: md.version(p) for p in ("torch", "transformers", "trl", "peft",
                                                                  "accelerate", "datasets")}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-lf-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        res["warm_process"] = start_warm()
        data = write_dataset(work / "data.jsonl", n=400)
        builders: dict[str, dict[str, int]] = {"tiny": {}, "40M": {"hidden_size": 512, "num_layers": 12}}
        for label in args.models.split(","):
            model = make_tiny_model(work / f"model-{label}", **builders[label])
            resolved = work / f"resolved-{label}.json"
            config, cfg = lora_job(model, data, args.steps, resolved)
            lf = lf_files(work, model, data, label, args.steps, cfg)
            samples: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
            for i in range(args.repeats):
                for system in rotated(SYSTEMS, i):
                    if system.startswith("nbtrain"):
                        r = run_nbtrain_as(system == "nbtrain_warm", config, work, f"{label}-{system}-{i}")
                    elif system == "bare_trl":
                        r = run_bare(resolved, work)
                    else:
                        r = run_llamafactory(lf)
                    samples[system].append(r)
                    print(f"  {label} #{i} {system}: first step {r['first_step_s']:.2f} s, "
                          f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB", flush=True)  # fmt: skip
            med = {s: {k: statistics.median(x[k] for x in v) for k in v[0]} for s, v in samples.items()}
            nb, lfm, bare = med["nbtrain"], med["llamafactory"], med["bare_trl"]
            nbw = med["nbtrain_warm"]
            res[label] = {
                "median": med,
                "warm_first_step_ratio_vs_llamafactory": nbw["first_step_s"] / lfm["first_step_s"],
                "warm_first_step_ratio_vs_cold": nbw["first_step_s"] / nb["first_step_s"],
                "first_step_ratio_vs_llamafactory": nb["first_step_s"] / lfm["first_step_s"],
                "first_step_ratio_vs_bare_trl": nb["first_step_s"] / bare["first_step_s"],
                "peak_rss_ratio_vs_llamafactory": nb["peak_rss"] / lfm["peak_rss"],
                "peak_rss_ratio_vs_bare_trl": nb["peak_rss"] / bare["peak_rss"],
                "nbtrain_phases_s": phases(config, work),
                "samples": samples,
                "llamafactory_config": (lf / "cfg.yaml").read_text(),
            }  # fmt: skip
        from nbtrain.control.launch import warm

        warm.stop()
    res["loadavg_end"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")

    print(
        "| model | first step s: nbtrain warm / cold / bare TRL / LLaMA-Factory | warm / LLaMA-Factory "
        "(target <= 0.30) | cold / LLaMA-Factory | peak RSS MiB: warm / cold / bare TRL / LLaMA-Factory |"
    )
    print("|---|---|---|---|---|")
    for label in args.models.split(","):
        r = res[label]
        m = r["median"]
        ratios = " | ".join(f"{r[k]:.2f}" for k in ("warm_first_step_ratio_vs_llamafactory",
                                                     "first_step_ratio_vs_llamafactory"))  # fmt: skip
        print(f"| {label} | " + " / ".join(f"{m[s]['first_step_s']:.1f}" for s in SYSTEMS) + f" | {ratios} | "
              + " / ".join(f"{m[s]['peak_rss'] / 2**20:.0f}" for s in SYSTEMS) + " |")  # fmt: skip
        print("  where nbtrain's time goes: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in r["nbtrain_phases_s"].items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
