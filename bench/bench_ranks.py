"""Start-up of a two-rank run on one node: torchrun's own command and DeepSpeed's launcher (each rank a new
interpreter that imports the training stack) against nbtrain's ranks launcher (nbtrain/worker/ranks.py:
torchrun's agent with the ranks forked from one process), cold (one import for both ranks) and warm
(forked from the warm process: no import at all).

Each is a whole run of the tiny model (6 steps of batch 4, LoRA), timed from ``nbtrain.finetune`` to its
completed state: what the user waits for. DDP four ways, ZeRO-2 two ways, ``--repeats`` rounds, the order
rotated each round (a shared VM: the ratios hold better than the seconds). torchrun's own command is the
one nbtrain started before the ranks launcher (``python -m torch.distributed.run ... -m nbtrain.worker``),
put back for this bench by replacing ``node_argv`` in this process. Results go to bench/results/ranks.json.

    python bench/bench_ranks.py [--repeats 3]
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
RESULTS = ROOT / "bench" / "results" / "ranks.json"
CONFIG = """model: {model}
data: {{train: {data}}}
train: {{max_steps: 6, per_device_train_batch_size: 4, logging_steps: 1, save_strategy: "no"}}
distributed: {{num_processes: 2, {dist}}}
"""
# mode -> (distributed settings, the launcher command: torchrun's own or nbtrain's, warm or cold)
MODES = {
    "ddp torchrun command": ("strategy: ddp", "torchrun", "0"),
    "ddp forked cold": ("strategy: ddp", "ranks", "0"),
    "ddp forked warm": ("strategy: ddp", "ranks", "1"),
    "zero2 deepspeed launcher": ("strategy: zero2, launcher: deepspeed", "ranks", "0"),
    "zero2 forked warm": ("strategy: zero2", "ranks", "1"),
}


def torchrun_command(original: Any) -> Any:
    def node_argv(plan: Any, run_dir: Path, *, port: int, master_addr: str = "127.0.0.1",
                  node_rank: int = 0) -> list[str]:  # fmt: skip
        if plan.launcher != "torchrun":
            return original(plan, run_dir, port=port, master_addr=master_addr, node_rank=node_rank)
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={plan.num_processes}",
                "--nnodes=1", "--node-rank=0", f"--master-addr={master_addr}", f"--master-port={port}",
                "-m", "nbtrain.worker", str(run_dir)]  # fmt: skip

    return node_argv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "loadavg_start": os.getloadavg(),
        "what": "a two-rank run of the tiny model (6 steps of batch 4, LoRA), finetune() to completed",
    }
    import nbtrain
    import nbtrain.control.start as start
    from nbtrain.contract.warmproto import ENV_DIR
    from nbtrain.control.launch import warm
    from nbtrain.examples import make_tiny_model, write_dataset

    ours = start.node_argv
    theirs = torchrun_command(ours)
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-ranks-") as d:
        work = Path(d)
        os.environ.update({"NBTRAIN_HOME": str(work / "home"), "NBTRAIN_RUNS_DIR": str(work / "runs"),
                           ENV_DIR: str(work / "warm"), "NBTRAIN_WARM": "1"})  # fmt: skip
        os.chdir(work)
        warm.start()
        while not [w for w in warm.status() if w["this_kernel"] and w.get("socket")]:
            time.sleep(0.2)
        model = make_tiny_model(work / "model")
        data = write_dataset(work / "data.jsonl", n=200)
        samples: dict[str, list[float]] = {m: [] for m in MODES}
        names = list(MODES)
        for i in range(args.repeats):
            for mode in names[i % len(names) :] + names[: i % len(names)]:
                dist, launcher, warm_on = MODES[mode]
                start.node_argv = theirs if launcher == "torchrun" else ours
                os.environ["NBTRAIN_WARM"] = warm_on
                t0 = time.perf_counter()
                run = nbtrain.finetune(CONFIG.format(model=model, data=data, dist=dist), name=f"r{i}")
                st = run.wait(timeout=600)
                dt = time.perf_counter() - t0
                assert st.state == "completed", (mode, run.logs(40))
                log = (run.paths.logs / "launcher.log").read_text()
                forked = "ranks forked from this process" in log
                assert forked == (launcher == "ranks" and "deepspeed" not in dist), (mode, log[:500])
                assert ("cold start" in log) == (forked and warm_on == "0"), (mode, log[:500])
                samples[mode].append(round(dt, 2))
                print(f"{mode}: {dt:.1f} s", flush=True)
        start.node_argv = ours
    med = {m: statistics.median(v) for m, v in samples.items()}
    res["samples_s"] = samples
    res["median_s"] = med
    res["ratios"] = {
        "ddp_forked_warm_over_torchrun": round(med["ddp forked warm"] / med["ddp torchrun command"], 3),
        "ddp_forked_cold_over_torchrun": round(med["ddp forked cold"] / med["ddp torchrun command"], 3),
        "zero2_forked_warm_over_deepspeed": round(
            med["zero2 forked warm"] / med["zero2 deepspeed launcher"], 3
        ),
    }
    res["loadavg_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"median_s": med, "ratios": res["ratios"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
