"""Sweeps (issue 52): one 12-trial grid (``train.learning_rate`` x ``lora.r``) on the tiny model, eval_split
0.1, three ways, one after another in one run:

- nbtrain's sweep (``start_sweep``; trials started warm, ``at_once: auto`` side by side), timed from the
  call to the sweep's end;
- the same 12 configs as cold nbtrain runs one after another (``NBTRAIN_WARM=0``, each waited for: how
  axolotl and LLaMA-Factory users sweep, one CLI run per config);
- Optuna's own loop (``GridSampler``, one trial at a time) running a bare TRL script
  (bench/sweep_bare_trl.py) as a subprocess per trial.

For each: wall time, wall time to the best trial (when its value was known), the best eval_loss. The
sweep must take at most 0.5x the cold runs' wall time (exit 1 otherwise). Then TPE with median pruning
over the same space (the learning rate as a log range, the ranks as choices, 12 trials) against the grid:
optimizer steps trained by every trial, up to the moment each first found an eval_loss at least as good
as the grid's best (from each trial's logged steps and their times). Every trial's run is checked to
have started warm (sweeps) or cold (the cold runs) from its log. Results: bench/results/sweep.json.

    python bench/bench_sweep.py [--steps 120] [--lrs 3e-3,1e-2,3e-2,1e-1] [--ranks 4,8,16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "sweep.json"
BARE = ROOT / "bench" / "sweep_bare_trl.py"
TARGET = 0.5  # sweep wall time / the same trials as cold runs one after another
BATCH, EVAL_SPLIT = 4, 0.1


def config(model: Path, data: Path, steps: int, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": str(model),
        "data": {"train": str(data), "eval_split": EVAL_SPLIT},
        "train": {"max_steps": steps, "per_device_train_batch_size": BATCH, "logging_steps": 1},
    }
    return {**cfg, "sweep": sweep} if sweep else cfg


def started_cold(run_dir: str | Path) -> bool:
    return "cold start" in (Path(run_dir) / "logs" / "rank0.log").read_text(errors="replace")


def timeline(run_dir: str | Path) -> dict[str, Any]:
    """A trial's run as the compute count needs it: (time, step) of each training step, (time, step,
    eval_loss) of each evaluation, the step its status ends at, and whether it started cold."""
    from nbtrain.control.runs.run import get_run

    run = get_run(str(run_dir))
    m = run.metrics()
    steps = m[m["loss"].notna()] if "loss" in m else m.iloc[0:0]
    evals = m[m["eval_loss"].notna()] if "eval_loss" in m else m.iloc[0:0]
    return {
        "run_id": run.id,
        "status_step": run.status().step,
        "steps": [(float(t), int(s)) for t, s in zip(steps["t"], steps["step"], strict=True)],
        "evals": [
            (float(t), int(s), float(v))
            for t, s, v in zip(evals["t"], evals["step"], evals["eval_loss"], strict=True)
        ],
        "cold": started_cold(run.dir),
    }


def steps_by(trials: list[dict[str, Any]], when: float) -> int:
    """Optimizer steps trained by every trial up to ``when``."""
    return sum(max((s for t, s in tr["timeline"]["steps"] if t <= when), default=0) for tr in trials)


def reached(trials: list[dict[str, Any]], target: float, t0: float) -> dict[str, Any] | None:
    """The first moment a finished trial's value was at least as good as ``target``: its trial, the wall
    time since ``t0`` and the steps every trial had trained by then."""
    hits = [(tr["timeline"]["evals"][-1][0], tr) for tr in trials
            if tr["state"] == "completed" and tr["value"] <= target]  # fmt: skip
    if not hits:
        return None
    when, tr = min(hits, key=lambda h: h[0])
    return {"trial": tr["number"], "params": tr["params"], "value": tr["value"], "wall_s": when - t0,
            "steps": steps_by(trials, when)}  # fmt: skip


def run_sweep(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    from nbtrain.control.sweep.sweep import start_sweep

    print(f"== {label}: nbtrain sweep", flush=True)
    t0 = time.time()
    sweep = start_sweep(cfg, name=label)
    st = sweep.wait(timeout=3600, poll=0.2)
    wall = time.time() - t0
    if st.state != "completed":
        raise RuntimeError(f"sweep {label} ended {st.describe()}:\n{sweep.paths.log.read_text()[-3000:]}")
    trials = []
    for t in st.trials:
        tr = {k: t[k] for k in ("number", "params", "state", "value", "reason")}
        tr["timeline"] = timeline(t["run_dir"])
        trials.append(tr)
        cold = " (cold)" if tr["timeline"]["cold"] else ""
        print(f"  trial {t['number']:2d} {t['state']:9s} {t['params']} value {t['value']} "
              f"steps {tr['timeline']['status_step']}{cold}")  # fmt: skip
    best = st.best_trial()
    assert best is not None, st.describe()
    return {
        "wall_s": wall,
        "loadavg_end": os.getloadavg(),
        "at_once": st.at_once,
        "at_once_why": sweep.why,
        "trials": trials,
        "best": {"trial": best["number"], "params": best["params"], "value": best["value"]},
        "to_best_s": reached(trials, best["value"], t0)["wall_s"],  # type: ignore[index]
        "steps_total": sum(tr["timeline"]["status_step"] for tr in trials),
        "cold_trials": sum(tr["timeline"]["cold"] for tr in trials),
        "states": st.counts(),
        "t0": t0,
    }


def run_cold(base: dict[str, Any], grid: list[dict[str, Any]]) -> dict[str, Any]:
    import nbtrain
    from nbtrain.control.sweep import space

    print("== the same trials as cold runs, one after another", flush=True)
    os.environ["NBTRAIN_WARM"] = "0"
    try:
        t0, trials = time.time(), []
        for i, params in enumerate(grid):
            run = nbtrain.finetune(space.apply(base, params), name=f"cold-t{i:03d}")
            st = run.wait(timeout=1800)
            done = time.time()
            if st.state != "completed":
                raise RuntimeError(f"cold run {run.id} ended {st.state}: {run.logs(40)}")
            if not started_cold(run.dir):
                raise RuntimeError(f"cold run {run.id} did not start cold")
            evals = run.metrics()["eval_loss"].dropna()
            trials.append({"number": i, "params": params, "value": float(evals.iloc[-1]),
                           "done_s": done - t0, "steps": st.step})  # fmt: skip
            print(f"  run {i:2d} {params} eval_loss {trials[-1]['value']:.4f} at {done - t0:.1f} s",
                  flush=True)  # fmt: skip
        wall = time.time() - t0
    finally:
        os.environ["NBTRAIN_WARM"] = "1"
    return _summary(trials, wall)


def run_optuna(model: Path, data: Path, steps: int, grid: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    import optuna

    print("== Optuna's loop driving a bare TRL script, one trial after another", flush=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lrs = sorted({p["train.learning_rate"] for p in grid})
    ranks = sorted({p["lora.r"] for p in grid})
    sampler = optuna.samplers.GridSampler({"learning_rate": lrs, "lora_r": ranks}, seed=0)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    trials: list[dict[str, Any]] = []
    t0 = time.time()

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("learning_rate", lrs[0], lrs[-1], log=True)
        r = trial.suggest_categorical("lora_r", ranks)
        argv = [sys.executable, str(BARE), str(model), str(data), str(work / f"bare-{trial.number}"),
                "--learning-rate", repr(lr), "--lora-r", str(r), "--steps", str(steps), "--batch", str(BATCH),
                "--eval-split", str(EVAL_SPLIT)]  # fmt: skip
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"bare TRL trial {trial.number} failed:\n{out.stderr[-3000:]}")
        got = json.loads(line.removeprefix("RESULT "))
        done = time.time()
        params = {"train.learning_rate": lr, "lora.r": r}
        trials.append({"number": trial.number, "params": params, "value": got["eval_loss"],
                       "done_s": done - t0, "steps": got["steps"]})  # fmt: skip
        print(f"  trial {trial.number:2d} {params} eval_loss {got['eval_loss']:.4f} at {done - t0:.1f} s",
              flush=True)  # fmt: skip
        return float(got["eval_loss"])

    study.optimize(objective, n_trials=len(grid))
    return _summary(trials, time.time() - t0)


def _summary(trials: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    best = min(trials, key=lambda t: t["value"])
    return {"wall_s": wall, "loadavg_end": os.getloadavg(), "trials": trials, "to_best_s": best["done_s"],
            "best": {"trial": best["number"], "params": best["params"], "value": best["value"]},
            "steps_total": sum(t["steps"] for t in trials)}  # fmt: skip


def dump(res: dict[str, Any]) -> str:
    """The results as indented JSON with each innermost list on one line (a trial's (time, step) pairs)."""
    text = json.dumps(res, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def numbers(text: str, kind: type) -> list[Any]:
    return [kind(x) for x in re.split(r"[,\s]+", text.strip()) if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120, help="max_steps of every trial (default 120)")
    ap.add_argument("--lrs", default="3e-3,1e-2,3e-2,1e-1", help="the grid's learning rates")
    ap.add_argument("--ranks", default="4,8,16", help="the grid's LoRA ranks")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where the results go (default {RESULTS})")
    args = ap.parse_args()
    lrs, ranks = numbers(args.lrs, float), numbers(args.ranks, int)
    space = {"train.learning_rate": lrs, "lora.r": ranks}
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "loadavg_start": os.getloadavg(),
        "model": "tiny", "steps": args.steps, "batch": BATCH, "eval_split": EVAL_SPLIT, "space": space,
    }  # fmt: skip
    from nbtrain.contract.warmproto import ENV_DIR, ENV_USER_DIR
    from nbtrain.control.launch import warm
    from nbtrain.control.start import make_tiny_model
    from nbtrain.examples import write_dataset

    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-sweep-") as d:
        work = Path(d)
        os.environ.update({
            "NBTRAIN_HOME": str(work / "home"), "NBTRAIN_RUNS_DIR": str(work / "runs"),
            ENV_DIR: str(work / "warm"), ENV_USER_DIR: str(work / "warm-user"), "NBTRAIN_WARM": "1",
        })  # fmt: skip
        os.chdir(work)
        model = make_tiny_model(work / "tiny")
        data = write_dataset(work / "data.jsonl")
        try:
            grid = run_sweep(config(model, data, args.steps, {"space": space, "method": "grid"}), "grid")
            order = [t["params"] for t in grid["trials"]]  # the grid's combinations, in the sweep's order
            base = config(model, data, args.steps)
            cold = run_cold(base, order)
            bare = run_optuna(model, data, args.steps, order, work)
            tpe_space = {"train.learning_rate": {"log_uniform": [min(lrs), max(lrs)]}, "lora.r": ranks}
            tpe_sweep = {"space": tpe_space, "method": "tpe", "trials": len(order), "prune": "median"}
            tpe = run_sweep(config(model, data, args.steps, tpe_sweep), "tpe")
        finally:
            warm.stop()
    res["loadavg_end"] = os.getloadavg()
    res["nbtrain_sweep"], res["cold_sequential"], res["optuna_bare_trl"] = grid, cold, bare
    res["sweep_over_cold"] = grid["wall_s"] / cold["wall_s"]
    res["sweep_over_optuna"] = grid["wall_s"] / bare["wall_s"]
    res["to_best_sweep_over_cold"] = grid["to_best_s"] / cold["to_best_s"]
    res["to_best_sweep_over_optuna"] = grid["to_best_s"] / bare["to_best_s"]
    target = grid["best"]["value"]
    got = reached(tpe["trials"], target, tpe["t0"])
    grid_hit = reached(grid["trials"], target, grid["t0"])
    assert grid_hit is not None
    res["tpe"] = tpe
    res["tpe_vs_grid"] = {
        "grid_best": target,
        "grid_to_best_steps": grid_hit["steps"], "grid_steps_total": grid["steps_total"],
        "tpe_reached": got is not None,
        "tpe_to_grid_best_steps": got["steps"] if got else None,
        "tpe_best": tpe["best"], "tpe_steps_total": tpe["steps_total"],
        "ratio_to_grid_best": got["steps"] / grid_hit["steps"] if got else None,
        "ratio_vs_full_grid": got["steps"] / grid["steps_total"] if got else None,
        "ratio_total": tpe["steps_total"] / grid["steps_total"],
    }  # fmt: skip
    if got is None:  # then at TPE's best: the steps each took to find a value at least that good
        own = reached(tpe["trials"], tpe["best"]["value"], tpe["t0"])
        grid_own = reached(grid["trials"], tpe["best"]["value"], grid["t0"])
        assert own is not None and grid_own is not None  # the grid's best is better than TPE's
        res["tpe_vs_grid"].update(tpe_to_own_best_steps=own["steps"], ratio_to_tpe_best=own["steps"] /
                                  grid_own["steps"], grid_to_tpe_best_steps=grid_own["steps"])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(res))
    report(res)
    ok = res["sweep_over_cold"] <= TARGET
    print(f"sweep / cold one after another: {res['sweep_over_cold']:.2f}x (target <= {TARGET}x): "
          f"{'ok' if ok else 'MISSED'}")  # fmt: skip
    return 0 if ok else 1


def report(res: dict[str, Any]) -> None:
    rows = {"nbtrain sweep (warm, at once)": res["nbtrain_sweep"], "cold runs one after another":
            res["cold_sequential"], "Optuna + bare TRL script": res["optuna_bare_trl"]}  # fmt: skip
    n = len(res["nbtrain_sweep"]["trials"])
    print(f"\n{n}-trial grid, tiny model, {res['steps']} steps each; "
          f"at once: {res['nbtrain_sweep']['at_once_why']}")  # fmt: skip
    print("| approach | wall s | to best trial s | best eval_loss (params) |\n|---|---|---|---|")
    for name, r in rows.items():
        b = r["best"]
        print(f"| {name} | {r['wall_s']:.1f} | {r['to_best_s']:.1f} | {b['value']:.4f} ({b['params']}) |")
    print(f"sweep / cold: wall {res['sweep_over_cold']:.2f}x, to best {res['to_best_sweep_over_cold']:.2f}x; "
          f"sweep / Optuna + bare TRL: wall {res['sweep_over_optuna']:.2f}x, "
          f"to best {res['to_best_sweep_over_optuna']:.2f}x")  # fmt: skip
    c, t = res["tpe_vs_grid"], res["tpe"]
    print(f"\nTPE + median pruning vs grid (grid best eval_loss {c['grid_best']:.4f}; TPE {t['states']}):")
    if c["tpe_reached"]:
        print(f"steps to reach the grid's best: TPE {c['tpe_to_grid_best_steps']} vs grid "
              f"{c['grid_to_best_steps']} ({c['ratio_to_grid_best']:.2f}x; the whole grid "
              f"{c['grid_steps_total']}: {c['ratio_vs_full_grid']:.2f}x)")  # fmt: skip
    else:
        print(f"TPE did not reach it: its best {c['tpe_best']['value']:.4f} ({c['tpe_best']['params']}); "
              f"grid reached its best at {c['grid_to_best_steps']} steps")  # fmt: skip
        print(f"steps to reach TPE's best: TPE {c['tpe_to_own_best_steps']} vs grid "
              f"{c['grid_to_tpe_best_steps']} ({c['ratio_to_tpe_best']:.2f}x)")  # fmt: skip
    print(f"steps in all: TPE {c['tpe_steps_total']} vs grid {c['grid_steps_total']} "
          f"({c['ratio_total']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
