"""The memory estimate against GPU peaks others have published (tests/fixtures/published_peaks.json): LitGPT's
resource tables and config hub, torchtune's README. Each case is a job as its source states it (model,
method, rank and targets, micro-batch, sequence length, checkpointing, precision, quantisation), estimated
from the model's config.json, and must lie within its tolerance of the measured peak: 15%, or wider where
the case says in writing what the estimator cannot know. Published rows that are not a job nbtrain's
estimate describes are listed with the reason (pure-bf16 full fine-tunes, torchao's NF4, activation
offloading, a peak taken over evaluation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nbtrain.control.memory import estimate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DATA = json.loads((FIXTURES / "published_peaks.json").read_text())
CASES: list[dict[str, Any]] = DATA["cases"]


def tensor_bytes(case: dict[str, Any]) -> float:
    """The estimate in the source's own counter: allocated (live tensor) bytes are the estimate less its
    overhead part (the CUDA context and the allocator's reserve, which no allocated counter sees)."""
    config = json.loads((FIXTURES / "model_configs" / case["config"] / "config.json").read_text())
    est = estimate(config, **case["estimate"])
    return est.per_device_bytes - est.parts["overhead"]


def test_at_least_eight_published_measurements_from_three_sources_are_held_to_15_percent() -> None:
    strict = [c for c in CASES if c["tolerance"] == 0.15]
    assert len(strict) >= 8, [c["id"] for c in strict]
    assert len({c["source"].split(":")[0] for c in CASES}) >= 2  # LitGPT and torchtune
    assert len({c["source"].split("@")[0] for c in CASES}) >= 3  # three tables
    for c in CASES:
        assert c["source"] and c["where"] and c["measured_bytes"] > 0
        assert c["tolerance"] == 0.15 or len(c.get("why", "")) > 80, (
            f"{c['id']}: a wider tolerance needs its reason"
        )
    for n in DATA["not_compared"]:
        assert n["source"] and len(n["why"]) > 40, n


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_estimate_is_within_its_tolerance_of_the_published_peak(case: dict[str, Any]) -> None:
    ratio = tensor_bytes(case) / case["measured_bytes"]
    assert abs(ratio - 1) <= case["tolerance"], (
        f"{case['id']}: estimate {tensor_bytes(case) / 2**30:.2f} GiB against {case['measured']} measured "
        f"({ratio:.2f}x; {case['source']})"
    )


def test_the_published_cases_would_catch_an_estimator_that_drifts(monkeypatch: pytest.MonkeyPatch) -> None:
    """An activation model a third too high takes several cases out of their tolerance: the test is not
    loose enough to pass whatever the estimator says."""
    from nbtrain.control.memory import estimator as est_module

    original = est_module.activation_bytes

    def off_by_a_third(*args: Any, **kwargs: Any) -> float:
        return 1.34 * original(*args, **kwargs)

    monkeypatch.setattr(est_module, "activation_bytes", off_by_a_third)
    out = [c["id"] for c in CASES if abs(tensor_bytes(c) / c["measured_bytes"] - 1) > c["tolerance"]]
    assert len(out) >= 4, out


def test_the_qlora_papers_65b_on_one_48_gb_card_holds_by_the_estimates_parts() -> None:
    """The QLoRA paper's claim (artidoro/qlora README; scripts/finetune_guanaco_65b.sh for the settings: NF4
    with double quantisation, LoRA r 64 on every linear layer, micro-batch 1, prompts of at most 16 and
    answers of at most 512 tokens, gradient checkpointing, paged 32-bit AdamW): a 65B fine-tunes on one 48 GB
    GPU. nbtrain's own recipe for the job does not fit there: it keeps the 800M adapter parameters and their
    gradients in fp32 (peft's default) and counts the optimizer's states on the GPU. The paper's recipe casts
    the adapters to bf16 (qlora.py) and pages the optimizer's states out to host memory when the GPU runs
    short; counted from the same estimate's parts, that is under 48 GB."""
    config = json.loads((FIXTURES / "model_configs" / "llama-65b" / "config.json").read_text())
    est = estimate(
        config, method="qlora", lora_r=64, lora_targets="all-linear", double_quant=True, precision="bf16",
        micro_batch=1, seq_len=16 + 512, gradient_checkpointing=True, optim="paged_adamw_32bit",
        device="cuda",
    )  # fmt: skip
    p = est.parts
    assert 800e6 > est.trainable_params > 790e6
    assert est.per_device_bytes > 48e9, est.explain()  # nbtrain's recipe: fp32 adapters, states on the GPU
    papers = est.per_device_bytes - p["optimizer"] - (p["adapters"] + p["gradients"]) / 2
    assert 40e9 < papers < 48e9, est.explain()
