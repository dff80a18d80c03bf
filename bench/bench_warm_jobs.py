"""Start-up of the processes a user waits on besides training, cold vs warm: data preview, held-out eval,
export (merge + save), preference scoring, the model server (start until it answers a chat request) and
``run.generate``.

One LoRA run of the tiny model is trained first (the warm process started before it, as ``%load_ext
nbtrain`` starts it). Then each job runs ``--repeats`` times warm and cold (``NBTRAIN_WARM=0``: a new
Python process imports the stack), alternating which goes first, timed from the call in this process to
its result: what the user waits for in the cell. Each warm call is checked to have been forked (the warm
process's log names it) and each cold one to have started cold (its log says so). Results go to
bench/results/warm_jobs.json.

    python bench/bench_warm_jobs.py [--repeats 3] [--model tiny|40M]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "warm_jobs.json"
JOBS = ("preview", "eval", "export", "score", "serve", "generate")


def jobs(run: Any, config: str, work: Path, pairs: Path, data: Path) -> dict[str, Callable[[int], Any]]:
    import nbtrain
    from nbtrain.control.jobs.preview import preview_data
    from nbtrain.control.jobs.serve import serve, stop_serving

    def served(i: int) -> None:
        handle = serve(run)
        try:
            assert handle.chat("What is 2 + 3?", max_tokens=4) is not None
        finally:
            stop_serving(run)

    return {
        "preview": lambda i: preview_data(config, n=5),
        "eval": lambda i: nbtrain.evaluate(run, file=data, limit=16),
        "export": lambda i: nbtrain.export(run, to=work / "exported" / str(i), overwrite=True),
        "score": lambda i: nbtrain.preference_scores(run, pairs, n=8),
        "serve": served,
        "generate": lambda i: run.generate(["What is 2 + 3?"], max_new_tokens=4),
    }


def forked_count(folder: Path, module: str) -> int:
    return sum(p.read_text().count(f"for {module}") for p in folder.glob("*.log"))


MODULES = {
    "preview": "nbtrain.worker.jobs.preview", "eval": "nbtrain.worker.jobs.evaluate",
    "export": "nbtrain.worker.jobs.export", "score": "nbtrain.worker.jobs.score",
    "serve": "nbtrain.worker.serve.server", "generate": "nbtrain.worker.serve.generate",
}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="tiny", choices=["tiny", "40M"])
    args = ap.parse_args()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "contention": "a shared VM: warm and cold alternate, so the ratios hold better than the seconds",
        "loadavg_start": os.getloadavg(),
        "model": args.model,
    }
    import nbtrain
    from nbtrain.contract.warmproto import ENV_DIR
    from nbtrain.control.launch import warm
    from nbtrain.examples import make_tiny_model, write_dataset

    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-warm-") as d:
        work = Path(d)
        folder = work / "warm"
        os.environ.update({"NBTRAIN_HOME": str(work / "home"), "NBTRAIN_RUNS_DIR": str(work / "runs"),
                           ENV_DIR: str(folder), "NBTRAIN_WARM": "1"})  # fmt: skip
        os.chdir(work)
        warm.start()
        while not [w for w in warm.status() if w["this_kernel"]]:
            time.sleep(0.2)
        size = {"hidden_size": 512, "num_layers": 12} if args.model == "40M" else {}
        model = make_tiny_model(work / "model", **size)
        data = write_dataset(work / "data.jsonl", n=200)
        pairs = write_dataset(work / "pairs.jsonl", "preference", n=16)
        config = textwrap.dedent(
            f"""
            model: {model}
            method: lora
            data: {{train: {data}}}
            train: {{max_steps: 10, per_device_train_batch_size: 8, save_strategy: "no", logging_steps: 1}}
            """
        )
        run = nbtrain.finetune(config, name="bench")
        assert run.wait(timeout=600).state == "completed", run.logs(40)
        calls = jobs(run, config, work, pairs, data)
        samples: dict[str, dict[str, list[float]]] = {j: {"warm": [], "cold": []} for j in JOBS}
        for i in range(args.repeats):
            for job in JOBS:
                for mode in ("warm", "cold") if i % 2 == 0 else ("cold", "warm"):
                    os.environ["NBTRAIN_WARM"] = "1" if mode == "warm" else "0"
                    before = forked_count(folder, MODULES[job])
                    t0 = time.perf_counter()
                    calls[job](i)
                    dt = time.perf_counter() - t0
                    was_forked = forked_count(folder, MODULES[job]) > before
                    assert was_forked == (mode == "warm"), f"{job} #{i} {mode}: forked={was_forked}"
                    samples[job][mode].append(dt)
                    print(f"  {job} #{i} {mode}: {dt:.2f} s", flush=True)
        res["warm_process"] = warm.status()[0]
        warm.stop()
    res["jobs"] = {
        job: {
            "warm_s": statistics.median(s["warm"]),
            "cold_s": statistics.median(s["cold"]),
            "warm_over_cold": statistics.median(s["warm"]) / statistics.median(s["cold"]),
            "samples": s,
        }
        for job, s in samples.items()
    }
    res["loadavg_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print("| job | warm s | cold s | warm / cold |\n|---|---|---|---|")
    for job, r in res["jobs"].items():
        print(f"| {job} | {r['warm_s']:.2f} | {r['cold_s']:.2f} | {r['warm_over_cold']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
