"""The panel's plan for a newcomer: the values a run would use shown in the empty training fields from the
moment the form opens, the steps the plan makes of the data, and its warning when they would under-train."""

from __future__ import annotations

from pathlib import Path

from nbtrain.control.plan.length import UNDERTRAIN_BELOW, undertrain_warning
from nbtrain.ui.panel import ConfigPanel


def _box(p: ConfigPanel, key: str) -> str:
    return str(p.fields[f"train.{key}"].placeholder)


def test_an_empty_form_shows_the_planned_values_from_the_first_moment(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()  # before its first check has run: no model typed, nothing planned from it yet
    first = {k: _box(p, k) for k in ("learning_rate", "num_train_epochs", "max_steps")}
    assert first == {
        "learning_rate": "0.0002 (planned)",  # an adapter's rate, not TRL's full fine-tuning 2e-05
        "num_train_epochs": "3 (planned)",
        "max_steps": "planned: 3 epochs over the data",  # not TRL's -1
    }
    assert p.settle(60)
    assert {k: _box(p, k) for k in first} == first  # the check without a model keeps them
    p.fields["method"].value = "full"  # full fine-tuning keeps TRL's own rate: the plan sets none
    assert p.settle(60)
    assert _box(p, "learning_rate") == "default 2e-05"
    p.fields["train.max_steps"].value = "40"
    assert p.settle(60)
    assert _box(p, "num_train_epochs") == "not used: Max steps is set"


def test_the_plan_counts_the_steps_of_the_data_and_warns_when_they_would_under_train(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel()
    p.fields["model"].value = "./tiny-llama"
    p.fields["data.train"].value = "data/add.jsonl"  # 400 rows, 10% held out: 360 rows of 8, 3 epochs
    p.fields["data.eval_split"].value = "0.1"
    assert p.settle(60)
    text = "\n".join(p.plan_text)
    assert "Batch 8 x 1 accumulation x 1 process, 135 steps (3 epochs), learning rate 0.0002" in text, text
    assert _box(p, "max_steps") == "135 (planned: 3 epochs over the data)"
    assert "Time: not estimated yet (no run of this model and batch has finished here)" in text
    assert "Warning: likely to under-train: learning rate x steps = 0.0002 x 135 = 0.027, under 0.1" in text
    p.fields["train.learning_rate"].value = "2e-3"  # 0.27: what trained the tiny model to a useful loss
    assert p.settle(60)
    assert "135 steps" in "\n".join(p.plan_text) and "Warning" not in "\n".join(p.plan_text)


def test_the_under_training_rule_is_for_adapter_sft_runs_below_its_budget() -> None:
    assert undertrain_warning("sft", "lora", 2e-4, 60) is not None
    assert undertrain_warning("sft", "qlora", 1e-3, 150) is None  # 0.15: enough
    assert undertrain_warning("sft", "lora", UNDERTRAIN_BELOW, 1) is None  # at the budget exactly
    assert undertrain_warning("sft", "full", 2e-5, 60) is None  # not measured for full fine-tuning
    assert undertrain_warning("dpo", "lora", 1e-6, 60) is None  # nor for preference objectives
    assert undertrain_warning("sft", "lora", 2e-4, None) is None  # steps unknown (Hub data, a mix)


def test_the_data_preview_renders_the_rows_with_a_gguf_files_own_chat_template(
    workdir: Path, smollm2_gguf: Path
) -> None:
    from nbtrain.ui.panel import data_preview, preview_html

    pv = data_preview({"model": str(smollm2_gguf), "data": {"train": "data/add.jsonl"}}, workdir, 2)
    assert pv.template is not None and pv.template_note is None
    assert pv.template.origin == f"{smollm2_gguf.name}'s header"
    text = "".join(t for t, _ in pv.rows[0].segments or [])
    assert "<|im_start|>user\nWhat is" in text and "<|im_start|>assistant\n" in text  # SmolLM2's ChatML
    assert f"chat template from {smollm2_gguf.name}'s header" in preview_html(pv)


def test_the_model_box_offers_the_example_models_by_name_and_picking_one_gets_it(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    import time

    p = make_panel()
    assert {"example: tiny-adder", "example: smollm2-135m-instruct"} <= set(p.fields["model"].options)
    p.fields["model"].value = "example: tiny-adder"  # the shipped one: copied beside the notebook
    deadline = time.monotonic() + 60
    while p.fields["model"].value != "./tiny-adder" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.fields["model"].value == "./tiny-adder" and (workdir / "tiny-adder" / "config.json").is_file()
    assert p.status_message == "the example model tiny-adder: ./tiny-adder"
    p.fields["data.train"].value = "data/add.jsonl"
    assert p.settle(60)
    assert "Plan: lora sft on cpu" in "\n".join(p.plan_text) and p.problems == {}
