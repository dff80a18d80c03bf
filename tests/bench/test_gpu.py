"""bench/gpu.py, the GPU section: its CPU rehearsal runs the whole pipeline (build the model, nbtrain's
auto plan and the hand-written TRL script, LoRA and QLoRA) so the script that only a GPU machine runs
for real is known to work before one is lent."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_RESULTS = ROOT / "bench" / "results" / "gpu.json"


def gpu_present() -> bool:
    from nbtrain.hardware import probe

    return bool(probe().gpus)


@pytest.mark.slow
def test_dry_run_measures_lora_and_qlora_both_ways_on_cpu_and_writes_no_result() -> None:
    before = GPU_RESULTS.read_bytes() if GPU_RESULTS.exists() else None
    out = subprocess.run([sys.executable, "bench/gpu.py", "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = re.findall(r"^\| tiny \| (\w+) \| ([\w ]+) \| (\d+) \|", out.stdout, re.M)
    assert {(method, mode) for method, mode, _ in rows} == {
        (m, mode) for m in ("lora", "qlora") for mode in ("nbtrain auto", "TRL defaults")
    }
    assert all(int(tps) > 0 for _, _, tps in rows)
    assert "dry run on CPU: 4 runs" in out.stdout and "nothing written" in out.stdout
    assert (GPU_RESULTS.read_bytes() if GPU_RESULTS.exists() else None) == before


def test_without_a_gpu_it_says_so_measures_nothing_and_exits_0() -> None:
    if gpu_present():
        pytest.skip("a GPU is present: the script would measure for real")
    out = subprocess.run([sys.executable, "bench/gpu.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0
    assert "no NVIDIA GPU found" in out.stdout and "--dry-run" in out.stdout
