"""``make bench``: run every bench/bench_*.py script in turn; each prints its table and writes
bench/results/<name>.json. Then one Markdown table of every results/*.json goes to
bench/results/README.md (and stdout), above its hand-written "## Notes", which are kept. Not part of
``make test``.

    python -m bench            # run everything, then write the table
    python -m bench --table    # only rewrite the table from the results already there
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _overhead(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    k = d["kernel"]
    load = (
        f"{k['load_ext_s_median'] * 1e3:.0f} ms, {k['modules_imported']} modules, heavy: {k['heavy_modules']}"
    )
    if "kernel_date" in d:  # re-measured on its own (bench_overhead.py --kernel-only)
        load += f" (measured {d['kernel_date'][:10]})"
    rows = [("`%load_ext nbtrain`", load, "< 300 ms, no torch/transformers in the kernel")]
    for label in ("tiny", "40M"):
        if label in d:
            r = d[label]
            speed = f"steps/s {_x(r['steps_per_s_ratio'])}"
            if "steady_steps_per_s_ratio" in r:  # median step interval; the Trainer's whole-loop figure
                whole = _x(r["steps_per_s_ratio"])
                speed = f"steps/s {_x(r['steady_steps_per_s_ratio'])} (whole loop {whole})"
            rows.append((f"nbtrain / bare TRL ({label} model)", f"{speed}, "
                         f"first step {_x(r['first_step_ratio'])}, peak RSS {_x(r['peak_rss_ratio'])}",
                         "steps/s >= 0.98x, first step <= 1.10x"))  # fmt: skip
    return rows


def _llamafactory(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    if "error" in d:
        return [("nbtrain vs LLaMA-Factory", f"not measured: {d['error']}", "first step <= 0.90x")]
    rows = []
    for label in ("tiny", "40M"):
        if label not in d:
            continue
        r, m = d[label], d[label]["median"]
        phases = sorted(r["nbtrain_phases_s"].items(), key=lambda kv: -kv[1])[:3]
        rows.append((
            f"time to first step, nbtrain / LLaMA-Factory ({label})",
            f"{_x(r['first_step_ratio_vs_llamafactory'])} ({m['nbtrain']['first_step_s']:.1f} s vs "
            f"{m['llamafactory']['first_step_s']:.1f} s; bare TRL {m['bare_trl']['first_step_s']:.1f} s); "
            f"peak RSS {_x(r['peak_rss_ratio_vs_llamafactory'])}; nbtrain's time: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in phases),
            "<= 0.90x",
        ))  # fmt: skip
        if "warm_first_step_ratio_vs_llamafactory" in r:
            warm, lf, cold = (m[s]["first_step_s"] for s in ("nbtrain_warm", "llamafactory", "nbtrain"))
            rows.append((
                f"time to first step, nbtrain warm start / LLaMA-Factory ({label})",
                f"{_x(r['warm_first_step_ratio_vs_llamafactory'])} ({warm:.1f} s vs {lf:.1f} s; cold "
                f"{cold:.1f} s, warm / cold {_x(r['warm_first_step_ratio_vs_cold'])})",
                "<= 0.30x",
            ))  # fmt: skip
    return rows


def _latency(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    a, b = d["idle"], d["dashboard"]
    return [("cell latency, live dashboard vs idle kernel",
             f"p50 {b['p50_ms']:.1f} vs {a['p50_ms']:.1f} ms ({_x(d['p50_ratio'])}), "
             f"p95 {b['p95_ms']:.1f} vs {a['p95_ms']:.1f} ms ({_x(d['p95_ratio'])}); "
             f"{d['dashboard_updates_during_measurement']} figure updates", "")]  # fmt: skip


def _estimator(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    by: dict[str, list[str]] = {}
    for s in d["summary"].values():
        worst = max(s["ratio_per_rank"], key=lambda x: abs(x - 1))
        by.setdefault(s["strategy"], []).append(f"{s['method']} {worst:.4f}")
    text = "; ".join(f"{k}: {', '.join(v)}" for k, v in by.items())
    return [("estimate vs measured model-state bytes per rank (CPU, 2 ranks)",
             f"measured / estimated: {text}", "within 5%")]  # fmt: skip


def _scaling(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    text = ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s ({_x(d['speedup_vs_1_rank'][k])})"
                     for k, v in d["median"].items())  # fmt: skip
    return [("CPU scaling, 1 vs 2 ranks (2 cores)", text, "~1x expected on 2 cores (see notes)")]


def _tail(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    text = (
        f"poll {_x(d['ratio_poll_1M_1k'])}, refresh {_x(d['ratio_refresh_1M_1k'])}; "
        f"figure of a 100k-step run {d['figure_json_bytes_100k_steps'] / 1e3:.0f} kB"
    )
    return [("live-view refresh cost, 1M-line vs 1k-line metrics file", text, "flat (~1x)")]


def _crash(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    n = d["trials_requested"]
    return [("crash and stop recovery",
             f"kill -9: {d['kill9_trials_completed']}/{n} resumed and completed; graceful stop: "
             f"{d['graceful_stop_trials_completed']}/{n}", "all")]  # fmt: skip


def _packing(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [("packing vs padding, effective tokens/s",
             _x(d["effective_tokens_per_s_ratio"]), str(d.get("target", "")))]  # fmt: skip


def _gpu(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for r in d["rows"]:
        if "error" in r:
            rows.append((f"GPU {r['size']} {r['method']}, {r['mode']}", "failed (see the file)", ""))
            continue
        peak = f"{r['peak_bytes'] / 2**30:.1f} GiB" if r.get("peak_bytes") else "-"
        mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
        batch = (
            f"batch {r['micro_batch']}x{r['grad_accum']}"
            + (
                ""
                if r.get("gradient_checkpointing") is None
                else f", checkpointing {'on' if r['gradient_checkpointing'] else 'off'}"
            )
            + (", Liger" if r.get("use_liger_kernel") else "")
        )
        text = f"{r['tokens_per_s']:.0f} tok/s, peak {peak}, {batch}{mfu}"
        rows.append((f"GPU {r['size']} {r['method']}, {r['mode']}", text, d.get("machine", "")))
    return rows


def _warm_jobs(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    text = "; ".join(f"{job} {r['warm_s']:.2f} s vs {r['cold_s']:.1f} s ({_x(r['warm_over_cold'])})"
                     for job, r in d["jobs"].items())  # fmt: skip
    return [(f"job start, warm vs cold ({d['model']} model, call to result)", text, "")]


def _ranks(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    m, r = d["median_s"], d["ratios"]
    text = (f"DDP: forked warm {m['ddp forked warm']:.1f} s, cold {m['ddp forked cold']:.1f} s vs torchrun's "
            f"command {m['ddp torchrun command']:.1f} s (**{_x(r['ddp_forked_warm_over_torchrun'])}**, cold "
            f"{_x(r['ddp_forked_cold_over_torchrun'])}); ZeRO-2: forked warm {m['zero2 forked warm']:.1f} s "
            f"vs DeepSpeed's launcher {m['zero2 deepspeed launcher']:.1f} s "
            f"({_x(r['zero2_forked_warm_over_deepspeed'])})")  # fmt: skip
    return [("two-rank run start to end (tiny model, 6 steps), ranks forked vs new interpreters", text, "")]


def _msswift(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    m, v = d["median"], d["vs_msswift"]
    sw = m["msswift"]
    steps = f"{d.get('steps', 40)} steps"
    first = (f"warm {_x(v['nbtrain_warm']['first_step'])}, cold {_x(v['nbtrain']['first_step'])} of "
             f"ms-swift's {sw['first_step_s']:.1f} s (LLaMA-Factory {_x(v['llamafactory']['first_step'])}, "
             f"bare TRL {_x(v['bare_trl']['first_step'])})")  # fmt: skip
    speed = (f"steps/s (median step) cold {_x(v['nbtrain']['steps_per_s'])}, warm "
             f"{_x(v['nbtrain_warm']['steps_per_s'])} of ms-swift's {sw['steady_steps_per_s']:.1f}; peak RSS "
             f"cold {_x(v['nbtrain']['peak_rss'])}, warm {_x(v['nbtrain_warm']['peak_rss'])} of "
             f"{sw['peak_rss'] / 2**20:.0f} MiB; final loss {m['nbtrain']['final_loss']:.3f} vs "
             f"{sw['final_loss']:.3f}")  # fmt: skip
    return [(f"time to first step, nbtrain / ms-swift `swift sft` (tiny, {steps})", first, ""),
            (f"training, nbtrain / ms-swift `swift sft` (tiny, {steps})", speed, "")]  # fmt: skip


def _gguf(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, f, g = d["export"], d["files"], d["tokens_per_s_vs_nbtrain_server"]
    sizes = ", ".join(f"{q} {v['bytes'] / 2**20:.0f} MiB" for q, v in f.items())
    export = (f"{e['first']['seconds']:.0f} s (merge, convert once, quantise, check each on 8 prompts), "
              f"{e['again']['seconds']:.0f} s again (conversion reused); {sizes}")  # fmt: skip
    speed = ", ".join(f"{k} {d['generation'][k]['tokens_per_s']:.0f} tok/s ({_x(v)})" for k, v in g.items())
    what = "generation, llama.cpp vs nbtrain's server (SmolLM2, 8 prompts x 64 tokens)"
    return [("GGUF export, SmolLM2-135M (f16, q8_0, q4_k_m)", export, ""), (what, speed, "")]


def _serving(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for label in ("smollm2-135m", "tiny-adder"):
        r = d[label]
        new, old = r["batching"], r["one_at_a_time"]
        figures = ", ".join(f"{n} clients {new[n]['tokens_per_s']:.0f} vs {old[n]['tokens_per_s']:.0f} tok/s "
                            f"({_x(r['ratio'][n])})" for n in new)  # fmt: skip
        ttft = f"; TTFT p95 {new['1']['ttft_p95_s']:.2f} s at 1 client, {new['8']['ttft_p95_s']:.2f} s at 8"
        target = ">= 3x at 8 clients; TTFT p95 8 <= 2x 1" if label.startswith("smol") else ""
        rows.append((f"server, continuous batching vs one at a time ({label}, streaming, greedy)",
                     figures + ttft, target))  # fmt: skip
    return rows


def _sweep(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """bench_sweep.py: one grid three ways (wall time, to the best trial, best eval_loss); TPE vs the grid."""
    g, c, o, v = d["nbtrain_sweep"], d["cold_sequential"], d["optuna_bare_trl"], d["tpe_vs_grid"]
    n = len(g["trials"])
    text = (f"wall {g['wall_s']:.0f} s vs cold {c['wall_s']:.0f} s (**{_x(d['sweep_over_cold'])}**) vs "
            f"Optuna {o['wall_s']:.0f} s ({_x(d['sweep_over_optuna'])}); to the best trial "
            f"{g['to_best_s']:.0f} / {c['to_best_s']:.0f} / {o['to_best_s']:.0f} s; best eval_loss "
            f"{g['best']['value']:.4f} / {c['best']['value']:.4f} / {o['best']['value']:.4f}; "
            f"{g['at_once']} at once")  # fmt: skip
    if v["tpe_reached"]:
        tpe = (f"{v['tpe_to_grid_best_steps']} vs {v['grid_to_best_steps']} steps "
               f"({_x(v['ratio_to_grid_best'])}; the whole grid {v['grid_steps_total']})")  # fmt: skip
    else:
        tpe = (f"not reached: TPE's best {v['tpe_best']['value']:.4f} vs {v['grid_best']:.4f}; to reach "
               f"TPE's best {v['tpe_to_own_best_steps']} vs {v['grid_to_tpe_best_steps']} steps "
               f"({_x(v['ratio_to_tpe_best'])}); {v['tpe_steps_total']} vs {v['grid_steps_total']} "
               "in all")  # fmt: skip
    what = (f"sweep of {n} trials (tiny, {d['steps']} steps), nbtrain warm + at once / the same runs cold "
            "one after another / Optuna + a bare TRL script")  # fmt: skip
    reach = "TPE + median pruning vs the grid: steps trained to reach the grid's best eval_loss"
    return [(what, text, "<= 0.50x the cold runs"), (reach, tpe, "")]


def _threads(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """bench_threads.py: a CPU run beside a busy process, torch's fixed threads vs nbtrain's followed ones."""
    rows = []
    for label in ("tiny", "smollm2-135m"):
        if label in d:
            r, m = d[label], d[label]["median_s"]
            rows.append((f"beside a busy process ({label}, {r['steps']} steps): fixed / followed threads",
                         f"**{_x(r['fixed_over_followed_busy'])}** ({m['busy_fixed']:.1f} s vs "
                         f"{m['busy_followed']:.1f} s; idle {m['idle_followed']:.1f} s)",
                         ">= 2.00x (tiny)" if label == "tiny" else ""))  # fmt: skip
    return rows


def _real(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """bench_real.py: SmolLM2-135M, the same LoRA job side by side; any subset of its systems."""
    m, mfu, rows = d["median"], d["mfu"], []
    speed = ", ".join(f"{s} {v['steady_steps_per_s']:.3f}" for s, v in m.items())
    ratios = "; ".join(f"{'warm' if k.startswith('warm') else 'nbtrain'} / LLaMA-Factory {_x(d[k])}"
                       for k in d if k.endswith("ratio_vs_llamafactory"))  # fmt: skip
    if "steps_per_s_ratio_vs_bare_trl" in d:
        ratios += f"; / bare TRL {_x(d['steps_per_s_ratio_vs_bare_trl'])}"
    target = ">= 1.0x LLaMA-Factory, >= 0.98x bare TRL" if ratios else ""
    rows.append(("real model SmolLM2-135M LoRA, steps/s (median step)",
                 speed + (f" ({ratios})" if ratios else ""), target))  # fmt: skip
    vs = ", ".join(f"{k.removesuffix('_vs_bare_peft').replace('mfu_ratio', 'MFU').replace('_', ' ')} "
                   f"{_x(d[k])}" for k in d if k.endswith("_vs_bare_peft"))  # fmt: skip
    each = ", ".join(f"{s} {v:.2f}" for s, v in mfu.items())
    rows.append(("real model, FLOP utilisation vs the machine's matmul",
                 f"{each}; / the bare peft loop: {vs}", ">= 1.0x the bare loop"))  # fmt: skip
    return rows


SUMMARIES: dict[str, Callable[[dict[str, Any]], list[tuple[str, str, str]]]] = {
    "real": _real, "real_pair": _real, "real_mfu": _real, "real_watched": _real,
    "overhead": _overhead, "llamafactory": _llamafactory, "latency": _latency, "estimator": _estimator,
    "scaling": _scaling, "tail": _tail, "crash": _crash, "packing": _packing, "gpu": _gpu, "gpu_run1": _gpu,
    "warm_jobs": _warm_jobs, "msswift": _msswift, "gguf": _gguf, "serving": _serving, "sweep": _sweep,
    "threads": _threads, "ranks": _ranks,
}  # fmt: skip


def table(results: Path = RESULTS) -> str:
    """One Markdown table of every results/*.json, each row with the date it was measured (its ``date``;
    a file without one: when it was last written, which a fresh checkout sets to the checkout's time)."""
    lines = ["| benchmark | measured | target | file, date |", "|---|---|---|---|"]
    for path in sorted(results.glob("*.json")):
        date = time.strftime("%Y-%m-%d", time.gmtime(path.stat().st_mtime))
        summarise = SUMMARIES.get(path.stem)
        try:
            data = json.loads(path.read_text())
            rows = summarise(data) if summarise else [(path.stem, "see the file", "")]
            date = str(data.get("date", date))[:10]
        except (KeyError, TypeError, ValueError) as e:  # a result in a newer shape: point at it, not crash
            rows = [(path.stem, f"see the file (no summary: {type(e).__name__}: {e})", "")]
        for name, measured, target in rows:
            lines.append(f"| {name} | {measured} | {target} | {path.name}, {date} |")
    if not (results / "gpu.json").exists():
        lines.append("| GPU section (bench/gpu.py) | not measured: no GPU where this table was made | | |")
    return "\n".join(lines) + "\n"


def write_table(results: Path = RESULTS) -> str:
    import os
    import platform

    head = (
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} on {platform.machine()}, {os.cpu_count()} "
        "cores (see each file for its machine and the load it ran under).\n\n"
    )
    text = head + table(results)
    readme = results / "README.md"
    old = readme.read_text() if readme.exists() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""  # the dated notes are written by hand: kept
    readme.write_text("# Benchmark results\n\n" + text + ("\n" + notes if notes else ""))
    return text


NOTES = "## Notes"


def main() -> int:
    here = Path(__file__).resolve().parent
    if "--table" in sys.argv[1:]:
        print(write_table(), end="")
        return 0
    failed = []
    for script in sorted(here.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.name)
    print(write_table(), end="")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
