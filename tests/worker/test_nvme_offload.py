"""offload: nvme (DeepSpeed ZeRO-Infinity) for real on CPU: a full fine-tune whose parameters and optimizer
state live in files under nvme_path, swapped through DeepSpeed's async I/O (libaio)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import nbtrain
from nbtrain.control.config.facts import async_io_problem
from nbtrain.examples import make_tiny_model

pytestmark = pytest.mark.slow


def test_offload_nvme_trains_with_parameters_and_optimizer_state_in_files_under_nvme_path(
    workdir: Path,
) -> None:
    why = async_io_problem(tuple(sys.path))
    if why is not None:
        pytest.skip(why)
    # DeepSpeed swaps only tensors of 1 MiB or more (MIN_AIO_BYTES): hidden 512 gives fp32 weights of 1-2 MiB.
    make_tiny_model(workdir / "mid-llama", hidden_size=512)
    (workdir / "swap").mkdir()
    text = (
        "model: ./mid-llama\nmethod: full\ndata: {train: data/add.jsonl}\n"
        "train: {max_steps: 3, learning_rate: 1.0e-3, per_device_train_batch_size: 4, logging_steps: 1}\n"
        "distributed: {offload: nvme, nvme_path: swap, num_processes: 1}\n"
    )
    run = nbtrain.finetune(text, name="nvme")
    st = run.wait(timeout=1200)
    assert st.state == "completed" and st.step == 3, run.logs(60)
    loss = run.metrics()["loss"]
    assert loss.notna().all() and loss.iloc[-1] < loss.iloc[0]
    ds = json.loads((run.dir / "deepspeed.json").read_text())["zero_optimization"]
    assert ds["offload_param"]["device"] == ds["offload_optimizer"]["device"] == "nvme"

    swap = workdir / "swap" / "zero_stage_3"
    params = sorted((swap / "float32params" / "rank0").glob("*_param.tensor.swp"))
    assert len(params) >= 10, params  # every weight of 1 MiB or more (norms and smaller stay in RAM)
    optimizer = swap / "optimizer" / "rank0"
    total = _parameters(run.output_dir)
    # Adam's two moments of every parameter, fp32, in one sub-group file each (sizes aligned for O_DIRECT)
    for moment in ("exp_avg", "exp_avg_sq"):
        (f,) = optimizer.glob(f"{moment}-*.tensor.swp")
        assert 4 * total <= f.stat().st_size < 4 * total + 2**20, (f, total)


def _parameters(output: Path) -> int:
    """Parameters of the saved model (it loads: ZeRO-3 gathered it whole for output/)."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(output).parameters())
