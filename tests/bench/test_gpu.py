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
def test_the_one_gpu_command_rehearsed_on_cpu_runs_the_gpu_tests_then_both_ways_and_writes_no_result() -> (
    None
):
    """``bench/gpu.py --all`` is what a lent GPU machine runs, under one time limit: the gpu-marked tests
    (here: found and skipped), then each benchmark row. Its CPU rehearsal goes through all of it."""
    before = GPU_RESULTS.read_bytes() if GPU_RESULTS.exists() else None
    argv = [sys.executable, "bench/gpu.py", "--all", "--dry-run"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = re.findall(r"^\| tiny \| (\w+) \| ([\w ]+) \| (\d+) \|", out.stdout, re.M)
    assert {(method, mode) for method, mode, _ in rows} == {
        (m, mode) for m in ("lora", "qlora") for mode in ("nbtrain auto", "TRL defaults")
    }
    assert all(int(tps) > 0 for _, _, tps in rows)
    assert "dry run on CPU: 4 runs" in out.stdout and "nothing written" in out.stdout
    tests = re.search(r"^gpu-marked tests: (.*)$", out.stdout, re.M)
    assert tests and re.search(r"\b[1-9]\d* skipped", tests.group(1)), out.stdout[:2000]
    assert (GPU_RESULTS.read_bytes() if GPU_RESULTS.exists() else None) == before


def test_without_a_gpu_it_says_so_measures_nothing_and_exits_0() -> None:
    if gpu_present():
        pytest.skip("a GPU is present: the script would measure for real")
    out = subprocess.run([sys.executable, "bench/gpu.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0
    assert "no NVIDIA GPU found" in out.stdout and "--dry-run" in out.stdout


def test_on_a_gpu_each_fast_path_the_plan_takes_is_measured_the_other_way_too() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu

    lora = gpu.modes("lora", gpu=True)
    assert lora[0] == "nbtrain auto" and "TRL defaults" in lora
    assert {"nbtrain adamw-unfused", "nbtrain compile"} <= set(lora)
    assert "nbtrain compile" not in gpu.modes("qlora", gpu=True)
    assert gpu.modes("lora", gpu=True, size="7b") == ["nbtrain auto", "TRL defaults"]  # the budget's order
    assert gpu.modes("lora", gpu=False) == ["nbtrain auto", "TRL defaults"]
    assert all(m in gpu.MODES for m in lora)
    assert gpu.gpu_test_files() == [
        "tests/worker/serve/test_server.py",
        "tests/worker/test_memory_measured.py",
    ]
