"""The one fit rule: min(total x (1 - MARGIN), available now), per GPU and for the node's RAM."""

from __future__ import annotations

import json
from pathlib import Path

from nbtrain.control.memory import GiB, estimate
from nbtrain.control.plan.fit import MARGIN, fits, usable
from nbtrain.hardware import GPU, Hardware

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "model_configs"
LLAMA3 = json.loads((CONFIGS / "Meta-Llama-3-8B" / "config.json").read_text())
QWEN_SMALL = json.loads((CONFIGS / "Qwen2.5-0.5B" / "config.json").read_text())


def a100(free_gib: float = 79) -> GPU:
    return GPU(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, int(free_gib * GiB), (8, 0))


def machine(*gpus: GPU, ram: float = 256, ram_free: float = 240) -> Hardware:
    return Hardware(
        gpus=list(gpus), cpu_count=16, ram_total=int(ram * GiB), ram_available=int(ram_free * GiB)
    )


def test_usable_is_the_total_less_the_margin_but_never_more_than_is_free() -> None:
    assert usable(100 * GiB, 99 * GiB) == int(100 * GiB * (1 - MARGIN))
    assert usable(100 * GiB, 30 * GiB) == 30 * GiB
    assert usable(100 * GiB, 0) == int(100 * GiB * (1 - MARGIN))  # free memory not reported


def test_an_idle_gpu_fits_up_to_the_margin() -> None:
    est = estimate(LLAMA3, method="qlora", micro_batch=2)
    fit = fits(est, machine(a100()))
    assert fit.ok and fit.capacity == 80 * GiB and fit.usable == int(80 * GiB * (1 - MARGIN))
    assert fit.why.startswith(f"fits: {est.per_device_bytes / GiB:.1f} GiB of 80.0 GiB per GPU")


def test_memory_another_process_holds_is_not_counted_on_and_is_named() -> None:
    est = estimate(LLAMA3, method="lora", micro_batch=2)  # ~20 GiB
    assert fits(est, machine(a100())).ok
    busy = fits(est, machine(a100(free_gib=10)))
    assert not busy.ok and busy.usable == 10 * GiB
    assert "10.0 GiB usable of 80.0 GiB" in busy.why and "other processes hold 70.0 GiB of it now" in busy.why


def test_host_ram_is_checked_for_a_gpu_run_against_what_is_available() -> None:
    est = estimate(LLAMA3, method="full", strategy="zero3", offload="optimizer", world_size=1)
    assert fits(est, machine(a100(), ram=1024, ram_free=1000)).ok
    fit = fits(est, machine(a100(), ram=1024, ram_free=40))
    assert not fit.ok and fit.host_usable == 40 * GiB
    assert fit.why.startswith("GPU fits") and "host RAM needs" in fit.why


def test_a_cpu_runs_processes_share_the_ram() -> None:
    one = estimate(QWEN_SMALL, method="lora", device="cpu", precision="fp32", micro_batch=1, seq_len=256)
    two = estimate(
        QWEN_SMALL, method="lora", strategy="ddp", world_size=2, device="cpu", precision="fp32",
        micro_batch=1, seq_len=256,
    )  # fmt: skip
    ram = (one.per_device_bytes + two.per_device_bytes) / GiB  # room for one process of either, not two
    hw = Hardware(cpu_count=2, ram_total=int(ram / (1 - MARGIN) * GiB) + GiB, ram_available=int(ram * GiB))
    assert fits(one, hw).ok
    fit = fits(two, hw)
    assert not fit.ok and fit.need == 2 * two.per_device_bytes
    assert "(2 processes x" in fit.why


def test_a_machine_that_reports_no_memory_size_is_not_refused() -> None:
    fit = fits(estimate(QWEN_SMALL, method="lora", device="cpu", precision="fp32"), Hardware())
    assert fit.ok and "reports no memory size" in fit.why
