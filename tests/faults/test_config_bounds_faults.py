"""Fault cases of the config's bounds beyond one value (issue 57): a LoRA layer the model does not have, a
NUL byte in any path or name, a YAML file that is not a config loaded into the panel, a file or run name
holding a line break, and an alias bomb handed to the panel's secret check. Each is refused before anything
starts or is written, saying the cause and the fix; nothing here trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.prepare import validate
from nbtrain.ui.panel import ConfigPanel, yamlfile
from tests.conftest import ROOT, lora_yaml
from tests.faults.test_config_faults import line_of, problem_at


def refused_before_start(config: str, **kwargs: Any) -> None:
    with pytest.raises(ConfigError):
        nbtrain.finetune(config, **kwargs)
    assert nbtrain.runs() == []


# ----------------------------------------------------------------------- 1. LoRA layers the model lacks


@pytest.mark.parametrize(("value", "bad"), [("[999]", "999 is not a layer"), ("[0, -1, 2]", "-1, 2 are not")])
def test_layers_to_transform_past_the_models_layers_is_refused_naming_the_valid_range(
    workdir: Path, value: str, bad: str
) -> None:
    config = lora_yaml(5, extra=f"lora:\n  r: 4\n  layers_to_transform: {value}\n")
    p = problem_at(config, "lora.layers_to_transform")
    assert p.line == line_of(config, "layers_to_transform:"), p
    assert bad in p.message and "it has 2 (its config.json's num_hidden_layers)" in p.message, p.message
    assert "numbered from 0 to 1" in p.message and "leave layers_to_transform out" in p.message
    refused_before_start(config)
    assert validate(lora_yaml(5, extra="lora: {layers_to_transform: [0, 1]}\n")) == []
    assert validate(lora_yaml(5, extra="lora: {layers_to_transform: 1}\n")) == []


def test_a_vision_language_models_layers_are_its_text_configs(vision_workdir: Path) -> None:
    os.chdir(vision_workdir)
    config = (
        "model: ./tiny-llava\nmethod: lora\ndata: {train: data/colours.jsonl}\n"
        "train: {max_steps: 2, per_device_train_batch_size: 4}\nlora: {layers_to_transform: 7}\n"
    )
    config_json = json.loads((vision_workdir / "tiny-llava" / "config.json").read_text())
    assert "num_hidden_layers" not in config_json  # only its text_config (and vision_config) say
    message = problem_at(config, "lora.layers_to_transform").message
    assert "7 is not a layer" in message and "text_config: num_hidden_layers" in message, message
    assert validate(config.replace("layers_to_transform: 7", "layers_to_transform: 1")) == []


# ------------------------------------------------------------------------------- 2. a NUL in a path


def test_a_nul_in_a_dataset_info_file_name_is_a_config_problem(workdir: Path) -> None:
    info = {"adds": {"file_name": "add\u0000.jsonl"}}
    (workdir / "data" / "dataset_info.json").write_text(json.dumps(info))
    config = lora_yaml(5).replace("  train: data/add.jsonl\n", "  train: data/\n  dataset: adds\n")
    p = problem_at(config, "data.dataset")
    assert "file_name 'add\\x00.jsonl' holds a NUL byte" in p.message, p.message
    assert "remove it from" in p.message and "dataset_info.json" in p.message
    refused_before_start(config)


NUL_PLACES = {
    "model": ("", ("model: ./tiny-llama\n", 'model: "./tiny\\0-llama"\n')),
    "data.train": ("", ("  train: data/add.jsonl\n", '  train: "data/add\\0.jsonl"\n')),
    "data.eval": ("", ("  format: auto\n", '  format: auto\n  eval: "data/\\0.jsonl"\n')),
    "data.train.0.path": ("", ("  train: data/add.jsonl\n", '  train: [{path: "data/\\0add.jsonl"}]\n')),
    "chat_template": ('chat_template: "my\\0.jinja"\n', None),
    "train.chat_template_path": (
        "",
        ("  logging_steps: 1\n", '  logging_steps: 1\n  chat_template_path: "a\\0.j2"\n'),
    ),
    "distributed.hostfile": ('distributed: {hostfile: "hosts\\0"}\n', None),
    "rewards.0.model": ('objective: grpo\nrewards: [{model: "./rm\\0"}]\n', None),
}


@pytest.mark.parametrize("where", sorted(NUL_PLACES))
def test_a_nul_in_any_path_is_a_config_problem_at_its_key_not_a_crash(workdir: Path, where: str) -> None:
    extra, swap = NUL_PLACES[where]
    config = lora_yaml(5, extra=extra)
    if swap is not None:
        config = config.replace(*swap)
    p = problem_at(config, where)
    assert "holds a NUL byte" in p.message and "remove the \\0" in p.message, p.message
    assert p.line == line_of(config, "\\0"), p
    refused_before_start(config)


def test_every_nul_and_the_schemas_problems_are_said_at_once(workdir: Path) -> None:
    config = lora_yaml(5, extra='distributed: {hostfile: "h\\0"}\nepochs: 3\n').replace(
        "model: ./tiny-llama", 'model: "./tiny\\0"'
    )
    problems = validate(config)
    assert [p.path for p in problems] == ["model", "distributed.hostfile", "epochs"], problems
    assert "put it under train: as train.num_train_epochs" in problems[2].message


def test_a_config_file_name_with_a_nul_is_a_config_problem(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="holds a NUL byte"):
        nbtrain.finetune(Path("run\0.yaml"))


# ------------------------------------------------------------ 3. a YAML file that is not a config


@pytest.fixture
def panel(workdir: Path) -> Iterator[ConfigPanel]:
    made = ConfigPanel()
    made.fields["model"].value = "./tiny-llama"
    made.fields["data.train"].value = "data/add.jsonl"
    made.fields["train.max_steps"].value = "12"
    assert made.settle(60)
    yield made
    made.close()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("services:\n  web: {image: nginx}\nversion: '3'\n", "none of its keys (services, version)"),
        (lora_yaml(5, extra="epochs: 3\nservices: {}\n"), "line 11: 'epochs' is not a key at the top level"),
        ("model: ./tiny-llama\nmodle: x\n", "line 2: unknown key 'modle'; did you mean 'model'?"),
        ("# nothing but a comment\n", "it is empty"),
    ],
)
def test_loading_a_yaml_file_that_is_not_a_config_leaves_the_form_and_says_why(
    panel: ConfigPanel, workdir: Path, content: str, says: str
) -> None:
    (workdir / "other.yaml").write_text(content)
    before = panel.to_yaml()
    panel.load_ref.value = "other.yaml"
    panel.load_button.click()
    shown = " ".join(panel.general_errors)
    assert "other.yaml was not loaded" in shown and says in shown, shown
    assert panel.to_yaml() == before
    # a config (chat_template: is one of its keys too, read before the schema) still loads
    (workdir / "good.yaml").write_text(
        "model: ./other\ndata: {train: data/add.jsonl}\nchat_template: chatml\n"
    )
    panel.load_ref.value = "good.yaml"
    panel.load_button.click()
    assert "loaded the form from good.yaml" in panel.status_message and not panel.general_errors
    assert panel.fields["model"].value == "./other"


@pytest.mark.parametrize("field", ["model", "data.train"])
def test_a_nul_typed_into_a_panels_path_field_is_that_fields_problem_not_a_traceback(
    panel: ConfigPanel, field: str
) -> None:
    panel.fields[field].value = "./a\0b"
    assert panel.settle(60)
    assert "holds a NUL byte" in panel.problems[field], panel.problems
    assert panel.general_errors == [], panel.general_errors


# ------------------------------------------------------------------- 4. names with a line break


@pytest.mark.parametrize("name", ["two\nlines.yaml", "tab\there.yaml", "nul\0.yaml"])
def test_a_save_name_with_a_control_character_is_refused_and_nothing_is_written(
    panel: ConfigPanel, workdir: Path, name: str
) -> None:
    before = sorted(p.name for p in workdir.iterdir())
    panel.save_row.name.value = name
    panel.save_row.button.click()
    message = panel.save_row.message
    assert panel.save_row.error and "type the name on one line" in message, message
    assert sorted(p.name for p in workdir.iterdir()) == before


def test_a_run_name_ending_in_a_line_break_is_refused(workdir: Path) -> None:
    config = lora_yaml(5, extra='name: "my-run\\n"\n')
    assert "a run name is 1-64 letters" in problem_at(config, "name").message
    refused_before_start(config)
    refused_before_start(lora_yaml(5), name="my-run\n")


# --------------------------------------------------------- 5. an alias bomb in the panel's secret check


BOMB_CHECK = """
import resource, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # the unbounded walk took 13 GB: not here
from nbtrain.ui.panel import saved

# ten levels of ten aliases each: 10**10 values once expanded, 700 bytes as written
bomb = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\\n' + "".join(
    f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]\\n" for i in range(1, 10)
) + "model: ./tiny-llama\\ndata: {train: data/add.jsonl}\\n"
tracemalloc.start()
t0 = time.monotonic()
why = saved.secret_in(bomb)
kept = saved.save(("nb.ipynb", "cell-1"), bomb)
empty = saved.is_empty(bomb)
took = time.monotonic() - t0
print(took, tracemalloc.get_traced_memory()[1], kept, empty)
print(why)
"""


def test_the_panels_secret_check_answers_a_ten_level_alias_bomb_quickly_in_bounded_memory(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOMB_CHECK],
        cwd=ROOT,
        env={**os.environ, "NBTRAIN_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    numbers, why = done.stdout.splitlines()[-2:]
    took, peak, kept, empty = numbers.split()
    assert float(took) < 5 and int(peak) < 50 * 2**20, (took, peak)
    assert (kept, empty) == ("False", "False")  # never kept as a form, never taken for an empty one
    assert "more than 100000 values" in why and "cannot be checked for secrets" in why, why
    assert not (tmp_path / "home" / "panels").exists()
    # read through the bounded reader, a key given twice still has its secrets looked for
    twice = yamlfile.secret_in("model: a\nmodel: b\nwandb_api_key: abcdef123\n")
    assert twice is not None and "'wandb_api_key' holds a secret" in twice


@pytest.mark.parametrize(
    ("module", "pattern", "good"),
    [
        ("nbtrain.control.config.rules.model", "HUB_MODEL", "org/model"),
        ("nbtrain.control.config.datacheck", "_HUB_ID", "org/data"),
        ("nbtrain.control.models.hub", "HUB_ID", "org/model"),
        ("nbtrain.control.jobs.export", "_REPO_ID", "me/merged"),
        ("nbtrain.ui.panel.saved", "_CELL_ID", "a1b2-c3"),
        ("nbtrain.ui.server.handlers", "RUN_ID_RE", "20261206-120000-run-abcd"),
    ],
)
def test_an_id_with_a_trailing_newline_is_not_an_id(module: str, pattern: str, good: str) -> None:
    # `$` also matches before a final newline: "org/x\n" passed as a Hub id, a cell id became a file name
    import importlib

    rx = getattr(importlib.import_module(module), pattern)
    assert rx.match(good) and not rx.match(good + "\n")
