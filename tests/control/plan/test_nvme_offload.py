"""offload: nvme (DeepSpeed ZeRO-Infinity), kernel side: what the config must give (zero3, an nvme_path on a
filesystem that takes O_DIRECT, libaio), the DeepSpeed JSON written for it, and the estimate (the offloaded
state on disk, pinned swap buffers in RAM). The real run is tests/worker/test_nvme_offload.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.facts import nvme_path_problem
from nbtrain.control.config.load import load_config
from nbtrain.control.memory import (
    NVME_OPTIMIZER_BUFFERS,
    NVME_PARAM_BUFFERS,
    NVME_SUB_GROUP,
    GiB,
    count_parameters,
    estimate,
)
from nbtrain.control.prepare import prepare
from nbtrain.hardware import GPU, Hardware
from tests.conftest import lora_yaml

CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "model_configs"
LLAMA3 = json.loads((CONFIGS / "Meta-Llama-3-8B" / "config.json").read_text())
A100S = Hardware(
    gpus=[GPU(i, "NVIDIA A100-SXM4-80GB", 80 * GiB, 79 * GiB, (8, 0)) for i in range(4)],
    ram_total=512 * GiB,
    ram_available=500 * GiB,
)


def nvme_yaml(extra: str) -> str:
    return lora_yaml(method="full") + f"distributed:\n{extra}"


def problems(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(text)
    return str(e.value)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("  offload: nvme\n", ["needs nvme_path", "fast local disk"]),
        ("  offload: nvme\n  strategy: zero2\n  nvme_path: swap\n", ["needs strategy: zero3"]),
        ("  offload: nvme\n  nvme_path: no-such-folder\n", ["does not exist", "mkdir -p"]),
        ("  offload: optimizer+params\n  strategy: zero3\n  nvme_path: swap\n", ["only with offload: nvme"]),
    ],
)
def test_offload_nvme_refuses_what_zero_infinity_cannot_use_with_the_fix(
    workdir: Path, extra: str, words: list[str]
) -> None:
    (workdir / "swap").mkdir()
    msg = problems(nvme_yaml(extra))
    assert all(w in msg for w in words), msg


def test_nvme_path_must_be_a_folder_and_a_local_disk_passes(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    msg = nvme_path_problem(tmp_path / "file")
    assert msg is not None and "is not a folder" in msg
    assert nvme_path_problem(tmp_path) is None  # ext4 here: writable, and it opens files with O_DIRECT
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the probe file is gone


def test_offload_nvme_writes_zero_infinity_into_the_deepspeed_json(workdir: Path) -> None:
    (workdir / "swap").mkdir()
    prep = prepare(nvme_yaml("  offload: nvme\n  nvme_path: swap\n  num_processes: 2\n"))
    plan, ds = prep.plan, prep.plan.deepspeed
    assert (plan.strategy, plan.offload, plan.launcher) == ("zero3", "nvme", "torchrun")  # auto -> zero3
    assert ds is not None
    zero, swap = ds["zero_optimization"], str(workdir / "swap")
    largest = count_parameters(
        json.loads((workdir / "tiny-llama" / "config.json").read_text())
    ).largest_module
    assert zero["offload_param"] == {
        "device": "nvme", "nvme_path": swap, "pin_memory": False,
        "buffer_count": NVME_PARAM_BUFFERS, "buffer_size": -(-largest // 2),
    }  # fmt: skip
    assert zero["offload_optimizer"] == {
        "device": "nvme", "nvme_path": swap, "pin_memory": False, "buffer_count": NVME_OPTIMIZER_BUFFERS
    }  # fmt: skip
    assert zero["sub_group_size"] == NVME_SUB_GROUP and ds["aio"]["block_size"] == 2**20
    assert ds["optimizer"]["type"] == "AdamW"  # DeepSpeed's CPU Adam steps the swapped-in state
    assert prep.resolved.config.distributed.nvme_path == swap  # absolute for the worker
    assert "disk ~" in prep.summary()


def test_the_nvme_estimate_moves_the_offloaded_state_to_disk_and_counts_the_swap_buffers() -> None:
    host = estimate(LLAMA3, method="full", strategy="zero3", offload="optimizer+params", world_size=8)
    disk = estimate(LLAMA3, method="full", strategy="zero3", offload="nvme", world_size=8)
    assert disk.parts == host.parts  # the devices hold the same
    assert disk.disk_parts == host.cpu_parts and disk.disk_bytes == sum(host.cpu_parts.values()) > 100 * GiB
    pc = count_parameters(LLAMA3)
    buffers = {
        "weights": NVME_PARAM_BUFFERS * -(-pc.largest_module // 8) * 2 * 8,  # bf16 partitions, 8 ranks
        "optimizer": NVME_OPTIMIZER_BUFFERS * NVME_SUB_GROUP * 4 * 8,  # fp32 sub-groups
    }
    assert disk.cpu_parts == buffers
    assert disk.cpu_bytes < host.cpu_bytes / 4 and "pinned NVMe swap buffers" in disk.details["cpu"]
    assert "disk per node" in disk.explain() and disk.to_dict()["disk_bytes"] == disk.disk_bytes
    lora = estimate(LLAMA3, method="lora", strategy="zero3", offload="nvme", world_size=8)
    assert lora.disk_parts["weights"] > 10 * GiB  # the frozen base's partitions are swapped too


def test_an_nvme_plan_on_gpus_fits_in_less_host_ram_than_parameter_offload(workdir: Path) -> None:
    (workdir / "swap").mkdir()
    text = (
        f"model: {CONFIGS / 'Meta-Llama-3-8B'}\nmethod: full\ndata: {{train: data/add.jsonl}}\n"
        "train: {max_length: 512, per_device_train_batch_size: 1}\n"
        "distributed: {strategy: zero3, offload: OFFLOAD, nvme_path: swap}\n"
    )
    nvme = prepare(text.replace("OFFLOAD", "nvme"), hardware=A100S)
    ram = prepare(
        text.replace("OFFLOAD", "optimizer+params").replace(", nvme_path: swap", ""), hardware=A100S
    )
    assert nvme.plan.estimate is not None and ram.plan.estimate is not None
    assert nvme.plan.estimate["per_device_bytes"] == ram.plan.estimate["per_device_bytes"]
    assert nvme.plan.estimate["cpu_bytes"] < ram.plan.estimate["cpu_bytes"]
    assert nvme.plan.estimate["disk_bytes"] == sum(ram.plan.estimate["cpu_parts"].values())
    assert (
        nvme.plan.deepspeed is not None
        and nvme.plan.deepspeed["zero_optimization"]["offload_param"]["pin_memory"]
    )
