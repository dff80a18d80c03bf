"""Will it fit? The estimator (nbtrain.control.memory) against what real runs allocate.

CPU: 2-rank probe runs of the tiny model, LoRA and full fine-tune, under DDP and ZeRO-1/2/3 (fp32),
started together from one notebook (two_rank_runs in tests/worker/conftest.py, shared with
test_multiprocess). Each rank sums the tensors holding its parameters, gradients, fp32
master and optimizer state at the optimizer step (``ModelStateMeter`` in nbtrain/worker/measure.py, which
only probe runs install); that must match the estimator's model states for the same inputs within 5%.

GPU: a probe of a ~1B Llama (random weights) with LoRA and QLoRA; ``torch.cuda.max_memory_allocated``
must be within 15% of the estimate's per-device bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.rundir import read_json, read_jsonl
from nbtrain.control.memory import DS_REDUCE_BUCKET, Estimate, estimate
from nbtrain.control.start import probe
from tests.notebook import text_of
from tests.worker.conftest import STEPS

pytestmark = pytest.mark.slow

TOLERANCE = 0.05
# this test's name -> the shared run's name
RUNS = {f"{method}-{strategy}": strategy if method == "lora" else f"full-{strategy}"
        for method in ("lora", "full") for strategy in ("ddp", "zero1", "zero2", "zero3")}  # fmt: skip


def train_end(run: nbtrain.Run) -> list[dict[str, Any]]:
    ends = (r for r in read_jsonl(run.paths.system) if r.get("event") == "train_end")
    return sorted(ends, key=lambda r: r["rank"])


def estimate_of(run: nbtrain.Run, model_config: dict[str, Any]) -> Estimate:
    """The estimator's answer for the inputs this run really had (its resolved.json)."""
    resolved = read_json(run.paths.resolved)
    cfg, plan = resolved["config"], resolved["plan"]
    return estimate(
        model_config,
        method=cfg["method"],
        strategy=plan["strategy"],
        world_size=plan["world_size"],
        precision=plan["precision"],
        device=plan["device"],
        lora_r=(cfg.get("lora") or {}).get("r", 8),
        lora_targets=(cfg.get("lora") or {}).get("target_modules", "auto"),
        optim=resolved["train_args"].get("optim", "adamw_torch_fused"),
    )


def expected_parts(est: Estimate) -> dict[str, float]:
    """The estimate's model states split as a rank reports them, as held at the optimizer step (ZeRO-3
    has released its gathered modules then: they are checked apart)."""
    st = est.model_states
    gathered_grads = st.gathered_grads if st is not None else 0.0
    gathered_weights = est.gathered_bytes - gathered_grads
    return {
        "param_bytes": est.parts["weights"] + est.parts["adapters"] - gathered_weights,
        "grad_bytes": est.parts["gradients"] - gathered_grads,
        "master+optimizer_state": est.parts["optimizer"],
        "model_state_bytes": est.model_state_bytes_at_step,
    }


def test_model_states_each_rank_allocates_match_the_estimate(two_rank_runs: dict[str, Any]) -> None:
    runs: dict[str, nbtrain.Run] = {name: two_rank_runs["runs"][shared] for name, shared in RUNS.items()}
    nb = two_rank_runs["notebook"]
    model_config = json.loads((two_rank_runs["work"] / "tiny-llama" / "config.json").read_text())

    rows: list[str] = []
    failures: list[str] = []

    def compare(name: str, rank: int, what: str, measured: float, estimated: float) -> None:
        err = measured / estimated - 1
        rows.append(f"{name:<11} {rank:>4} {what:<23} {measured:>13,.0f} {estimated:>13,.0f} {err:+8.2%}")
        if abs(err) > TOLERANCE:
            failures.append(rows[-1])

    for name, run in runs.items():
        assert run.status().state == "completed", (name, run.logs(40), text_of(nb.cells[-1]))
        ends = train_end(run)
        assert [e["rank"] for e in ends] == [0, 1], name
        est = estimate_of(run, model_config)
        want = expected_parts(est)
        for e in ends:
            assert e["state_samples"] >= STEPS, (name, e)  # measured during the steps, not after them
            got = {
                "param_bytes": e["param_bytes"],
                "grad_bytes": e["grad_bytes"],
                "master+optimizer_state": e["master_bytes"] + e["optimizer_state_bytes"],
                "model_state_bytes": e["model_state_bytes"],
            }
            assert got["model_state_bytes"] == sum(v for k, v in got.items() if k != "model_state_bytes")
            for part, value in got.items():
                compare(name, e["rank"], part, value, want[part])
            if est.inputs["strategy"] == "zero3":
                # The parameters ZeRO-3 kept gathered from forward to backward (released by the step).
                compare(
                    name,
                    e["rank"],
                    "gathered_param_bytes",
                    e["gathered_param_bytes"],
                    est.resident_param_bytes,
                )
                # DeepSpeed's reduce bucket: the fixed size the estimator's overhead counts (fp32 here).
                assert e["bucket_bytes"] == 4 * DS_REDUCE_BUCKET, (name, e)
    print(f"{'run':<11} {'rank':>4} {'bytes':<23} {'measured':>13} {'estimated':>13} {'error':>8}")
    print("\n".join(rows))
    assert not failures, "measured and estimated differ by more than 5%:\n" + "\n".join(failures)

    # What ZeRO is for, as measured: a full fine-tune's states per rank shrink stage by stage.
    full = {s: train_end(runs[f"full-{s}"])[0]["model_state_bytes"] for s in ("ddp", "zero2", "zero3")}
    assert full["zero3"] < full["zero2"] < full["ddp"], full


# ------------------------------------------------------------------------------------------- GPU


def long_text_data(path: Path, rows: int = 64, words: int = 2000) -> Path:
    """Plain-text rows far longer than max_length: every sequence is truncated to exactly max_length,
    the padded length the estimate assumes, so activations are what it counts."""
    rng = random.Random(0)
    vocab = ["one", "two", "three", "plus", "equals", "sum", "number", "add", "the", "is", "of", "and"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(words))}) + "\n")
    return path


def make_1b_llama(path: Path) -> Path:
    """A random-initialised Llama of TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads, 4 KV
    heads, MLP 5632) with the tiny model's tokenizer (vocab ~1000): 0.97B parameters, saved in bf16."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from nbtrain.examples import make_tiny_model

    # Only the tokenizer (and its chat template) is taken from the tiny model, into a fresh directory:
    # a sharded save next to the tiny model's weights would leave both for from_pretrained to find.
    tok = AutoTokenizer.from_pretrained(make_tiny_model(path.parent / "tiny-for-tokenizer"))
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    # Built on the CPU, so this test process never holds GPU memory while the probe measures its own.
    model = LlamaForCausalLM(cfg).bfloat16()  # half the disk and load time; the worker casts as planned
    model.save_pretrained(path)
    return path


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_probe_peak_on_a_gpu_is_within_15_percent_of_the_estimate(method: str, tmp_path: Path) -> None:
    """``torch.cuda.max_memory_allocated`` counts live tensors only: not the CUDA context, nor what the
    caching allocator reserves beyond them. So it is held to the estimate's tensors (every part but
    ``overhead``) within 15%, and must stay under the whole per-device estimate."""
    model = make_1b_llama(tmp_path / "llama-1b")
    data = long_text_data(tmp_path / "data" / "long.jsonl")
    config = f"""\
model: {model}
method: {method}
data:
  train: {data}
  format: text
train:
  max_steps: 20
  per_device_train_batch_size: 4
  max_length: 512
  logging_steps: 1
"""
    report = probe(config, name=f"fit-{method}", steps=5)
    print(report.text())
    assert report.run.status().state == "completed", report.run.logs(40)
    assert report.peak_kind.startswith("GPU"), report.text()
    est = read_json(report.run.paths.resolved)["plan"]["estimate"]
    assert est is not None, "the plan has no estimate"
    tensors = est["per_device_bytes"] - est["parts"]["overhead"]
    err = report.peak_bytes / tensors - 1
    print(f"GPU peak allocated {report.peak_bytes:,} B; estimated tensors {tensors:,} B ({err:+.1%})")
    assert abs(err) <= 0.15, (err, est["parts"], report.text())
    assert report.peak_bytes <= est["per_device_bytes"], report.text()
