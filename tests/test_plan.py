from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.config import load_config
from nbtrain.hardware import GPU, Hardware, probe
from nbtrain.plan import make_plan, train_args
from tests.conftest import lora_yaml

T4 = GPU(0, "Tesla T4", 16 * 2**30, 15 * 2**30, (7, 5))
A100 = GPU(0, "NVIDIA A100-SXM4-80GB", 80 * 2**30, 79 * 2**30, (8, 0))


@pytest.mark.parametrize(
    ("gpus", "precision", "device", "want"),
    [
        ([], "auto", "cpu", "fp32"),
        ([T4], "auto", "cuda", "fp16"),  # no native bf16 before compute capability 8.0
        ([A100], "auto", "cuda", "bf16"),
        ([A100], "fp32", "cuda", "fp32"),
    ],
)
def test_device_and_precision_follow_the_hardware(
    workdir: Path, gpus: list[GPU], precision: str, device: str, want: str
) -> None:
    res = load_config(lora_yaml() + f"precision: {precision}\n")
    plan = make_plan(res, Hardware(gpus=gpus, cpu_count=2))
    assert (plan.device, plan.precision, plan.num_processes) == (device, want, 1)
    assert plan.reasons


def test_bf16_on_a_card_without_it_warns(workdir: Path) -> None:
    plan = make_plan(load_config(lora_yaml() + "precision: bf16\n"), Hardware(gpus=[T4]))
    assert plan.precision == "bf16" and "no native bf16" in plan.warnings[0]


def test_hf_style_bf16_flag_counts_as_a_precision_request(workdir: Path) -> None:
    plan = make_plan(load_config(lora_yaml(extra="  bf16: true\n")), Hardware(gpus=[A100]))
    assert plan.precision == "bf16"


def test_train_args_fill_notebook_defaults_but_user_keys_win(workdir: Path) -> None:
    res = load_config(lora_yaml(extra="  report_to: tensorboard\n"))
    args = train_args(res, make_plan(res, Hardware()))
    assert args["use_cpu"] is True and args["bf16"] is False
    assert args["report_to"] == "tensorboard" and args["logging_steps"] == 1
    assert args["include_num_input_tokens_seen"] == "non_padding"
    assert "eval_strategy" not in args


def test_probe_finds_no_gpu_here_without_touching_cuda() -> None:
    hw = probe()
    assert hw.cpu_count >= 1 and hw.ram_total > 0
    if not hw.gpus:
        assert hw.nvml_error
