"""Real training runs of the tiny model in detached worker processes (CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import nbtrain
from nbtrain.examples import write_dataset
from nbtrain.ui.text import status_text
from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow


def loss_fell(run: nbtrain.Run) -> tuple[float, float]:
    losses = run.metrics()["loss"].dropna().tolist()
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert end < start, losses
    return start, end


def test_lora_run_completes_loss_falls_and_adapter_generates(workdir: Path) -> None:
    run = nbtrain.finetune(lora_yaml(40), name="lora")
    st = run.wait(timeout=300)
    assert st.state == "completed" and st.step == 40 and st.max_steps == 40
    loss_fell(run)
    m = run.metrics()
    assert {"lr", "grad_norm", "epoch", "tokens_per_s", "t"} <= set(m.columns)
    assert m["step"].tolist()[:40] == list(range(1, 41))
    assert (m["tokens_per_s"].dropna() > 0).all()
    sysm = run.system()
    samples = sysm[sysm["event"].isna()] if "event" in sysm else sysm  # resource samples, not the end report
    assert (sysm["rank"] == 0).all() and (samples["rss"] > 0).all() and len(samples) >= 40
    out = run.output_dir
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert not (run.dir / "output.partial").exists()
    # LoRA never quantises: the worker kept peft from pulling bitsandbytes in (and transformers scipy)
    assert "not loaded (this run does not use them): bitsandbytes, scipy" in run.logs(400)

    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(prompt, return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]


def test_full_finetune_saves_a_loadable_model(workdir: Path) -> None:
    run = nbtrain.finetune(lora_yaml(15, method="full").replace("3.0e-3", "1.0e-3"), name="full")
    run.wait(timeout=300)
    loss_fell(run)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run.output_dir)
    assert model.config.num_hidden_layers == 2


def test_every_data_format_trains_and_eval_split_logs_eval_loss(workdir: Path) -> None:
    runs = {}
    for fmt in ("alpaca", "sharegpt", "text"):
        write_dataset(workdir / "data" / f"{fmt}.jsonl", fmt, n=60)
        text = (
            lora_yaml(4)
            .replace("data/add.jsonl", f"data/{fmt}.jsonl")
            .replace("  format: auto", "  format: auto\n  eval_split: 0.1")
        )
        runs[fmt] = nbtrain.finetune(text, name=f"fmt-{fmt}")  # three runs at once: no cross-talk
    for fmt, run in runs.items():
        assert run.wait(timeout=300).state == "completed", run.logs()
        resolved = run.resolved
        assert resolved["data"]["train"]["format"] == fmt
        m = run.metrics()
        assert m["eval_loss"].notna().any()
        assert f"({fmt})" in run.logs(200) and "eval rows" in run.logs(200)
    assert len({r.dir for r in runs.values()}) == 3


def test_model_broken_on_disk_fails_late_with_error_and_log_tail(workdir: Path, tiny_model: Path) -> None:
    broken = workdir / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    run = nbtrain.finetune(lora_yaml(5).replace("./tiny-llama", "./broken-model"), name="broken")
    with pytest.raises(nbtrain.RunFailed) as ei:
        run.wait(timeout=300)
    st = run.status()
    assert st.state == "failed" and st.error is not None
    assert st.error["type"] and st.error["message"]
    assert "Traceback" in run.logs(200)
    assert "failed" in str(ei.value) and "last lines of" in str(ei.value)
    text = status_text(run)
    assert "error:" in text and "last lines of" in text
    assert json.loads(run.paths.status.read_text())["state"] == "failed"
