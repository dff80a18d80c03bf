"""The estimator applied to configs and machines: a config's training shape, the planned estimate, and the
comparison table of every method x strategy (judged by the one fit rule)."""

from __future__ import annotations

import json
from pathlib import Path

from nbtrain.control.config.schema import RunConfig
from nbtrain.control.memory import GiB, Request, lora_parameters
from nbtrain.control.plan.estimates import compare_table, request_for
from nbtrain.control.plan.planner import Plan, estimate_for
from nbtrain.hardware import GPU, Hardware

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "model_configs"
LLAMA3 = json.loads((CONFIGS / "Meta-Llama-3-8B" / "config.json").read_text())
QWEN_SMALL = json.loads((CONFIGS / "Qwen2.5-0.5B" / "config.json").read_text())


def h100s(n: int, ram_gib: int = 1024) -> Hardware:
    gpu = GPU(0, "NVIDIA H100 80GB HBM3", 80 * GiB, 79 * GiB, (9, 0))
    return Hardware(gpus=[gpu] * n, cpu_count=64, ram_total=ram_gib * GiB, ram_available=ram_gib * GiB)


def test_estimate_for_reads_the_config_and_the_plan() -> None:
    config = RunConfig.model_validate(
        {
            "model": "m",
            "method": "lora",
            "data": {"train": "d.jsonl"},
            "train": {"per_device_train_batch_size": 2, "max_length": 4096, "optim": "adamw_8bit"},
            "lora": {"r": 16, "target_modules": "all-linear"},
        }
    )
    plan = Plan(device="cuda", num_processes=4, launcher="deepspeed", precision="bf16", strategy="zero2")
    est = estimate_for(config, plan, LLAMA3)
    assert est.inputs["micro_batch"] == 2 and est.inputs["seq_len"] == 4096
    assert est.inputs["world_size"] == 4 and est.inputs["strategy"] == "zero2"
    assert est.trainable_params == lora_parameters(LLAMA3, 16, "all-linear")
    assert est.inputs["optim"] == "adamw_8bit"


def test_estimate_for_a_batch_left_to_auto_uses_the_planned_micro_batch() -> None:
    config = RunConfig.model_validate(
        {"model": "m", "data": {"train": "d.jsonl"}, "train": {"per_device_train_batch_size": "auto"}}
    )
    plan = Plan(device="cuda", num_processes=1, launcher="direct", precision="bf16", micro_batch=16)
    assert estimate_for(config, plan, LLAMA3).inputs["micro_batch"] == 16


def test_request_for_a_config_keeps_trls_defaults_and_leaves_checkpointing_to_the_rule() -> None:
    config = RunConfig.model_validate({"model": "m", "data": {"train": "d.jsonl"}})
    req = request_for(config, "bf16")
    assert (req.micro_batch, req.seq_len, req.gradient_checkpointing, req.optim) == (
        8, 1024, None, "adamw_torch_fused",
    )  # fmt: skip
    given = RunConfig.model_validate(
        {"model": "m", "data": {"train": "d.jsonl"}, "train": {"gradient_checkpointing": False}}
    )
    assert request_for(given, "bf16").gradient_checkpointing is False


def test_the_table_counts_checkpointing_off_where_a_row_fits_without_it() -> None:
    from nbtrain.hardware import GPU, Hardware

    a100 = Hardware(gpus=[GPU(0, "NVIDIA A100-SXM4-80GB", 80 * 2**30, 79 * 2**30, (8, 0))], cpu_count=8,
                    ram_total=256 * 2**30, ram_available=240 * 2**30)  # fmt: skip
    config = RunConfig.model_validate({"model": "m", "data": {"train": "d.jsonl"}})
    rows = {(r["method"], r["strategy"], r["offload"]): r for r in
            compare_table(LLAMA3, a100, request_for(config, "bf16", micro_batch=1))}  # fmt: skip
    on = {(r["method"], r["strategy"], r["offload"]): r
          for r in compare_table(LLAMA3, a100, Request(micro_batch=1))}  # fmt: skip
    lora = ("lora", "none", "none")
    assert rows[lora]["fits"] and rows[lora]["per_device_bytes"] > on[lora]["per_device_bytes"]  # off: more
    full = ("full", "none", "none")  # fits neither way: counted as it would run, with checkpointing
    assert not rows[full]["fits"] and rows[full]["per_device_bytes"] == on[full]["per_device_bytes"]


# ----------------------------------------------------------------------------------- comparison table


def test_table_on_one_gpu_compares_every_method_without_ddp() -> None:
    rows = compare_table(LLAMA3, h100s(1))
    combos = {(r["method"], r["strategy"], r["offload"]) for r in rows}
    assert not any(s == "ddp" for _, s, _ in combos)
    assert ("qlora", "zero3", "none") not in combos
    assert {m for m, _, _ in combos} == {"full", "lora", "qlora"}
    by = {(r["method"], r["strategy"], r["offload"]): r for r in rows}
    assert by[("qlora", "none", "none")]["fits"]
    full = by[("full", "none", "none")]
    assert not full["fits"]
    assert full["why"].startswith(full["reason"]) and "optimizer is the largest part" in full["why"]
    assert all(r["world_size"] == 1 for r in rows)


def test_table_on_eight_gpus_shards_a_full_fine_tune_to_fit() -> None:
    rows = compare_table(LLAMA3, h100s(8), Request(micro_batch=1))
    by = {(r["method"], r["strategy"], r["offload"]): r for r in rows}
    assert by[("full", "ddp", "none")]["world_size"] == 8
    assert not by[("full", "ddp", "none")]["fits"]
    assert by[("full", "zero3", "none")]["fits"]
    assert by[("full", "zero3", "none")]["why"].startswith("fits")


def test_table_flags_host_ram_that_cannot_hold_the_offloaded_state() -> None:
    rows = compare_table(LLAMA3, h100s(1, ram_gib=64))
    row = next(
        r for r in rows if (r["method"], r["strategy"], r["offload"]) == ("full", "zero3", "optimizer")
    )
    assert not row["fits"]
    assert "host RAM" in row["why"]


def test_table_without_gpu_measures_single_processes_against_ram() -> None:
    hw = Hardware(gpus=[], cpu_count=2, ram_total=24 * GiB, ram_available=20 * GiB)
    rows = compare_table(QWEN_SMALL, hw, Request(micro_batch=1, seq_len=256))
    assert {r["strategy"] for r in rows} == {"none"}
    assert all(r["device"] == "CPU RAM" for r in rows)
    assert all(r["fits"] for r in rows)
