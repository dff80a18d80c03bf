"""Real multi-process runs on CPU (2 ranks over gloo) of the tiny model, started from notebook cells
(%%finetune, and nbtrain.control.start for the probe runs that test_memory_measured also reads: the
shared two_rank_runs of tests/worker/conftest.py).

The runs start at the same moment from one notebook, which also shows that concurrent runs get distinct
rendezvous ports and do not interfere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import nbtrain
from nbtrain.contract.rundir import read_jsonl
from nbtrain.control.launch import process
from tests.conftest import lora_yaml
from tests.notebook import text_of
from tests.worker.conftest import STEPS

pytestmark = pytest.mark.slow


def train_end(run: nbtrain.Run) -> list[dict]:
    return sorted(
        (r for r in read_jsonl(run.paths.system) if r.get("event") == "train_end"), key=lambda r: r["rank"]
    )


def adapter(run: nbtrain.Run) -> dict[str, torch.Tensor]:
    return load_file(run.output_dir / "adapter_model.safetensors")


def test_every_strategy_completes_from_a_cell_with_ranks_in_agreement(two_rank_runs: dict[str, Any]) -> None:
    runs: dict[str, nbtrain.Run] = two_rank_runs["runs"]
    nb = two_rank_runs["notebook"]
    for name, run in runs.items():
        assert run.status().state == "completed", (name, run.logs(40), text_of(nb.cells[-1]))
        ends = train_end(run)
        assert [e["rank"] for e in ends] == [0, 1], name
        assert ends[0]["trainable_sha256"] == ends[1]["trainable_sha256"], f"{name}: ranks disagree"
        assert run.output_dir.is_dir() and not (run.dir / "output.partial").exists()
        assert len(list(run.dir.glob("output*"))) == 1  # saved once
        assert {0, 1} <= {r["rank"] for r in read_jsonl(run.paths.system)}  # memory from every rank
        m = run.metrics()
        assert m["step"].max() == STEPS and m["loss"].notna().all()

    # ZeRO-3 partitions: each rank holds about half of the parameters.
    for name in ("zero3", "zero3-offload", "full-zero3"):
        for e in train_end(runs[name]):
            assert abs(e["param_numel_local"] / e["param_numel_full"] - 0.5) < 0.05, (name, e)
    for name in ("ddp", "zero1", "zero2"):
        e = train_end(runs[name])[0]
        assert e["param_numel_local"] == e["param_numel_full"]
    # ZeRO-1/2 partition the optimizer state: half of what DDP holds per rank.
    ddp_opt = train_end(runs["ddp"])[0]["optimizer_state_bytes"]
    assert abs(train_end(runs["zero2"])[0]["optimizer_state_bytes"] / ddp_opt - 0.5) < 0.05

    # The same data, seed and steps give the same adapter whatever the strategy or launcher.
    ref = adapter(runs["ddp"])
    for name in ("zero1", "zero2", "zero3", "zero3-offload", "zero2-accelerate", "two-nodes"):
        other = adapter(runs[name])
        assert other.keys() == ref.keys()
        diff = max(float((other[k] - ref[k]).abs().max()) for k in ref)
        assert diff < 1e-4, (name, diff)

    # Written to the run dir, visible and copyable: the DeepSpeed JSON and the accelerate config.
    ds = json.loads((runs["zero3"].dir / "deepspeed.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["train_batch_size"] == 4 * 2
    assert (runs["zero2-accelerate"].dir / "accelerate.yaml").exists()
    # Distinct rendezvous ports for runs started together.
    ports = [process.read_launch(r.paths)["port"] for r in runs.values()]  # type: ignore[index]
    assert len(set(ports)) == len(ports)
    # DeepSpeed's CPU all-reduce buffers (67 MB of RAM per rank in /dev/shm) do not outlive the runs.
    left = [
        p.name
        for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")
        if int(p.name.split("_")[-2]) in ports
    ]
    assert left == []

    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    for name in ("zero3", "qlora-ddp"):
        AutoPeftModelForCausalLM.from_pretrained(runs[name].output_dir)
    full = AutoModelForCausalLM.from_pretrained(runs["full-zero3"].output_dir)
    assert sum(p.numel() for p in full.parameters()) == train_end(runs["full-zero3"])[0]["param_numel_full"]


def test_stopping_a_two_rank_run_stops_every_rank_after_the_same_step(workdir: Path) -> None:
    body = lora_yaml(100_000).replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000")
    run = nbtrain.finetune(body + "distributed:\n  strategy: ddp\n", name="stop-ddp")
    deadline = time.monotonic() + 240
    while run.status().step < 3:
        assert time.monotonic() < deadline, run.logs(40)
        assert not run.status().done, run.logs(40)
        time.sleep(0.3)
    st = run.stop(timeout=120)
    assert st.state == "stopped"
    info = process.read_launch(run.paths)
    assert info is not None and not process.group_alive(info)
    ckpt = list(run.paths.checkpoints.glob("checkpoint-*"))
    assert len(ckpt) == 1 and int(ckpt[0].name.split("-")[1]) == st.step
    for r in (0, 1):
        assert "nbtrain worker: stopped" in run.paths.rank_log(r).read_text()
