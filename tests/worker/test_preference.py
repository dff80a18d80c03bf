"""Real DPO, ORPO, KTO and GRPO runs of the tiny model in detached workers (CPU), a few steps each.

The trainers' own metrics must reach metrics.jsonl through the run-directory callback, and output/
must hold what the method saves (an adapter, or a whole model)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.examples import preference_rows, write_dataset
from tests.notebook import error_of, execute, text_of

pytestmark = pytest.mark.slow

_HEAVY_MODULES = "('torch', 'bitsandbytes', 'transformers', 'trl')"
HEAVY = f"import sys; print(sorted(m for m in {_HEAVY_MODULES} if m in sys.modules))"


def pref_yaml(objective: str, data: str, *, method: str = "lora", steps: int = 6, extra: str = "") -> str:
    return f"""\
model: ./tiny-llama
method: {method}
objective: {objective}
data:
  train: {data}
train:
  max_steps: {steps}
  learning_rate: 3.0e-3
  per_device_train_batch_size: 4
{extra}"""


def completed(run: nbtrain.Run, steps: int) -> None:
    st = run.wait(timeout=300)
    assert st.state == "completed" and st.step == steps, run.logs(80)
    assert not (run.dir / "output.partial").exists()


def test_dpo_with_lora_logs_reward_margins_and_saves_the_adapter(workdir: Path) -> None:
    write_dataset(workdir / "data" / "pref.jsonl", "preference", n=48)
    run = nbtrain.finetune(pref_yaml("dpo", "data/pref.jsonl", extra="  beta: 0.5\n"), name="dpo")
    completed(run, 6)
    m = run.metrics()
    keys = {
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
    }
    assert keys <= set(m.columns)
    assert m["step"].tolist()[:6] == list(range(1, 7))
    assert m["rewards/margins"].notna().all() and (m["tokens_per_s"].dropna() > 0).all()
    # The policy moves away from the reference (the base with the adapter disabled) as it trains.
    assert m["rewards/chosen"].abs().iloc[-1] > 0
    assert "dpo reference model: the base model with the adapter disabled" in run.logs(200)
    out = run.output_dir
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    # The scoring job (one-off job shape: --result) on the same pairs: log-probabilities before and after.
    scores = nbtrain.preference_scores(run, workdir / "data" / "pref.jsonl", n=4)
    assert len(scores) == 4 and scores.attrs["beta"] == 0.5
    assert (scores["margin_after"] != scores["margin_before"]).any()
    assert "=== " in (run.dir / "logs" / "score.log").read_text()  # run_job's header: what ran when


def test_orpo_full_finetune_on_plain_strings_saves_a_whole_model(workdir: Path) -> None:
    write_dataset(workdir / "data" / "plain.jsonl", "preference", n=32, conversational=False)
    run = nbtrain.finetune(pref_yaml("orpo", "data/plain.jsonl", method="full", steps=4), name="orpo")
    completed(run, 4)
    m = run.metrics()
    assert {"loss", "nll_loss", "log_odds_ratio", "rewards/margins"} <= set(m.columns)
    assert "orpo reference model: none (ORPO is reference-free)" in run.logs(200)
    assert "Tried to track the number of tokens" not in run.logs(400)  # nbtrain turns that counting off
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run.output_dir)
    assert model.config.num_hidden_layers == 2


def test_kto_reads_csv_with_odd_column_names_and_logs_kl(workdir: Path) -> None:
    """CSV gives labels as text and the columns have other names: data: columns: maps them."""
    rows = preference_rows("unpaired", n=32, conversational=False)
    with open(workdir / "data" / "judged.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["question", "answer", "ok"])
        w.writeheader()
        for r in rows:
            w.writerow({"question": r["prompt"], "answer": r["completion"], "ok": str(r["label"]).lower()})
    cols = "  columns: {prompt: question, completion: answer, label: ok}\n"
    text = pref_yaml("kto", "data/judged.csv").replace(
        "  train: data/judged.csv\n", f"  train: data/judged.csv\n{cols}"
    )
    prep = nbtrain.prepare(text, name="kto")
    assert prep.resolved.train_data.format == "unpaired"
    run = nbtrain.start(prep)
    completed(run, 6)
    m = run.metrics()
    assert {"loss", "kl", "rewards/chosen", "rewards/rejected"} <= set(m.columns)
    assert m["kl"].notna().all()
    assert "kto: 32 training rows (unpaired)" in run.logs(200)


REWARD_CELL = '''\
from nbtrain.contract.rewards import completion_text

def digits_reward(completions, answer, **kwargs):
    """Defined in the notebook: the share of digits in each completion, plus 1 for the right sum."""
    out = []
    for c, a in zip(completions, answer):
        text = completion_text(c)
        out.append(sum(ch.isdigit() for ch in text) / max(1, len(text)) + (1.0 if a in text else 0.0))
    return out
'''

LOCKED_CELL = """\
import threading
lock = threading.Lock()

def locked_reward(completions, **kwargs):
    with lock:
        return [0.0] * len(completions)
"""


def grpo_cell(name: str, reward: str) -> str:
    return f"""%%finetune --name {name} --wait --no-view
model: ./tiny-llama
objective: grpo
rewards: [{reward}, format_reward]
data:
  train: data/prompts.jsonl
train:
  max_steps: 4
  learning_rate: 3.0e-3
  per_device_train_batch_size: 4
  num_generations: 2
  max_completion_length: 8
  beta: 0.04
"""


def test_grpo_trains_on_a_reward_function_defined_in_the_notebook(workdir: Path) -> None:
    """The function lives only in the kernel; it is captured with cloudpickle and the detached worker calls
    it. The kernel never imports torch, and a reward that cannot be serialised is refused before launch."""
    write_dataset(workdir / "data" / "prompts.jsonl", "prompt", n=16)
    cells = [
        "%load_ext nbtrain",
        REWARD_CELL,
        grpo_cell("grpo", "digits_reward"),
        LOCKED_CELL,
        grpo_cell("grpo-locked", "locked_reward"),
        grpo_cell("grpo-missing", "no_such_reward"),
        HEAVY,
    ]
    nb = execute(cells, workdir, allow_errors=True)
    assert error_of(nb.cells[2]) is None, text_of(nb.cells[2])
    err = error_of(nb.cells[4])
    assert err is not None and err[0] == "UsageError"
    assert "rewards.0" in err[1] and "'locked_reward' cannot be serialised" in err[1] and "lock" in err[1]
    err = error_of(nb.cells[5])
    assert err is not None and "no function named 'no_such_reward' in the notebook" in err[1]
    assert text_of(nb.cells[6]).strip() == "[]"
    assert [r.name for r in nbtrain.runs()] == ["grpo"]

    run = nbtrain.get_run("grpo")
    assert run.status().state == "completed" and (run.dir / "rewards.pkl").exists()
    m = run.metrics()
    keys = {"loss", "reward", "reward_std", "rewards/digits_reward/mean", "rewards/format_reward/mean", "kl"}
    assert keys <= set(m.columns)
    assert m["step"].tolist()[:4] == [1, 2, 3, 4]
    assert (m["reward_std"] > 0).any()  # the notebook's reward tells completions apart: a real signal
    assert (m["tokens_per_s"].dropna() > 0).all()
    assert "grpo rewards: digits_reward, format_reward" in run.logs(200)
    assert (run.output_dir / "adapter_model.safetensors").exists()
