"""Plans for an Apple MPS GPU and Ascend NPUs, from hardware facts given as input (no such device here):
the device, precision and process count the planner picks, and what prepare refuses there, with why."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from nbtrain.control.memory import GiB
from nbtrain.control.plan.planner import make_plan, train_args
from nbtrain.control.prepare import prepare
from nbtrain.hardware import Accelerator, Hardware
from nbtrain.ui.estimate_chart import device_labels, estimate
from tests.conftest import lora_yaml

CONFIGS = Path(__file__).resolve().parent.parent.parent / "fixtures" / "model_configs"


def mac(macos: str = "14.5", ram_gib: int = 16) -> Hardware:
    major, minor = (int(x) for x in macos.split(".")[:2])
    acc = Accelerator("mps", 1, f"Apple silicon GPU (MPS), macOS {macos}", ram_gib * GiB, (major, minor))
    return Hardware(cpu_count=8, ram_total=ram_gib * GiB, ram_available=ram_gib * GiB // 2, accelerator=acc)


def ascend(n: int = 8) -> Hardware:
    acc = Accelerator("npu", n, f"Ascend NPU x{n} (torch_npu 2.5.1)")
    return Hardware(cpu_count=192, ram_total=1536 * GiB, ram_available=1400 * GiB, accelerator=acc)


def refusal(text: str, hw: Hardware) -> str:
    with pytest.raises(ConfigError) as e:
        prepare(text, hardware=hw)
    return str(e.value)


def test_a_mac_trains_one_process_on_mps_in_fp32_unless_asked(workdir: Path) -> None:
    res = load_config(lora_yaml())
    plan = make_plan(res, mac())
    assert (plan.device, plan.num_processes, plan.strategy, plan.launcher) == ("mps", 1, "none", "direct")
    assert plan.precision == "fp32" and any("ask precision: fp16" in r for r in plan.reasons)
    assert any("untested on a Mac's GPU" in r for r in plan.reasons)
    args = train_args(res, plan)
    # transformers picks mps itself when use_cpu is off; nothing is pinned for a GPU that shares the RAM
    assert "use_cpu" not in args and args["dataloader_pin_memory"] is False
    assert args["bf16"] is False and args["fp16"] is False
    plan16 = make_plan(load_config(lora_yaml() + "precision: fp16\n"), mac())
    assert plan16.precision == "fp16" and not any("fp16" in w for w in plan16.warnings)


def test_bf16_on_mps_is_refused_before_macos_14_and_warned_about_after(workdir: Path) -> None:
    text = lora_yaml() + "precision: bf16\n"
    msg = refusal(text, mac("13.6"))
    assert "precision" in msg and "macOS 14" in msg and "macOS 13.6" in msg and "fp16" in msg
    prep = prepare(text, hardware=mac("14.5"))
    assert prep.plan.precision == "bf16" and "emulated" in prep.plan.warnings[0]


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ("method: qlora\n", "method", ["bitsandbytes", "method: lora"]),
        ("distributed: {strategy: zero3}\n", "strategy", ["DeepSpeed", "strategy: none"]),
        ("distributed: {offload: optimizer}\n", "offload", ["DeepSpeed", "gloo"]),
        ("distributed: {strategy: ddp, num_processes: 2}\n", "strategy", ["one GPU", "num_processes: 1"]),
    ],
)
def test_a_mac_refuses_what_mps_cannot_run_with_the_fix(
    workdir: Path, extra: str, key: str, words: list[str]
) -> None:
    text = lora_yaml().replace("method: lora\n", "") + extra
    msg = refusal(text, mac())
    assert key in msg and "not offered on mps" in msg, msg
    assert all(w in msg for w in words), msg


def test_method_auto_on_mps_is_lora_and_says_why_not_qlora(workdir: Path) -> None:
    plan = make_plan(load_config(lora_yaml(method="auto")), mac())
    assert plan.method == "lora" and any("QLoRA is not offered on mps" in r for r in plan.reasons)


def test_an_mps_run_is_measured_against_the_ram_it_shares(workdir: Path) -> None:
    text = (
        f"model: {CONFIGS / 'Qwen2.5-0.5B'}\nmethod: full\ndata: {{train: data/add.jsonl}}\n"
        "train: {max_length: 512, per_device_train_batch_size: 2}\n"
    )
    prep = prepare(text, hardware=mac(ram_gib=8))  # 4 GiB of it free
    assert prep.plan.estimate is not None and prep.plan.estimate["device"] == "mps"
    assert prep.plan.estimate["capacity_bytes"] == 8 * GiB and not prep.plan.fits
    assert "in RAM, 4.0 GiB usable of 8.0 GiB" in prep.plan.fit_advice
    assert "Smallest change that fits: method: lora" in prep.plan.fit_advice
    summary = prep.summary()
    assert "on mps" in summary and "of RAM of 8.0 GiB" in summary
    report = estimate(text, hardware=mac(ram_gib=8))
    rows = {(r["method"], r["strategy"]): r["fits"] for r in report.table}
    assert rows == {("full", "none"): False, ("lora", "none"): True}  # no QLoRA row on MPS
    full = next(r for r in report.table if r["method"] == "full")
    assert full["why"].endswith(": use lora")  # not ZeRO or offload, which MPS does not offer
    assert all(r["device"].startswith("Apple silicon GPU") for r in report.table)
    est, _ = prep.memory() or (None, None)
    assert est is not None and device_labels(est) == ["MPS GPU 0"]


def test_ascend_npus_train_with_ddp_over_all_of_them_in_bf16(workdir: Path) -> None:
    res = load_config(lora_yaml())
    plan = make_plan(res, ascend(8))
    assert (plan.device, plan.num_processes, plan.strategy, plan.launcher) == ("npu", 8, "ddp", "torchrun")
    assert plan.precision == "bf16" and any("910B" in r for r in plan.reasons)
    assert any("untested on an Ascend NPU" in r for r in plan.reasons)
    args = train_args(res, plan)
    assert "use_cpu" not in args and "ddp_backend" not in args  # accelerate picks HCCL for npu itself
    assert args["bf16"] is True
    one = make_plan(load_config(lora_yaml() + "distributed: {strategy: none}\n"), ascend(8))
    assert (one.num_processes, one.launcher) == (1, "direct")


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ("method: qlora\n", "method", ["no Ascend backend", "method: lora"]),
        ("distributed: {strategy: zero2}\n", "strategy", ["DeepSpeed", "strategy: ddp"]),
        ("distributed: {strategy: zero3, offload: optimizer+params}\n", "offload", ["CANN"]),
    ],
)
def test_ascend_refuses_qlora_and_deepspeed_with_the_fix(
    workdir: Path, extra: str, key: str, words: list[str]
) -> None:
    text = lora_yaml().replace("method: lora\n", "") + extra
    msg = refusal(text, ascend())
    assert key in msg and "not offered on npu" in msg, msg
    assert all(w in msg for w in words), msg


def test_an_npu_estimate_is_shown_per_npu_and_not_checked_against_an_unread_size(workdir: Path) -> None:
    text = (
        f"model: {CONFIGS / 'Qwen2.5-7B'}\nmethod: full\ndata: {{train: data/add.jsonl}}\n"
        "train: {max_length: 512, per_device_train_batch_size: 2}\n"
    )
    prep = prepare(text, hardware=ascend(8))
    assert prep.plan.fits and prep.plan.estimate is not None and prep.plan.estimate["device"] == "npu"
    assert "GiB per NPU (size not known)" in prep.summary()
    rows = estimate(text, hardware=ascend(8)).table
    assert {(r["method"], r["strategy"], r["world_size"]) for r in rows} == {
        ("full", "none", 1), ("full", "ddp", 8), ("lora", "none", 1), ("lora", "ddp", 8)
    }  # fmt: skip
    assert all(r["reason"].startswith("fits as far as known") for r in rows)
    est, _ = prep.memory() or (None, None)
    assert est is not None and device_labels(est)[0] == "NPU 0"


def test_what_the_device_refuses_and_what_the_batch_rules_refuse_come_in_one_error(workdir: Path) -> None:
    from nbtrain.examples import write_dataset

    write_dataset(workdir / "data" / "unpaired.jsonl", "unpaired", n=16)
    text = (
        "model: ./tiny-llama\nmethod: qlora\nobjective: kto\ndata: {train: data/unpaired.jsonl}\n"
        "train: {max_steps: 2, per_device_train_batch_size: 1}\n"
    )
    with pytest.raises(ConfigError) as e:
        prepare(text, hardware=mac())
    messages = [p.render() for p in e.value.problems]
    assert len(messages) == 2, messages
    assert any("method: qlora is not offered on mps" in m for m in messages)
    assert any("per_device_train_batch_size of 2 or more" in m for m in messages)
