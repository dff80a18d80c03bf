"""``init_from:``: a run that starts from an earlier run's weights (a sweep's clone from a checkpoint uses
it): checked before anything starts, and in the worker the adapter really is the earlier one (the first loss
is where that run ended, not where a fresh adapter starts), or the run fails saying the two do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from tests.conftest import TUNED_ANSWERS, runs_in


def _config(extra: str, method: str = "lora") -> str:
    return f"model: ./tiny-llama\nmethod: {method}\ndata: {{train: data/add.jsonl}}\n{extra}"


def _adapter(folder: Path, r: int = 8) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"")  # read by the worker, not by the check
    return folder


def test_init_from_is_checked_before_anything_starts(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    _adapter(workdir / "ckpt")
    ok = load_config(_config("init_from: ckpt\n"))
    assert ok.config.init_from == str(workdir / "ckpt")  # absolute, for the worker
    cases = {
        "init_from: nowhere\n": "is not a folder",
        "init_from: data\n": "holds no LoRA adapter (adapter_config.json, adapter_model.safetensors missing)",
        "init_from: ckpt\nlora: {r: 16}\n": "adapter has r=8 and this run's lora: r is 16",
        "init_from: ckpt\nobjective: dpo\n": "init_from starts SFT runs only, not objective: dpo",
    }
    for extra, said in cases.items():
        with pytest.raises(ConfigError, match="init_from") as e:
            load_config(_config(extra))
        assert said in str(e.value), (extra, str(e.value))
    with pytest.raises(ConfigError) as e:
        load_config(_config("init_from: ckpt\n", method="full"))
    assert "holds no model (config.json): method: full starts from a full run's weights" in str(e.value)
    full = load_config(_config("init_from: tiny-llama\n", method="full"))  # a model folder
    assert full.config.init_from == str((workdir / "tiny-llama").resolve())


@pytest.mark.slow
def test_a_run_from_an_earlier_adapter_starts_where_it_ended_and_a_misfit_fails_saying_so(
    tmp_path: Path, tiny_model: Path, tuned_run: Path
) -> None:
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in TUNED_ANSWERS.items()
    ] * 16
    (tmp_path / "rep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = (
        f"model: {tiny_model}\nmethod: lora\ndata: {{train: rep.jsonl}}\n"
        "train: {max_steps: 2, learning_rate: 1.0e-9, per_device_train_batch_size: 8, logging_steps: 1}\n"
    )
    with runs_in(tmp_path):
        fresh = nbtrain.finetune(base + "lora: {r: 16, alpha: 32}\n", name="fresh")
        warm = nbtrain.finetune(
            base + f"lora: {{r: 16, alpha: 32}}\ninit_from: {tuned_run / 'output'}\n", name="warm"
        )
        misfit = nbtrain.finetune(
            base
            + f"lora: {{r: 16, alpha: 32, target_modules: [q_proj]}}\ninit_from: {tuned_run / 'output'}\n",
            name="misfit",
        )
        states = {r.name: r.wait(timeout=300, check=False) for r in (fresh, warm, misfit)}
    assert states["fresh"].state == states["warm"].state == "completed"
    ended = nbtrain.get_run(tuned_run).metrics()["loss"].dropna().iloc[-1]
    first = {r.name: r.metrics()["loss"].dropna().iloc[0] for r in (fresh, warm)}
    # from the tuned run's adapter the loss starts where that run ended, not where a fresh adapter starts
    # (the learning rate is too small for two steps to move either)
    assert ended < first["fresh"] - 0.2, (first, ended)
    assert abs(first["warm"] - ended) < 0.1 * (first["fresh"] - ended), (first, ended)
    assert "LoRA adapter weights from" in (warm.dir / "logs" / "rank0.log").read_text()
    st = states["misfit"]
    assert st.state == "failed" and "does not fit this run's LoRA" in (st.error or {}).get("message", ""), st
