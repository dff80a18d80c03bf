"""The widget config panel, driven from code: fields -> YAML, inline errors, preview, and its buttons."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import ipywidgets as widgets
import pytest
import yaml

from nbtrain.contract.errors import ConfigError
from nbtrain.control import start as api
from nbtrain.control.config.load import load_config
from nbtrain.control.config.schema import DistributedSettings
from nbtrain.control.config.trainargs import sft_fields
from nbtrain.control.runs.run import Run, create_run_dir
from nbtrain.examples import CHAT_TEMPLATE, write_dataset
from nbtrain.ui.dashboard import Dashboard
from nbtrain.ui.panel import (
    UNSET,
    ConfigPanel,
    data_preview,
    find_chat_template,
    format_scalar,
    panel,
    parse_scalar,
    validate,
)
from tests.conftest import lora_yaml


def _settled(p: ConfigPanel) -> ConfigPanel:
    assert p.settle(60), "the panel's background check did not finish"
    return p


def _fill_basic(p: ConfigPanel) -> None:
    p.fields["model"].value = "./tiny-llama"
    p.fields["data.train"].value = "data/add.jsonl"


# ------------------------------------------------------------------------------------ YAML from form


REQUIRED = {"model": "required key is missing", "data.train": "required key is missing"}


def test_an_empty_form_opens_without_errors_and_shows_them_once_launch_is_pressed(
    make_panel: type[ConfigPanel],
) -> None:
    p = _settled(make_panel())
    assert p.errors == {} and p.general_errors == [] and p.problems == REQUIRED
    assert all(label.value == "" for label in p.error_labels.values())
    assert "nbtrain-invalid" not in p.fields["model"]._dom_classes
    p.launch_button.click()
    assert p.run is None and p.errors == REQUIRED
    assert "required key is missing" in p.error_labels["model"].value
    assert "nbtrain-invalid" in p.fields["model"]._dom_classes


def test_a_field_shows_its_error_once_the_user_touched_it(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    p.fields["model"].value = "./x"
    p.fields["model"].value = ""  # typed, then cleared: now it is the user's missing value
    assert _settled(p).errors == {"model": "required key is missing"}
    assert p.error_labels["data.train"].value == ""  # never touched: still quiet


def test_fields_have_human_labels_and_the_yaml_key_in_the_tooltip(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    for f in p.spec:
        assert f.label and "." not in f.label and "_" not in f.label, f
        assert f">{html.escape(f.label)}</label>" in p.labels[f.path].value
        assert f"title='{html.escape(f.path)}" in p.labels[f.path].value  # the key, then its help
        assert p.fields[f.path].tooltip.startswith(f.path)
    assert ">Batch size per device<" in p.labels["train.per_device_train_batch_size"].value
    assert "The batch size per device" in p.labels["train.per_device_train_batch_size"].value


def test_the_form_is_the_guided_flow_model_method_data_hyperparameters_start(
    make_panel: type[ConfigPanel],
) -> None:
    p = make_panel()
    assert list(p.steps) == ["Model", "Method", "Data", "Hyperparameters", "Start"]
    form = p.widget.children[2].children[0]
    assert list(form.children) == list(p.steps.values())

    def inside(box: Any) -> set[Any]:
        out, todo = set(), [box]
        while todo:
            w = todo.pop()
            out.add(w)
            todo.extend(getattr(w, "children", ()))
        return out

    where = {path: next(t for t, box in p.steps.items() if w in inside(box)) for path, w in p.fields.items()}
    assert where["model"] == "Model"
    assert where["method"] == where["objective"] == where["lora.r"] == where["quantization.bits"] == "Method"
    assert where["data.train"] == where["data.format"] == "Data"
    assert where["train.learning_rate"] == where["train.optim"] == where["precision"] == "Hyperparameters"
    assert where["name"] == "Start"
    start = inside(p.steps["Start"])
    assert {p.launch_button, p.stop_button, p.to_cell_button} <= start


def test_yaml_holds_only_the_fields_that_were_set_in_schema_order(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel()
    p.fields["train.learning_rate"].value = "3e-4"  # Python syntax; YAML 1.1 alone would read a string
    p.fields["name"].value = "adder"
    p.fields["train.max_steps"].value = "3"
    _fill_basic(p)
    p.fields["precision"].value = "fp32"
    expected = (
        "model: ./tiny-llama\n"
        "data:\n"
        "  train: data/add.jsonl\n"
        "train:\n"
        "  max_steps: 3\n"
        "  learning_rate: 0.0003\n"
        "precision: fp32\n"
        "name: adder\n"
    )
    assert p.to_yaml() == expected
    assert html.escape(expected) in p.yaml_view.value
    assert _settled(p).errors == {} and p.general_errors == []
    cfg = load_config(p.to_yaml()).config
    assert cfg.train == {"max_steps": 3, "learning_rate": 0.0003} and cfg.precision == "fp32"


def test_a_dropdown_the_user_set_is_written_even_at_its_default(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    assert "method" not in p.to_dict()
    p.fields["method"].value = "full"
    p.fields["method"].value = "lora"
    assert p.to_dict()["method"] == "lora"


def test_emptying_a_field_removes_its_key(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel(lora_yaml(5))
    p.fields["train.max_steps"].value = ""
    assert "max_steps" not in p.to_dict()["train"]


def test_lora_fields_hidden_and_not_written_for_full_fine_tuning(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    p.fields["lora.r"].value = "16"
    assert p.to_dict()["lora"] == {"r": 16}
    p.fields["method"].value = "full"
    assert "lora" not in p.to_dict()
    assert p.groups["LoRA"].layout.display == "none"
    p.fields["method"].value = "lora"
    assert p.to_dict()["lora"] == {"r": 16} and p.groups["LoRA"].layout.display == ""


def test_qlora_bits_shown_only_for_qlora(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    assert p.groups["QLoRA"].layout.display == "none"
    p.fields["method"].value = "qlora"
    assert p.groups["QLoRA"].layout.display == ""
    p.fields["quantization.bits"].value = 8
    assert p.to_dict()["quantization"] == {"bits": 8}
    p.fields["method"].value = "lora"
    assert p.groups["QLoRA"].layout.display == "none" and "quantization" not in p.to_dict()


def test_distributed_strategy_offers_the_schemas_strategies_and_writes_only_a_choice(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(3))
    w = p.fields["distributed.strategy"]
    assert not w.disabled and w.value == "auto"
    assert [v for _, v in w.options] == list(
        get_args(DistributedSettings.model_fields["strategy"].annotation)
    )
    assert "distributed" not in p.to_dict()
    w.value = "zero2"
    assert p.to_dict()["distributed"] == {"strategy": "zero2"}
    assert _settled(p).errors == {}
    p.fields["method"].value = "qlora"
    w.value = "zero3"
    errors = _settled(p).errors
    assert errors["distributed.strategy"].startswith("method: qlora cannot combine with zero3 here")


@pytest.mark.parametrize("key", ["lr_scheduler_type", "optim"])
def test_transformers_enums_are_dropdowns_of_their_values_written_only_when_picked(
    workdir: Path, make_panel: type[ConfigPanel], key: str
) -> None:
    spec = sft_fields()[key]  # the enum's values, read from the shipped snapshot (no torch in the kernel)
    p = make_panel(lora_yaml(3))
    w = p.fields[f"train.{key}"]
    assert isinstance(w, widgets.Dropdown)
    assert tuple(v for _, v in w.options) == spec.choices and w.value == spec.default
    assert (f"{spec.default} (default)", spec.default) in w.options
    assert key not in p.to_dict()["train"]
    pick = next(c for c in spec.choices if c != spec.default and "8bit" not in c)
    w.value = pick
    assert p.to_dict()["train"][key] == pick


def test_model_and_data_boxes_offer_the_model_folders_and_data_files_found_here(
    workdir: Path, make_panel: type[ConfigPanel], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = workdir / "hfcache"
    (hub / "models--org--tiny").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(workdir / "no-cache"))  # no fetched example models
    (workdir / "data" / "more.csv").write_text("text\nhello\n")
    (workdir / "data" / "notes.txt").write_text("not data")
    (workdir / "data" / ".hidden.jsonl").write_text("{}\n")
    (workdir / "runs" / "r1").mkdir(parents=True)  # the runs root: its jsonl files are not data
    (workdir / "runs" / "r1" / "metrics.jsonl").write_text("{}\n")
    p = make_panel()
    model, data = p.fields["model"], p.fields["data.train"]
    assert isinstance(model, widgets.Combobox) and isinstance(data, widgets.Combobox)
    examples = ["example: tiny-adder", "example: smollm2-135m-instruct"]  # by name, last: picking gets one
    assert list(model.options) == ["./tiny-llama", "org/tiny", *examples]
    assert list(data.options) == ["data/add.jsonl", "data/more.csv"]  # not the model's own .json files
    data.value = "data/more.csv"  # any text is still accepted: a Hub id, a path not listed
    model.value = "org/other"
    assert p.to_dict()["model"] == "org/other" and p.to_dict()["data"]["train"] == "data/more.csv"


@pytest.mark.parametrize(
    "value",
    [
        0,
        3,
        -1,
        1000000,
        0.1,
        3e-05,
        1e20,
        2.0,
        True,
        False,
        None,
        "cosine",
        "10",
        "1e5",
        "a, b",
        "",
        [1, "x"],
    ],
)
def test_scalar_boxes_keep_value_and_type(value: object) -> None:
    back = parse_scalar(format_scalar(value))
    assert back == value and type(back) is type(value)


def test_scalar_box_reads_empty_as_unset_and_python_numbers_as_numbers() -> None:
    assert parse_scalar("  ") is UNSET
    assert parse_scalar("3e-4") == 0.0003 and parse_scalar("1_000") == 1000
    assert parse_scalar("linear") == "linear" and parse_scalar("null") is None
    assert parse_scalar("1__0") == yaml.safe_load("1__0")  # not a Python number: YAML reads it, no error


# -------------------------------------------------------------------------------------- inline errors


def test_missing_data_file_marks_the_data_field(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    _fill_basic(p)
    p.fields["data.train"].value = "data/missing.jsonl"
    errors = _settled(p).errors
    assert list(errors) == ["data.train"]
    assert errors["data.train"].startswith("data file not found:")
    assert "data file not found" in p.error_labels["data.train"].value
    assert "nbtrain-invalid" in p.fields["data.train"]._dom_classes


def test_bad_lr_scheduler_is_rejected_inline_then_cleared_when_fixed(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(5, extra="  lr_scheduler_type: cosine_restarts\n"))  # a value from YAML
    assert p.fields["train.lr_scheduler_type"].value == "cosine_restarts"  # kept, shown, flagged
    errors = _settled(p).errors
    expected = {x.path: x.message for x in validate(p.to_yaml())}
    assert errors == expected
    assert errors["train.lr_scheduler_type"].startswith(
        "'cosine_restarts' is not a value lr_scheduler_type takes; did you mean cosine_with_restarts?"
    )
    p.fields["train.lr_scheduler_type"].value = "cosine_with_restarts"
    assert _settled(p).errors == {} and p.general_errors == []
    assert p.error_labels["train.lr_scheduler_type"].value == ""
    assert "nbtrain-invalid" not in p.fields["train.lr_scheduler_type"]._dom_classes


def test_inline_errors_are_the_yaml_validators_messages(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel(lora_yaml(5))
    p.fields["lora.r"].value = "0"
    p.fields["lora.target_modules"].value = "q_proj"  # a bare name is not a list: the validator says so
    p.fields["train.learning_rate"].value = "fast"
    p.fields["data.eval_split"].value = "1.5"  # a fraction above 1 (a whole number is a row count)
    p.fields["name"].value = "bad name!"
    errors = _settled(p).errors
    problems = validate(p.to_yaml())
    assert {x.path for x in problems} == {
        "lora.r",
        "lora.target_modules",
        "train.learning_rate",
        "data.eval_split",
        "name",
    }
    assert errors == {x.path: x.message for x in problems}


def test_problem_without_a_field_goes_to_the_general_area(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(5, extra="  lerning_rate: 0.1\n"))
    _settled(p)
    assert p.errors == {}
    assert len(p.general_errors) == 1
    assert p.general_errors[0].startswith("train.lerning_rate: unknown key 'lerning_rate'; did you mean")
    assert "lerning_rate" in p.error_area.value


def test_rapid_edits_settle_on_the_last_one(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel(lora_yaml(5), debounce=0.2)
    for bad in ("a", "b", "c", "d"):
        p.fields["train.max_steps"].value = bad
    p.fields["train.max_steps"].value = "7"
    assert _settled(p).errors == {}
    assert p.to_dict()["train"]["max_steps"] == 7


# ---------------------------------------------------------------------------------------- round trip

ROUND_TRIPS = {
    "lora": lora_yaml(),
    "full-every-training-field": """\
model: ./tiny-llama
method: full
data:
  train: data/add.jsonl
  format: messages
  eval_split: 0.1
train:
  max_steps: 5
  num_train_epochs: 2
  learning_rate: 1.0e-4
  per_device_train_batch_size: 2
  gradient_accumulation_steps: 4
  max_length: null
  lr_scheduler_type: cosine
  warmup_steps: 2
precision: fp32
name: adder-full
""",
    "lora-settings": """\
name: lora-adder
model: ./tiny-llama
data: {train: data/add.jsonl}
lora:
  r: 16
  alpha: 32
  dropout: 0.0
  target_modules: [q_proj, v_proj]
  bias: none
trust_remote_code: false
""",
    "lora-null": """\
model: ./tiny-llama
method: lora
data: {train: data/add.jsonl, max_samples: 50}
lora: null
train: {}
""",
    "single-target": """\
model: ./tiny-llama
data: {train: data/add.jsonl}
lora: {target_modules: [q_proj]}
precision: auto
""",
    "distributed": """\
model: ./tiny-llama
data: {train: data/add.jsonl}
distributed:
  strategy: ddp
  num_processes: 2
  launcher: torchrun
""",
    "invalid-but-representable": """\
model: ./tiny-llama
method: lorra
data: {train: data/add.jsonl, format: jsonl}
train: {lerning_rate: 0.1, lr_scheduler_type: cosine_restarts, max_steps: '10'}
surprise: {a: 1}
""",
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_yaml_to_panel_to_yaml_is_identical(name: str, workdir: Path, make_panel: type[ConfigPanel]) -> None:
    text = ROUND_TRIPS[name]
    p = make_panel.from_yaml(text, debounce=3600)
    assert p.to_dict() == yaml.safe_load(text)
    assert yaml.safe_load(p.to_yaml()) == yaml.safe_load(text)
    again = make_panel.from_yaml(p.to_yaml(), debounce=3600)
    assert again.to_yaml() == p.to_yaml()
    if name != "invalid-but-representable":
        assert validate(p.to_yaml()) == []


def test_qlora_round_trip(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    text = lora_yaml(5, method="qlora", extra="quantization:\n  bits: 8\n  quant_type: nf4\n")
    p = make_panel.from_yaml(text, debounce=3600)
    assert p.fields["quantization.bits"].value == 8
    assert p.to_dict() == yaml.safe_load(text)


def test_invalid_choice_from_yaml_is_shown_and_flagged(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = _settled(make_panel(ROUND_TRIPS["invalid-but-representable"]))
    assert p.fields["method"].value == "lorra"
    assert p.errors["method"].startswith("'lorra' is not allowed; did you mean 'lora'?")
    assert "data.format" in p.errors and "train.lr_scheduler_type" in p.errors


def test_from_yaml_rejects_text_that_is_not_a_mapping(make_panel: type[ConfigPanel]) -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        make_panel.from_yaml("- just\n- a list\n")
    with pytest.raises(ConfigError, match="YAML syntax error"):
        make_panel.from_yaml("model: [unclosed\n")


def test_panel_function_accepts_yaml_dict_path_and_run(workdir: Path) -> None:
    (workdir / "cfg.yaml").write_text(lora_yaml(4))
    made = [panel(), panel(lora_yaml(4)), panel(yaml.safe_load(lora_yaml(4))), panel("cfg.yaml")]
    try:
        assert made[0].to_dict() == {"data": {}}
        assert all(p.to_dict() == yaml.safe_load(lora_yaml(4)) for p in made[1:])
    finally:
        for p in made:
            p.close()


# ----------------------------------------------------------------------------------------- preview


def test_preview_shows_normalised_messages_role_by_role(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    write_dataset(workdir / "data" / "alpaca.jsonl", "alpaca", 5)
    p = make_panel()
    _fill_basic(p)
    p.fields["data.train"].value = "data/alpaca.jsonl"
    first = json.loads((workdir / "data" / "alpaca.jsonl").read_text().splitlines()[0])
    value = _settled(p).preview.value
    assert value.count("<b>row ") == 3
    assert ">user</span>" in value and ">assistant</span>" in value
    assert html.escape(first["instruction"]) in value and html.escape(first["output"]) in value
    # and rendered with the tiny model's chat template, {% generation %} tag included
    assert html.escape(f"<|user|>\n{first['instruction']}<|end|>\n<|assistant|>\n{first['output']}") in value


def test_preview_marks_the_trained_text_with_assistant_only_loss(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(5, extra="  assistant_only_loss: true\n"))
    first = json.loads((workdir / "data" / "add.jsonl").read_text().splitlines()[0])
    answer = first["messages"][1]["content"]
    value = _settled(p).preview.value
    assert f"<mark>{html.escape(answer)}&lt;|end|&gt;</mark>" in value
    assert "what the loss is computed on" in value


def test_preview_of_plain_text_rows_and_bad_rows(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    write_dataset(workdir / "data" / "text.jsonl", "text", 3)
    pv = data_preview({"model": "./tiny-llama", "data": {"train": "data/text.jsonl"}}, workdir)
    assert [r.format for r in pv.rows] == ["text"] * 3 and pv.rows[0].example is not None
    assert pv.rows[0].segments is None  # plain text is not chat-templated
    (workdir / "data" / "bad.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    pv = data_preview({"data": {"train": "data/bad.jsonl", "format": "messages"}}, workdir)
    assert pv.rows[0].error == "messages has no assistant turn, so there is nothing to learn"
    pv = data_preview({"data": {"train": "data/none.jsonl"}}, workdir)
    assert pv.rows == [] and pv.note is not None and "does not exist" in pv.note


def test_chat_template_from_tokenizer_config(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    tpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{{ eos_token }}"
    (model / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "x"},
                    {"name": "default", "template": tpl},
                ],
                "bos_token": "<s>",
                "eos_token": {"content": "</s>", "special": True},
                "add_bos_token": True,
            }
        )
    )
    t = find_chat_template(model)
    assert t is not None and t.origin == "tokenizer_config.json"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert t.render(msgs) == "<s>[user] hi\n[assistant] yo\n</s>"
    assert find_chat_template(tmp_path) is None


@pytest.mark.slow
def test_preview_template_matches_transformers_apply_chat_template(tiny_model: Path) -> None:
    msgs = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": "1 + 2 = 3"},
        {"role": "user", "content": "And 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4"},
    ]
    # transformers only in a child process: this test process stays as light as a kernel.
    code = (
        "import json, sys\nfrom transformers import AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(json.dumps(tok.apply_chat_template(json.loads(sys.argv[2]), tokenize=False)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model), json.dumps(msgs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = json.loads(proc.stdout.strip().splitlines()[-1])
    t = find_chat_template(tiny_model)
    assert t is not None and t.source == CHAT_TEMPLATE
    assert t.render(msgs) == expected


# ----------------------------------------------------------------------------------------- buttons


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _loss_points(p: ConfigPanel) -> int:
    fig = p.view.fig if p.view is not None else None
    return sum(len(t.y if t.y is not None else ()) for t in (fig.data if fig else ()) if t.name == "loss")


def _wait_for_step(run: Run, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = run.status()
        assert not st.done, run.failure_report(st)
        if st.state == "running" and st.step >= 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"run {run.id} did not reach step 1: {run.status().describe()}")


@pytest.mark.slow
def test_launch_starts_a_real_run_that_completes(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel(lora_yaml(3))
    assert p.stop_button.disabled  # nothing to stop yet
    p.launch_button.click()
    assert p.general_errors == []
    run = p.run
    assert run is not None
    assert run.paths.config.read_text() == p.to_yaml()  # the run records the panel's YAML as written
    # the dashboard a %%finetune cell shows, as widgets inside the panel, following the run by itself
    assert isinstance(p.view, Dashboard) and p.view.run == run
    assert p.live.children == (p.view.box,) and p.view.fig in p.view.box.children
    assert run.id in p.status_message
    # the run is active: Stop is on (unless the warm-started 3-step run has already ended and its watch
    # turned Stop off again, which the wait below checks)
    assert not p.stop_button.disabled or run.status().done, run.status().describe()
    st = run.wait(timeout=180)
    assert st.state == "completed" and st.step == 3
    assert api.last_run() == run
    _wait_for("the dashboard's loss curve", lambda: _loss_points(p) == 3)
    # each wait covers the whole state it asserts: the panel's thread sets these one after another
    _wait_for(
        "Stop disabled once the run ended, said",
        lambda: p.stop_button.disabled and "completed" in p.status_message,
    )
    # then the run's export form, under its dashboard
    _wait_for(
        "the export form, under the dashboard",
        lambda: p.export_box is not None and p.export_area.children == (p.export_box.box,),
    )
    assert p.export_box is not None and p.export_box.run.dir == run.dir and p.export_box.error is None
    again = _settled(make_panel(lora_yaml(3)))  # the same run planned again: timed by the one that finished
    timed = next(line for line in again.plan_text if line.startswith("Time: "))
    assert ", an estimate (" in timed and timed.endswith(f"s a step, as run {run.name} went here)"), timed


@pytest.mark.slow
def test_stop_ends_a_long_run_as_stopped(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel(lora_yaml(100000))
    p.launch_button.click()
    run = p.run
    assert run is not None, p.general_errors
    _wait_for_step(run)
    assert not p.stop_button.disabled
    started = time.monotonic()
    p.stop_button.click()
    assert time.monotonic() - started < 5, "Stop must not block the kernel while the run winds down"
    assert p.stop_button.disabled  # pressed once: the run is stopping
    assert p.settle(120)
    assert run.status().state == "stopped"
    assert p.general_errors == []
    assert "stopped" in p.status_message
    assert p.stop_button.disabled
    _wait_for("the dashboard's final state", lambda: p.view is not None and p.view.finished)


def test_launch_of_an_invalid_config_shows_errors_and_starts_nothing(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(3))
    p.fields["data.train"].value = "data/missing.jsonl"
    p.launch_button.click()
    assert p.run is None
    assert p.general_errors == ["Nothing was started: 1 problem, marked in red above"]  # no YAML lines
    assert p.errors["data.train"].startswith("data file not found")
    assert p.launch_button.button_style == ""  # not green while the form would not start
    assert api.runs() == []
    p.fields["data.train"].value = "data/add.jsonl"  # fixed: the message about the old form goes
    assert _settled(p).general_errors == [] and p.errors == {}
    assert p.launch_button.button_style == "success"


def test_stop_without_a_launched_run_is_disabled_and_says_so(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    assert p.stop_button.disabled
    p.stop_button.click()  # from code a disabled button still calls its handler
    assert p.general_errors == ["no run was launched from this panel yet; Launch one first"]


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    sh = InteractiveShell.instance(config=cfg)
    try:
        yield sh
    finally:
        InteractiveShell.clear_instance()


def test_to_cell_without_the_lab_extension_falls_back_to_the_next_input_and_says_so(
    workdir: Path, make_panel: type[ConfigPanel], shell: Any
) -> None:
    p = make_panel(lora_yaml(3))
    assert "finetune" not in shell.magics_manager.magics["cell"]
    busy: list[tuple[bool, str]] = []
    p.to_cell_button.observe(lambda ch: busy.append((ch["new"], p.to_cell_button.description)), "disabled")
    p.to_cell_button.click()
    assert busy == [(True, "To cell…"), (False, "To cell")]  # greyed and saying so while it works
    assert p.general_errors == []
    text = shell.rl_next_input
    assert text == "%%finetune\n" + p.to_yaml()
    assert "follows the next cell you run" in p.status_message and "extension" in p.status_message
    # the cell it makes is one the magic accepts, and the magic is there (To cell loaded the extension)
    assert "finetune" in shell.magics_manager.magics["cell"]
    result = shell.run_cell(text.replace("%%finetune", "%%finetune --dry-run", 1))
    assert result.error_in_exec is None and isinstance(result.result, api.Prepared)


def test_to_cell_without_ipython_reports_it(make_panel: type[ConfigPanel]) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    assert not InteractiveShell.initialized()
    p = make_panel()
    p.to_cell_button.click()
    assert p.general_errors == ["'To cell' needs IPython or Jupyter; copy the YAML shown above instead"]


def test_load_fills_the_form_from_a_runs_config(workdir: Path, make_panel: type[ConfigPanel]) -> None:
    text = lora_yaml(7, extra="lora:\n  r: 4\n  target_modules: all-linear\nname: adder\n")
    prep = api.prepare(text)
    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict())  # registered, never started
    p = make_panel()
    p.load_ref.value = "adder"
    p.load_button.click()
    assert p.general_errors == [] and run.id in p.status_message
    # said beside Load too (the status line is at the form's end, steps below)
    note = p.load_note.value
    assert "nbtrain-load-done" in note and f"loaded the config of run {run.id}" in note
    d = p.to_dict()
    assert d["model"] == str((workdir / "tiny-llama").resolve()) and d["data"]["train"] == str(
        workdir / "data/add.jsonl"
    )
    assert d["lora"] == {"r": 4, "target_modules": "all-linear"}
    assert d["train"] == prep.resolved.config.train and d["name"] == "adder"
    assert "method" not in d and "quantization" not in d  # defaults stay out of the YAML
    assert load_config(p.to_yaml()).config == prep.resolved.config
    assert _settled(p).errors == {}
    assert p.export_box is None and p.export_area.children == ()  # it never trained: nothing to export


def test_load_of_a_trained_run_offers_its_export(run_copy: Path, make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    p.load_ref.value = str(run_copy)
    p.load_button.click()
    assert p.general_errors == []
    assert p.export_box is not None and p.export_box.run.dir == run_copy.resolve()
    assert p.export_area.children == (p.export_box.box,) and p.export_box.to.value == "exports/tuned"


def test_load_of_an_unknown_run_shows_the_error(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    p.load_ref.value = "no-such-run"
    p.load_button.click()
    assert len(p.general_errors) == 1 and p.general_errors[0].startswith("no run matches 'no-such-run'")
    note = p.load_note.value
    assert "nbtrain-load-failed" in note and "no run matches &#x27;no-such-run&#x27;" in note
    p.load_ref.value = ""
    p.load_button.click()
    assert p.general_errors == ["type a run id, id prefix or name, or a .yaml file, next to Load"]


# ------------------------------------------------------------------------------------------ imports


def test_panel_imports_no_torch_transformers_or_bitsandbytes(workdir: Path) -> None:
    (workdir / "cfg.yaml").write_text(lora_yaml(3))
    code = (
        "import sys\n"
        "from nbtrain.ui.panel import ConfigPanel\n"
        "p = ConfigPanel(open('cfg.yaml').read())\n"
        "assert p.settle(120) and p.errors == {}, p.errors\n"
        "assert 'as the model sees it' in p.preview.value\n"
        "p.close()\n"
        "print([m for m in ('torch', 'transformers', 'bitsandbytes', 'trl', 'peft') if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------------------------ lab preset


def test_lab_preset_locks_fixed_fields_limits_choices_and_flags_a_broken_rule(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    from nbtrain.control.config.preset import PRESET_FILE

    preset = workdir / PRESET_FILE
    preset.write_text(
        "models: [./tiny-llama]\nmethods: [lora, full]\ndata: {train: data/add.jsonl}\nmax_steps: 5\n"
    )
    p = _settled(make_panel())
    model, data = str((workdir / "tiny-llama").resolve()), str(workdir / "data" / "add.jsonl")
    assert (p.fields["model"].value, p.fields["data.train"].value) == (model, data)
    assert p.fields["model"].disabled and p.fields["data.train"].disabled
    assert not p.fields["train.learning_rate"].disabled
    # a dropdown offers only what the preset allows, and its value is always written
    assert [v for _, v in p.fields["method"].options] == ["lora", "full"] and not p.fields["method"].disabled
    assert "method: lora" in p.to_yaml()
    assert str(preset) in p.preset_note.value and "max_steps: at most 5" in p.preset_note.value
    assert p.errors == {}  # max_steps left out: the preset fills in its cap
    p.fields["train.max_steps"].value = "50"
    assert "rule 'max_steps'" in _settled(p).errors["train.max_steps"]
    # loading another config keeps the fixed fields as the preset says
    p.set_config(lora_yaml(3).replace("data/add.jsonl", "data/other.jsonl"))
    assert p.fields["data.train"].value == data and p.fields["data.train"].disabled


def test_the_model_box_offers_model_folders_gguf_files_and_fetched_example_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.ui.panel import model_candidates

    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    (tmp_path / "work" / "models" / "mine").mkdir(parents=True)
    (tmp_path / "work" / "models" / "mine" / "config.json").write_text("{}")
    (tmp_path / "work" / "models" / "llama.Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "cache" / "examples").mkdir(parents=True)
    (tmp_path / "cache" / "examples" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    (tmp_path / "cache" / "examples" / ".half.gguf.partial-1").write_bytes(b"GG")
    got = model_candidates(tmp_path / "work")
    assert got == [
        "models/llama.Q4_K_M.gguf",
        "models/mine",
        str(tmp_path / "cache" / "examples" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "example: tiny-adder",  # and the example models by name (picking one gets it: panel/examples.py)
        "example: smollm2-135m-instruct",
    ]


def test_preview_renders_tool_rows_with_their_tools_and_calls(workdir: Path) -> None:
    from nbtrain.examples.tools import tool_model, tool_rows

    tool_model(workdir / "tiny-llama", workdir / "tiny-tools")
    rows = tool_rows(3)
    (workdir / "data" / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pv = data_preview({"model": "./tiny-tools", "data": {"train": "data/tools.jsonl"}}, workdir)
    text = "".join(t for t, _ in pv.rows[0].segments or [])
    assert "You may call: get_weather(city) add(a, b)" in text  # the definitions, from the row's tools
    assert "<call>get_weather {" in text and "<|tool|>" in text  # the call and its result
    assert any(trained and "<call>" in t for t, trained in pv.rows[0].segments or [])  # the call trains
    from nbtrain.ui.panel import preview_html

    shown = preview_html(pv)  # the role-by-role view names the call, not an empty assistant turn
    assert "call</span> get_weather({" in shown
    assert "<details><summary><span style='color:#ef6c00;font-weight:bold'>tools</span>" in shown
    assert "(3: get_weather, add, convert)</small></summary>" in shown  # collapsed to the names
    # open: one signature a line, with the description (3 rows)
    assert (
        shown.count(
            "get_weather(city: string) <span style='color:#777'>today&#x27;s weather in a city</span>"
        )
        == 3
    )


def test_a_newcomer_who_fills_model_and_data_sees_the_plan_and_its_estimate_before_launch(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    """Only model and data filled: the panel shows the plan a %%finetune cell with those two keys would
    make (the same prepare), its memory estimate against this machine, and in the empty training fields
    the values that plan uses (an adapter's 2e-4 learning rate, not TRL's full fine-tuning 2e-5)."""
    import nbtrain

    p = _settled(make_panel())
    assert p.plan_text == [] and p.plan_area.value == ""  # nothing to plan yet
    _fill_basic(p)
    _settled(p)
    assert yaml.safe_load(p.to_yaml()) == {"model": "./tiny-llama", "data": {"train": "data/add.jsonl"}}
    cell = nbtrain.prepare("model: ./tiny-llama\ndata:\n  train: data/add.jsonl\n")
    keys = ("method", "device", "strategy", "precision", "num_processes", "micro_batch", "grad_accum",
            "gradient_checkpointing", "learning_rate", "launcher")  # fmt: skip
    assert {k: getattr(cell.plan, k) for k in keys} == {k: p.planned_plan[k] for k in keys}
    assert p.planned == cell.train_args and cell.train_args["learning_rate"] == 2e-4
    text = "\n".join(p.plan_text)
    assert "Plan: lora sft on cpu, 1 process, fp32" in text, text
    assert "learning rate 0.0002" in text and "Memory: ~" in text and "GiB RAM: fits" in text
    assert "nbtrain-plan" in p.plan_area.value
    assert p.fields["train.learning_rate"].placeholder == "0.0002 (planned)"
    p.fields["train.learning_rate"].value = "1e-4"  # what the user sets wins, and the plan line follows
    _settled(p)
    assert "learning rate 0.0001" in "\n".join(p.plan_text)
    p.fields["model"].value = "./no-such-model"  # not launchable: no plan shown, the defaults come back
    _settled(p)
    assert p.plan_text == [] and p.fields["train.max_steps"].placeholder == "planned: 3 epochs over the data"
