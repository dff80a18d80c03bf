"""Config validation: every bad input gets one clear, aggregated error, and nothing starts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from tests.conftest import lora_yaml


def problems(source: str | dict, **kw) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(source, **kw)
    return [p.render() for p in ei.value.problems]


def nothing_started(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_valid_config_resolves_paths_and_defaults(workdir: Path) -> None:
    res = load_config(lora_yaml())
    cfg = res.config
    assert Path(cfg.model) == (workdir / "tiny-llama").resolve()
    assert Path(cfg.data.train).is_absolute()
    assert cfg.lora is not None and cfg.lora.r == 8
    assert res.train_data.format == "messages"
    assert res.model_kind == "local"


def test_unknown_top_level_key_suggests_close_match(workdir: Path) -> None:
    out = problems(lora_yaml() + "methd: lora\n")
    assert len(out) == 1
    assert "unknown key 'methd'" in out[0] and "did you mean 'method'" in out[0]
    assert "line 11" in out[0]


def test_unknown_train_key_suggests_trl_name_with_yaml_line(workdir: Path) -> None:
    text = lora_yaml().replace("  learning_rate:", "  lerning_rate:")
    out = problems(text)
    assert len(out) == 1
    assert "train.lerning_rate" in out[0]
    assert "did you mean 'learning_rate'" in out[0]
    assert "line 8" in out[0] and "lerning_rate: 3.0e-3" in out[0]


def test_renamed_keys_point_to_the_current_trl_name(workdir: Path) -> None:
    out = problems(
        lora_yaml(extra="  max_seq_length: 128\n").replace("logging_steps: 1\n", "logging_steps: 1\n")
    )
    assert any("did you mean 'max_length'" in p for p in out)


def test_managed_key_says_where_it_lives(workdir: Path) -> None:
    out = problems(lora_yaml().replace("  logging_steps: 1", "  output_dir: /tmp/x"))
    assert "output_dir" in out[0] and "<run dir>/checkpoints" in out[0]


def test_wrong_types_are_reported_together(workdir: Path) -> None:
    text = lora_yaml().replace("max_steps: 30", "max_steps: thirty") + "lora: {r: big}\n"
    out = problems(text)
    assert len(out) == 2, out
    joined = "\n".join(out)
    assert "train.max_steps" in joined and "'thirty'" in joined and "an integer" in joined
    assert "lora.r" in joined and "'big'" in joined


def test_enum_value_lists_allowed_choices(workdir: Path) -> None:
    out = problems(lora_yaml().replace("format: auto", "format: alpacca"))
    assert "data.format" in out[0] and "did you mean 'alpaca'" in out[0] and "sharegpt" in out[0]
    out = problems(lora_yaml(extra="  lr_scheduler_type: cosin\n"))
    assert "lr_scheduler_type" in out[0] and "cosine" in out[0]


def test_missing_model_path_names_the_path(workdir: Path) -> None:
    out = problems(lora_yaml().replace("./tiny-llama", "./tiny-lama"))
    assert "model path not found" in out[0] and "tiny-lama" in out[0]
    assert "did you mean './tiny-llama'?" in out[0]  # as the config writes it, not the absolute path


def test_model_dir_without_config_json_is_rejected(workdir: Path) -> None:
    (workdir / "empty-model").mkdir()
    out = problems(lora_yaml().replace("./tiny-llama", "./empty-model"))
    assert "no config.json" in out[0]


def test_missing_data_file(workdir: Path) -> None:
    out = problems(lora_yaml().replace("data/add.jsonl", "data/adds.jsonl"))
    assert "data file not found" in out[0] and "did you mean" in out[0]


def test_empty_data_file(workdir: Path) -> None:
    (workdir / "data" / "empty.jsonl").write_text("")
    out = problems(lora_yaml().replace("data/add.jsonl", "data/empty.jsonl"))
    assert "data file is empty" in out[0]
    (workdir / "data" / "blank.jsonl").write_text("\n\n")
    out = problems(lora_yaml().replace("data/add.jsonl", "data/blank.jsonl"))
    assert "no rows" in out[0]


def test_rows_matching_no_format_show_the_offending_row(workdir: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"question": "what?", "answer": "that"},
    ]
    (workdir / "data" / "odd.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = problems(lora_yaml().replace("data/add.jsonl", "data/odd.jsonl"))
    assert "row 2" in out[0] and '"question": "what?"' in out[0]
    # ({"question", "answer"} is ms-swift's single turn now, an alpaca row: contract/formats_peers.py)
    (workdir / "data" / "odd2.jsonl").write_text(json.dumps({"ask": "q", "reply": "a"}) + "\n")
    out = problems(lora_yaml().replace("data/add.jsonl", "data/odd2.jsonl"))
    assert "matches no known format" in out[0] and "instruction" in out[0]


def test_invalid_json_line_is_named(workdir: Path) -> None:
    (workdir / "data" / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    out = problems(lora_yaml().replace("data/add.jsonl", "data/broken.jsonl"))
    assert "line 2" in out[0] and "not valid JSON" in out[0]


def test_yaml_syntax_error_gives_line(workdir: Path) -> None:
    text = lora_yaml().replace("  max_steps: 30", "  max_steps: [30")
    out = problems(text)
    assert "YAML syntax error" in out[0] and "line" in out[0]


def test_yaml_is_parsed_safely(workdir: Path) -> None:
    out = problems(lora_yaml() + "x: !!python/object/apply:os.system ['true']\n")
    assert "YAML" in out[0]


def test_qlora_without_loadable_bitsandbytes_is_rejected(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = workdir / "fake_site"
    (fake / "bitsandbytes").mkdir(parents=True)
    (fake / "bitsandbytes" / "__init__.py").write_text(
        "raise ImportError('libbitsandbytes_cpu.so: broken')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(fake) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(fake))
    out = problems(lora_yaml(method="qlora"))
    assert "method: qlora needs bitsandbytes" in out[0] and "cannot load" in out[0]
    assert "libbitsandbytes_cpu.so: broken" in out[0]
    assert "bitsandbytes" not in sys.modules or not hasattr(sys.modules["bitsandbytes"], "broken")


def test_method_sections_must_match_the_method(workdir: Path) -> None:
    out = problems(lora_yaml(method="full") + "lora: {r: 4}\nquantization: {bits: 4}\n")
    joined = "\n".join(out)
    assert "method: full" in joined and "quantization: applies to method: qlora" in joined


def test_eval_strategy_without_eval_data(workdir: Path) -> None:
    out = problems(lora_yaml(extra="  eval_strategy: steps\n"))
    assert "needs eval data" in out[0]


def test_eval_path_and_split_together_are_rejected(workdir: Path) -> None:
    text = lora_yaml().replace("  format: auto", "  format: auto\n  eval_split: 0.1\n  eval: data/add.jsonl")
    out = problems(text)
    assert "either eval" in out[0]


def test_run_names_cannot_escape_the_runs_root(workdir: Path) -> None:
    for bad in ("../x", "/etc", "a/b", ".hidden", "x" * 65):
        out = problems(lora_yaml(), name=bad)
        assert "run name" in out[0]


def test_dict_config_is_accepted(workdir: Path) -> None:
    res = load_config({"model": "./tiny-llama", "data": {"train": "data/add.jsonl"}})
    assert res.config.method == "lora"


def test_config_file_path_is_read(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml())
    assert load_config("c.yaml").config.train["max_steps"] == 30
    out = problems("nope.yaml")
    assert "config file not found" in out[0]


def test_invalid_config_starts_nothing_and_writes_no_run_dir(workdir: Path) -> None:
    with pytest.raises(ConfigError):
        nbtrain.finetune(lora_yaml().replace("max_steps: 30", "max_steps: -x"))
    nothing_started(workdir)
    assert nbtrain.runs() == []


def test_an_exponent_without_a_dot_is_a_number_as_yaml_1_2_and_the_panel_read_it(workdir: Path) -> None:
    res = load_config(lora_yaml().replace("3.0e-3", "3e-3") + "lora: {dropout: 5e-2}\n")
    assert res.config.train["learning_rate"] == 0.003 and res.config.lora.dropout == 0.05  # type: ignore[union-attr]
    out = "\n".join(problems(lora_yaml().replace("3.0e-3", '"3e-3"')))  # quoted: text, and said so
    assert "'3e-3' is text; write it as a number, without quotes" in out


def test_a_model_path_in_an_unknown_users_home_is_a_problem_not_a_crash(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="no home folder is known for that user"):
        load_config(lora_yaml().replace("./tiny-llama", "~nbtrain-no-such-user/model"))


def test_mask_history_with_every_token_trained_is_refused_naming_both_keys(workdir: Path) -> None:
    text = lora_yaml(extra="  assistant_only_loss: false\n").replace(
        "  format: auto\n", "  format: auto\n  mask_history: true\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(text)
    assert "data.mask_history" in str(e.value) and "assistant_only_loss: false" in str(e.value)
    assert load_config(lora_yaml().replace("  format: auto\n", "  format: auto\n  mask_history: true\n"))
