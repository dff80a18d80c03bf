"""bench/peers.py, what the comparisons with other tools (LLaMA-Factory, ms-swift) share: the step clock
put into a peer's training process, and the message when a peer's venv is not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.peers import run_peer

ROOT = Path(__file__).resolve().parents[2]

# A training script that knows nothing of the bench: a plain transformers Trainer, as a peer tool runs one.
PLAIN_TRAINER = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    rows = [{"input_ids": torch.arange(2, 14) + i, "labels": torch.arange(2, 14) + i} for i in range(32)]
    args = TrainingArguments(output_dir=sys.argv[2], max_steps=6, per_device_train_batch_size=4,
                             logging_steps=1, learning_rate=1e-2, report_to="none", save_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    json.dump(losses, open(sys.argv[3], "w"))
    """
)


@pytest.mark.slow
def test_step_clock_times_every_step_and_reads_the_last_loss_of_an_unmodified_trainer(
    tmp_path: Path, tiny_model: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN_TRAINER)
    losses = tmp_path / "losses.json"
    argv = [sys.executable, str(script), str(tiny_model), str(tmp_path / "out"), str(losses)]
    r = run_peer(argv, tmp_path, tmp_path / "train.log", skip=1)
    clock = json.loads((tmp_path / "step-clock.json").read_text())
    assert len(clock["step_times"]) == 6
    assert clock["step_times"] == sorted(clock["step_times"])
    logged = json.loads(losses.read_text())
    assert [loss for _, loss in clock["losses"]] == logged
    assert r["final_loss"] == logged[-1]
    assert 0 < r["first_step_s"] < 300 and r["steady_steps_per_s"] > 0
    assert r["peak_rss"] > 100 * 2**20  # the training process itself: torch alone is more than that


def test_step_clock_failure_shows_the_tools_own_output(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('no such model: /x'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)failed \(rc 3\).*no such model: /x"):
        run_peer(argv, tmp_path, tmp_path / "tool.log")


def test_bench_msswift_without_its_venv_says_which_set_up_script_to_run_and_writes_no_result(
    tmp_path: Path,
) -> None:
    results = ROOT / "bench" / "results" / "msswift.json"
    before = results.read_bytes() if results.exists() else None
    env = {"MSSWIFT_VENV": str(tmp_path / "no-msswift"), "LLAMAFACTORY_VENV": str(tmp_path / "no-lf")}
    out = subprocess.run([sys.executable, "bench/bench_msswift.py", "--repeats", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert f"ms-swift's venv {tmp_path / 'no-msswift'} is missing" in out.stderr
    assert "run `bash bench/setup_msswift.sh`" in out.stderr
    assert "run `bash bench/setup_llamafactory.sh`" in out.stderr
    assert (results.read_bytes() if results.exists() else None) == before
