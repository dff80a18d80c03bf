"""nbtrain.examples_tools: a short tool-calling run teaches a real model to call the right function with the
right arguments on requests no training row makes (greedy generation, before and after)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtrain
from nbtrain.examples_tools import call_accuracy, held_out, parse_call, tool_model, tool_rows
from tests.conftest import runs_in

pytestmark = pytest.mark.slow


def test_parse_call_reads_the_first_well_formed_call_only() -> None:
    assert parse_call('ok <call>add {"a": 1, "b": 2}</call> <call>x {}</call>') == ("add", {"a": 1, "b": 2})
    assert parse_call("<call>add {not json}</call>") is None
    assert parse_call('<call>add ["a"]</call>') is None
    assert parse_call("no call here") is None


def test_a_short_lora_run_teaches_smollm2_to_call_tools_on_held_out_requests(
    smollm2: Path, tmp_path: Path
) -> None:
    """The tiny models do not learn to copy an argument into a call in a test's budget (examples_tools'
    docstring); SmolLM2-135M-Instruct, the smallest real model here, does in 12 steps."""
    model = tool_model(smollm2, tmp_path / "smollm2-tools")
    rows = tool_rows(600, seed=0)
    for row in rows:
        row["messages"] = row["messages"][:2]  # the request and the call: what is measured
    (tmp_path / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cases = held_out(30, train=rows)  # cities and numbers no row names
    before, _ = call_accuracy(model, cases)
    with runs_in(tmp_path):
        run = nbtrain.finetune(
            f"""\
model: {model}
method: lora
data: {{train: tools.jsonl}}
lora: {{r: 16, alpha: 32}}
train: {{max_steps: 12, learning_rate: 3.0e-3, per_device_train_batch_size: 8, lr_scheduler_type: cosine,
         warmup_steps: 3, logging_steps: 1, save_strategy: "no", assistant_only_loss: true}}
""",
            name="tools",
        )
        assert run.wait(timeout=1200).state == "completed"
    after, said = call_accuracy(run.output_dir, cases)
    print(f"tool calls right on {len(cases)} held-out requests: before {before:.2f}, after {after:.2f}")
    assert before == 0.0
    assert after >= 0.8, said
