"""The auto plan in common situations, as one table (docs/plans.md), generated from the planner itself.

Each row is what ``nbtrain.prepare`` plans for one SFT job on given hardware facts (no GPU needed: the
facts are passed in, as a machine's NVML would give them). The job is the same everywhere: a chat dataset
cut at ``max_length: 2048``, an effective batch of 16 (``batch_size: 16``), ``per_device_train_batch_size:
auto`` and everything else left to the plan (``method: auto`` or the method named). The machines have
liger-kernel, flash-attn (2) and bitsandbytes installed; host RAM is the usual one for the machine
(MACHINES).

    python -m bench.plan_table            # writes docs/plans.md
    python -m bench.plan_table --check    # exits 1 when docs/plans.md is stale (the suite runs this)

Where nbtrain's choice differs from what the peers publish for the same situation (PEERS, from their
own example configs and tables: tests/fixtures/peer_recipes.json), the differences are tested in
tests/bench/test_plan_table.py with the reason nbtrain's choice is at least as good.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nbtrain.contract.gendoc import write_or_check  # noqa: E402
from nbtrain.hardware import Hardware  # noqa: E402
from nbtrain.hardware.named import parse  # noqa: E402

DOC = ROOT / "docs" / "plans.md"
CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
GiB = 2**30
SEQ = 2048
BATCH = 16


@dataclass(frozen=True)
class Machine:
    name: str  # its heading in docs/plans.md
    card: str  # its card in nbtrain.hardware.named, as `nbtrain.estimate(config, on="8xA100-40GB")` names it

    def hardware(self, n: int) -> Hardware:
        """``n`` of the card on the usual machine with that many (its host RAM): the named hardware
        ``on="{n}x{card}"`` gives users, so this table and a what-if estimate are one code path."""
        return parse(f"{n}x{self.card}").hardware()


MACHINES = (
    Machine("T4 16GB", "T4"),
    Machine("RTX 4090 24GB", "4090"),
    Machine("A100 40GB", "A100-40GB"),
    Machine("H100 80GB", "H100-80GB"),
)
MODELS = ("Qwen2.5-0.5B", "Meta-Llama-3-8B", "Llama-2-13b", "Meta-Llama-3-70B")
METHODS = ("auto", "full")


@dataclass(frozen=True)
class Row:
    machine: str
    gpus: int
    model: str
    asked: str
    plan: dict[str, Any]

    def cells(self) -> list[str]:
        p = self.plan
        if p.get("refused"):
            return [
                self.machine,
                str(self.gpus),
                self.model,
                self.asked,
                f"refused: {p['refused']}",
                *[""] * 7,
            ]
        strategy = p["strategy"] + (f" + offload {p['offload']}" if p["offload"] != "none" else "")
        kernels = ", ".join(k for k in (p["attn"], "Liger" if p["liger"] else "", p["optim"] or "") if k)
        fit = f"{p['est_gib']:.1f} / {p['usable_gib']:.0f}"
        if not p["fits"]:
            change = p["advice"].partition("Smallest change that fits: ")[2].split(" (about")[0]
            fit += f" **no**: {change or 'no single change fits'}"
            strategy = "-"
        return [
            self.machine, str(self.gpus), self.model, self.asked, p["method"], p["precision"],
            f"{p['micro_batch']} x {p['grad_accum']}", "on" if p["checkpointing"] else "off", strategy,
            kernels, p["lr"], fit,
        ]  # fmt: skip


@contextmanager
def _workdir() -> Iterator[Path]:
    """A scratch folder with the job's data and a runs folder of its own (prepare writes nothing, but
    reads the environment's runs folder for names)."""
    old = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="nbtrain-plan-table-") as d:
        work = Path(d)
        rows = [{"messages": [{"role": "user", "content": f"{a} + {a}?"}, {"role": "assistant",
                                                                         "content": str(2 * a)}]}
                for a in range(20)]  # fmt: skip
        (work / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        saved = {k: os.environ.get(k) for k in ("NBTRAIN_HOME", "NBTRAIN_RUNS_DIR")}
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        try:
            yield work
        finally:
            os.chdir(old)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def job(model: str, method: str) -> str:
    return (
        f"model: {CONFIGS / model}\nmethod: {method}\ndata: {{train: chat.jsonl}}\nbatch_size: {BATCH}\n"
        f"train: {{max_length: {SEQ}, per_device_train_batch_size: auto}}\n"
    )


def plan_of(machine: Machine, n: int, model: str, method: str) -> dict[str, Any]:
    """What prepare plans (must be called inside ``_workdir``)."""
    import nbtrain
    from nbtrain.contract.errors import NbtrainError
    from nbtrain.control.config import trainargs

    try:
        prep = nbtrain.prepare(job(model, method), hardware=machine.hardware(n))
    except NbtrainError as e:
        return {"refused": str(e).splitlines()[0][:160]}
    p, args = prep.plan, prep.train_args
    arg = lambda field: trainargs.value(args, field, prep.resolved.config.objective)  # noqa: E731
    est = p.estimate or {}
    return {
        "method": p.method, "precision": p.precision, "micro_batch": args["per_device_train_batch_size"],
        "grad_accum": arg("gradient_accumulation_steps"), "world_size": p.world_size,
        "checkpointing": bool(args.get("gradient_checkpointing")), "strategy": p.strategy,
        "offload": p.offload, "attn": p.attn_implementation or "sdpa", "liger": bool(p.liger),
        "optim": args.get("optim"), "lr": f"{arg('learning_rate'):g}",
        "est_gib": est.get("per_device_bytes", 0) / GiB, "usable_gib": est.get("usable_bytes", 0) / GiB,
        "fits": p.fits, "advice": p.fit_advice, "reasons": p.reasons,
    }  # fmt: skip


def rows() -> list[Row]:
    from nbtrain.control.config.facts import bitsandbytes_problem

    why = bitsandbytes_problem(tuple(sys.path))
    if why is not None:  # method: auto would plan LoRA where QLoRA belongs: a different table
        raise SystemExit(f"bench.plan_table needs bitsandbytes, as the machines in the table have it: {why}")
    out = []
    with _workdir():
        for m in MACHINES:
            for n in (1, 8):
                for model in MODELS:
                    for method in METHODS:
                        out.append(Row(m.name, n, model, method, plan_of(m, n, model, method)))
    return out


PEERS = ROOT / "tests" / "fixtures" / "peer_recipes.json"  # the peers' own configs, read at their commits


@dataclass(frozen=True)
class Comparison:
    """One situation: nbtrain's plan (``nbtrain``: fields of ``plan_of`` it must have, checked by the tests)
    against the peers' recipes for it (ids in PEERS), whether nbtrain's choice is the same, and why it is at
    least as good where it differs (each reason has its test in tests/bench/test_plan_table.py)."""

    situation: str
    machine: str
    gpus: int
    model: str
    asked: str
    nbtrain: dict[str, Any]
    peers: tuple[str, ...]
    verdict: str
    why: str


COMPARISONS = (
    Comparison(
        "Llama 3 8B on one T4",
        "T4 16GB",
        1,
        "Meta-Llama-3-8B",
        "auto",
        {"method": "qlora", "precision": "fp16", "checkpointing": True, "lr": "0.0002"},
        ("unsloth-llama3.1-8b-alpaca-t4", "llamafactory-llama3-8b-qlora4-bnb-otfq"),
        "same method, precision, checkpointing and learning rate as Unsloth's T4 notebook; optimizer differs",
        "fused AdamW with fp32 states where Unsloth uses 8-bit AdamW: the adapters' states are under 1% of "
        "the card (test_the_adapters_optimizer_state_is_a_sliver_of_the_card), so 8-bit states would save "
        "under 1% and the fused kernel updates every tensor in one launch",
    ),
    Comparison(
        "Llama 3 8B on one RTX 4090",
        "RTX 4090 24GB",
        1,
        "Meta-Llama-3-8B",
        "auto",
        {"method": "lora", "precision": "bf16", "checkpointing": True, "strategy": "none"},
        ("torchtune-llama3.1-8b-lora-1gpu",),
        "same: LoRA on the 16-bit weights, bf16, activation checkpointing, micro-batch 2",
        "torchtune measured this job on a 4090 at 16.2 GiB (tests/fixtures/published_peaks.json); QLoRA, "
        "which a rule of thumb on the weights alone would pick, dequantises every matmul (0.76x LoRA's "
        "tokens/s on an H200)",
    ),
    Comparison(
        "Llama 3 70B on 8 A100 40GB",
        "A100 40GB",
        8,
        "Meta-Llama-3-70B",
        "auto",
        {"method": "lora", "strategy": "zero3", "offload": "none", "checkpointing": True},
        ("torchtune-llama3.1-70b-lora-8gpu", "llamafactory-llama3-8b-lora-sft-ds3"),
        "same: LoRA with the 16-bit weights sharded over the GPUs (torchtune: FSDP2; LLaMA-Factory: ZeRO-3)",
        "ZeRO-3 and FSDP's full shard hold the same eighth of the weights per GPU; torchtune measured its "
        "70B LoRA at 27.6 GiB per A100",
    ),
    Comparison(
        "Llama 3 8B full fine-tune on 8 H100",
        "H100 80GB",
        8,
        "Meta-Llama-3-8B",
        "full",
        {"method": "full", "strategy": "zero2", "offload": "none"},
        (
            "llamafactory-llama3-8b-full-sft",
            "torchtune-llama3.1-8b-full-4gpu",
            "axolotl-llama3.1-8b-full-liger-fsdp",
        ),
        "differs: ZeRO-2 where the peers' examples shard everything (ZeRO-3 / FSDP)",
        "nbtrain takes the first rung of the ladder that fits: ZeRO-2 keeps the weights whole on each GPU, "
        "so a step moves 2x the parameters over the links where ZeRO-3 moves 3x (the ZeRO paper's analysis) "
        "and gathers nothing in forward; ZeRO-3 is taken where ZeRO-2 does not fit (8 x A100 40GB)",
    ),
    Comparison(
        "Llama 3 8B full fine-tune on one GPU",
        "H100 80GB",
        1,
        "Meta-Llama-3-8B",
        "full",
        {"method": "full", "fits": False},
        ("torchtune-llama3.1-8b-full-1gpu", "axolotl-llama3.1-8b-full"),
        "differs: nbtrain refuses it and says the smallest change (method: lora); torchtune and axolotl "
        "train it in pure bf16 with an 8-bit optimizer",
        "nbtrain's full fine-tunes keep fp32 master weights: in pure bf16 an AdamW step at learning rate "
        "2e-5 is lost on a weight of 0.02 (bf16 keeps 8 bits of mantissa; "
        "test_pure_bf16_loses_the_updates_fp32_master_weights_keep), so the run would leave most weights "
        "unchanged",
    ),
    Comparison(
        "Learning rate of a LoRA SFT",
        "A100 40GB",
        1,
        "Meta-Llama-3-8B",
        "auto",
        {"method": "lora", "lr": "0.0002"},
        (
            "unsloth-llama3.1-8b-alpaca-t4",
            "axolotl-llama3-8b-qlora",
            "llamafactory-llama3-8b-lora-sft",
            "torchtune-llama3.1-8b-lora-1gpu",
            "msswift-qwen2.5-7b-lora-1gpu",
        ),
        "same as Unsloth and axolotl (2e-4), inside the peers' range (1e-4 to 3e-4)",
        "TRL's own default, 2e-5, is a full fine-tuning rate that moves an adapter little",
    ),
    Comparison(
        "Micro-batch and accumulation (effective batch 16)",
        "A100 40GB",
        1,
        "Meta-Llama-3-8B",
        "auto",
        {"micro_batch": 16, "grad_accum": 1},
        (
            "llamafactory-llama3-8b-lora-sft",
            "unsloth-llama3.1-8b-alpaca-t4",
            "torchtune-llama3.1-8b-lora-1gpu",
        ),
        "differs: the largest micro-batch that fits, where the peers' examples fix 1-2 and accumulate",
        "the same effective batch and the same gradients, in fewer and larger matmuls "
        "(test_every_planned_row_keeps_the_effective_batch); the peers' fixed micro-batches are sized for "
        "the smallest card they target",
    ),
    Comparison(
        "Precision and attention on a T4",
        "T4 16GB",
        1,
        "Qwen2.5-0.5B",
        "auto",
        {"precision": "fp16", "attn": "sdpa"},
        ("unsloth-llama3.1-8b-alpaca-t4",),
        "same: fp16 on a card without bf16 (Unsloth's notebooks choose float16 for a T4), no "
        "flash-attention 2 (it needs compute capability 8.0)",
        "",
    ),
)


def peer_recipes() -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in json.loads(PEERS.read_text())["recipes"]}


def _peer_cell(r: dict[str, Any]) -> str:
    lr = r.get("learning_rate")
    parts = [
        r["method"],
        f"{r['micro_batch']} x {r['grad_accum']}" if r.get("micro_batch") is not None else "",
        f"lr {lr:g}" if isinstance(lr, int | float) else "",
        str(r.get("optimizer") or "").split(" (")[0],
        str(r.get("distributed") or "").split(" (")[0],
    ]
    return f"{r['tool']} ({r['source'].split(':')[1].split('@')[0]}): " + ", ".join(p for p in parts if p)


def comparison_markdown(table: list[Row]) -> list[str]:
    peers = peer_recipes()
    out = ["## The plan against what experts run", "",
           "Each situation's plan (from the table above) beside the peers' own recipes for it "
           "(tests/fixtures/peer_recipes.json: their example configs and notebooks, read at the commits "
           "named there). Where nbtrain differs, the reason is tested in tests/bench/test_plan_table.py.", "",
           "| situation | nbtrain plans | the peers run | verdict | why |", "|---" * 5 + "|"]  # fmt: skip
    for c in COMPARISONS:
        row = next(
            r for r in table if (r.machine, r.gpus, r.model, r.asked) == (c.machine, c.gpus, c.model, c.asked)
        )
        p = row.plan
        mine = (
            f"{p['method']}, {p['precision']}, {p['micro_batch']} x {p['grad_accum']}, "
            f"{p['strategy'] + (' + offload ' + p['offload'] if p['offload'] != 'none' else '')}, lr "
            f"{p['lr']}" + ("" if p["fits"] else ", does not fit")
        )
        theirs = "<br>".join(_peer_cell(peers[i]) for i in c.peers)
        out.append(f"| {c.situation} ({c.gpus} x {c.machine}) | {mine} | {theirs} | {c.verdict} | {c.why} |")
    out += ["", "Left as it is, and said: nbtrain's `lora.target_modules: auto` is PEFT's default for the "
            "model (q_proj and v_proj for Llama, Mistral and Qwen), where every peer trains all linear "
            "layers by default (the QLoRA paper found that needed to match full fine-tuning). `lora: "
            "{target_modules: all-linear}` does what the peers do. QLoRA under FSDP (axolotl's 70B on 2 x "
            "24 GB, ms-swift's 72B) is not offered: 4-bit weights are not sharded here, so a 70B on 8 x 24 "
            "GB plans LoRA with ZeRO-3 and offload.", ""]  # fmt: skip
    return out


def published_markdown() -> list[str]:
    """The estimate against the published peaks (tests/fixtures/published_peaks.json), case by case."""
    from nbtrain.control.memory import estimate

    data = json.loads((ROOT / "tests" / "fixtures" / "published_peaks.json").read_text())
    out = ["## The estimate against published measurements", "",
           "Peaks others measured on GPUs for jobs whose settings they state, against nbtrain's estimate of "
           "the same job from the model's config.json (tests/control/test_published_peaks.py holds each to "
           "its tolerance: 15%, or wider with the reason written in the fixture). *estimate*: the tensors "
           "the estimate counts, which is what an allocated-bytes counter sees.", "",
           "| case | card | measured | estimate | ratio | tolerance |", "|---" * 6 + "|"]  # fmt: skip
    for c in data["cases"]:
        config = json.loads((CONFIGS / c["config"] / "config.json").read_text())
        est = estimate(config, **c["estimate"])
        tensors = est.per_device_bytes - est.parts["overhead"]
        ratio = tensors / c["measured_bytes"]
        tol = f"±{c['tolerance']:.0%}" + (" (why: see fixture)" if "why" in c else "")
        out.append(
            f"| {c['id']} | {c['card']} | {c['measured']} | {tensors / GiB:.2f} GiB | {ratio:.2f} | {tol} |"
        )
    skipped = len(data["not_compared"])
    out += ["", f"Not compared ({skipped} published rows), each with its reason in the fixture: "
            "pure-bf16 full fine-tunes (not nbtrain's recipe: it keeps fp32 master weights), torchao's NF4 "
            "(not bitsandbytes), activation offloading, peaks taken over evaluation, non-Llama decoders, "
            "multi-GPU rows whose cards are not stated.", "",
            "No allocated-bytes counter sees the CUDA context (nbtrain counts 0.75 GiB) or the allocator's "
            "reserve (10% of the tensors), here or in nbtrain's own H200 measurements "
            "(tests/fixtures/gpu_peaks.json): both stay documented figures (control/memory/costs.py). "
            "Unsloth Studio's calibrated estimator (unslothai/unsloth, "
            "studio/backend/utils/hardware/VRAM_ESTIMATION.md: a formula, no measurements) counts 1.4 GB of "
            "CUDA overhead, 4-bit weights at 0.625 bytes each (0.556 with double quantisation) and "
            "activations times 1.25. nbtrain counts the storage bitsandbytes allocates: 0.5625 bytes a "
            "weight (a 4-bit code and an fp32 absmax per 64 weights), 0.5157 with double quantisation, plus "
            "one linear dequantised at a time; the published QLoRA rows above (LitGPT, bitsandbytes) agree "
            "within 6% where their settings are known.", ""]  # fmt: skip
    return out


HEADER = ("card", "GPUs", "model", "method asked", "method", "precision", "micro-batch x accum",
          "checkpointing", "strategy", "kernels, optimizer", "lr", "GiB est. / usable, fits")  # fmt: skip


def undertrain_markdown() -> list[str]:
    """The rule behind the plan's under-training warning (nbtrain.control.plan.length), with the runs it
    was measured on."""
    from nbtrain.control.plan.length import MEASURED, UNDERTRAIN_BELOW

    text = (
        "The plan counts the optimizer steps a run will take (`train: max_steps`, else the epochs over the "
        "rows the data holds, as the Trainer counts them; the panel shows them in its Max steps box) and "
        "warns when an adapter's SFT run gets a learning-rate budget, learning rate x steps, under "
        f"**{UNDERTRAIN_BELOW:g}**. The rule comes from these runs of nbtrain's tiny model (the "
        "tiny-adder, LoRA r 8, on its 400 addition rows, batch 8, TRL's linear schedule, on CPU; measured "
        "2026-12-06): under the line its loss stayed above 2, from the line on it fell below 1.7. It is one "
        "small model and task, so it is a warning, never a refusal; full fine-tuning and the preference "
        "and RL objectives are not warned (not measured)."
    )
    out = ["## Will it train enough?", "", text, "",
           "| learning rate | steps | lr x steps | loss at the start | loss at the end (last 5 steps) "
           "| warned |", "|---|---|---|---|---|---|"]  # fmt: skip
    for lr, steps, start, end in MEASURED:
        warned = "yes" if lr * steps < UNDERTRAIN_BELOW else "no"
        out.append(f"| {lr:g} | {steps} | {lr * steps:.3g} | {start:.2f} | {end:.2f} | {warned} |")
    return [*out, ""]


def markdown(table: list[Row]) -> str:
    out = [
        "# The auto plan, situation by situation",
        "",
        "Generated by `python -m bench.plan_table` from nbtrain's planner (a test fails when this file is "
        "stale). Each row is what `nbtrain.prepare` plans for one SFT job: chat rows cut at "
        f"`max_length: {SEQ}`, an effective batch of {BATCH} (`batch_size: {BATCH}`), "
        "`per_device_train_batch_size: auto`, everything else left to the plan. The machines have "
        "liger-kernel, flash-attn 2 and bitsandbytes installed and the host RAM usual for them "
        "(bench/plan_table.py, MACHINES). *GiB est. / usable*: the estimated peak per GPU against what the "
        "fit rule lets a run use of it; where it does not fit, **no** and the smallest change that would "
        "(what `nbtrain.start` says when it refuses the run).",
        "",
        "How these choices compare with what LLaMA-Factory, Unsloth, axolotl, torchtune and ms-swift "
        "publish for the same situations, and why nbtrain differs where it does: "
        "[below](#the-plan-against-what-experts-run); the estimate against peaks others measured: "
        "[below](#the-estimate-against-published-measurements); when the plan warns that a run will "
        "under-train: [below](#will-it-train-enough).",
        "",
    ]
    for machine in MACHINES:
        out += [f"## {machine.name}", "", "| " + " | ".join(HEADER[1:]) + " |",
                "|" + "---|" * (len(HEADER) - 1)]  # fmt: skip
        for r in table:
            if r.machine == machine.name:
                out.append("| " + " | ".join(r.cells()[1:]) + " |")
        out.append("")
    out += comparison_markdown(table)
    out += undertrain_markdown()
    out += published_markdown()
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = markdown(rows())
    return write_or_check(DOC, text, argv, "python -m bench.plan_table")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
