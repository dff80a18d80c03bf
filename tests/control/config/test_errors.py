"""Config errors as a person reads them: one message per mistake, YAML syntax errors in plain words at
the line and column to fix, did-you-mean for every list of values (TRL's and transformers' too) without a
wall of names, keys written in the wrong section pointed to their place, and duplicate keys refused.
Fast: nothing here trains or starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.control.config import trainargs
from nbtrain.control.config.load import load_config
from nbtrain.control.config.preset import load_preset
from nbtrain.control.config.yamlsafe import DuplicateKeys, YamlSyntax, load_yaml
from tests.conftest import lora_yaml

# The parser's own terms, which say nothing to a person writing a config.
JARGON = ("mapping values", "block end", "block mapping", "scanning", "simple key", "token", "stream")


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as ei:
        load_config(text)
    return ei.value.problems


def only_problem(text: str) -> Problem:
    found = problems_of(text)
    assert len(found) == 1, [p.render() for p in found]
    return found[0]


# ------------------------------------------------------------------------ one message per mistake


def test_a_value_no_branch_of_a_union_takes_is_one_problem_at_the_key_written(workdir: Path) -> None:
    p = only_problem(lora_yaml().replace("  format: auto\n", "  format: auto\n  eval_split: abc\n"))
    assert p.path == "data.eval_split" and p.line == 6
    assert "a fraction between 0 and 1 (0.1) or a number of rows (200)" in p.message
    p = only_problem(lora_yaml(extra="distributed: {num_processes: lots}\n"))
    assert p.path == "distributed.num_processes"
    assert "'lots' is not valid here: expected 'auto' or an integer" in p.message
    p = only_problem(lora_yaml(extra="distributed: {num_processes: autp}\n"))
    assert "did you mean 'auto'?" in p.message


def test_a_list_source_missing_its_path_is_one_problem_under_the_source(workdir: Path) -> None:
    p = only_problem(lora_yaml().replace("train: data/add.jsonl", "train: [{weight: 1}]"))
    assert p.path == "data.train.0.path" and "required key is missing" in p.message


# ------------------------------------------------------------------------ YAML syntax, plain words


def body_with(bad: str, good: str = "  format: auto\n") -> str:
    text = lora_yaml()
    assert good in text
    return text.replace(good, bad)


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        (body_with("    format: auto\n"), 5, 5, "indented more than the one above it"),
        ("data:\n    train: a\n  format: b\n", 3, 3, "indented 2 spaces, which lines up with nothing above"),
        (body_with("\tformat: auto\n"), 5, 1, "a tab character: YAML indents with spaces only"),
        ("model: x\ndata\n  train: a\n", 2, 1, "'data' has no ':' after it"),
        (
            "model: x\ndata:\n  train: 'a.jsonl\n",
            3,
            10,
            "the quote (') that opens this value is never closed",
        ),
        ("model: x\nrewards: [a, b\ndata: {train: a}\n", 2, 10, "the '[' opened here is never closed"),
        ("model: x\nrewards: - a\n", 2, 10, "a list item ('- ') cannot follow a key on the same line"),
        ("model:x\ndata:\n  train: a\n", 1, 7, "'model:x' needs a space after the colon"),
        ("model: a: b\n", 1, 9, "a value that holds ': ' goes in quotes"),
        ("model: x\n---\nmodel: y\n", 2, 1, "a second YAML document starts here"),
        ("model: @x\n", 1, 8, "put the value in quotes"),
        ("model: *base\n", 1, 8, "*base names no anchor (&base)"),
    ],
)
def test_yaml_syntax_errors_say_what_is_wrong_in_plain_words_at_line_and_column(
    workdir: Path, text: str, line: int, column: int, words: str
) -> None:
    p = only_problem(text)
    assert (p.line, p.column) == (line, column), p.render()
    assert words in p.message, p.message
    assert p.message.startswith("YAML syntax error: ")
    assert not any(j in p.message for j in JARGON), p.message
    assert p.source == text.splitlines()[line - 1]
    assert f"(line {line}, column {column}: " in p.render()


def test_a_python_object_tag_is_refused_in_words(workdir: Path) -> None:
    p = only_problem(lora_yaml() + "x: !!python/object/apply:os.system ['true']\n")
    assert "the tag !!python/object/apply:os.system is not read" in p.message and p.line == 11


# ------------------------------------------------------------------ did-you-mean for every enum


def names_in(message: str, choices: tuple[str, ...]) -> set[str]:
    words = set(message.replace(",", " ").replace("?", " ").replace("(", " ").replace(")", " ").split())
    return words & set(choices)


def test_trl_and_transformers_enums_get_a_did_you_mean_and_never_a_wall_of_names(workdir: Path) -> None:
    optim = trainargs.fields_for("sft")["optim"].choices or ()
    assert len(optim) > 20  # the wall this test keeps out of messages
    p = only_problem(lora_yaml(extra="  lr_scheduler_type: cosin\n"))
    assert p.path == "train.lr_scheduler_type"
    assert "did you mean cosine?" in p.message
    p = only_problem(lora_yaml(extra="  optim: adamw\n"))
    assert "did you mean" in p.message and "adamw_torch" in p.message
    assert len(names_in(p.message, optim)) <= 4, p.message
    p = only_problem(lora_yaml(extra="  optim: quantum\n"))  # nothing close: a count and a few names
    assert "one of 41 names" in p.message.replace(str(len(optim)), "41")
    assert len(names_in(p.message, optim)) <= 4, p.message
    p = only_problem(lora_yaml(extra="  eval_strategy: step\n  eval_steps: 5\n"))
    assert "did you mean steps?" in p.message and "epoch, no, steps" in p.message  # few: all shown


def test_nbtrains_own_enums_get_a_did_you_mean(workdir: Path) -> None:
    p = only_problem(lora_yaml(extra="lora: {bias: nne}\n"))
    assert "did you mean 'none'?" in p.message
    p = only_problem(lora_yaml(extra="distributed: {strategy: zero-3}\n"))
    assert "did you mean 'zero3'?" in p.message
    p = only_problem(lora_yaml().replace("method: lora", "method: qlor"))
    assert "did you mean 'qlora'?" in p.message


# ----------------------------------------------------------------- keys that belong elsewhere


@pytest.mark.parametrize(
    ("extra", "path", "advice"),
    [
        ("epochs: 3\n", "epochs", "put it under train: as train.num_train_epochs"),
        ("num_train_epochs: 3\n", "num_train_epochs", "put it under train: as train.num_train_epochs"),
        ("learning_rate: 1.0e-4\n", "learning_rate", "put it under train: as train.learning_rate"),
        ("r: 16\n", "r", "put it under lora: as lora.r"),
        ("lora_alpha: 32\n", "lora_alpha", "put it under lora: as lora.alpha"),
        ("strategy: zero2\n", "strategy", "put it under distributed: as distributed.strategy"),
        ("eval_split: 0.1\n", "eval_split", "put it under data: as data.eval_split"),
        ("partition: gpu\n", "partition", "put it under distributed: slurm: as distributed.slurm.partition"),
        (
            "lora: {learning_rate: 1.0e-4}\n",
            "lora.learning_rate",
            "put it under train: as train.learning_rate",
        ),
        ("  r: 16\n", "train.r", "put it under lora: as lora.r"),
        ("  model: x\n", "train.model", "put it at the top level, as model:"),
    ],
)
def test_a_key_in_the_wrong_section_is_pointed_to_where_it_belongs(
    workdir: Path, extra: str, path: str, advice: str
) -> None:
    p = only_problem(lora_yaml(extra=extra))
    assert p.path == path and advice in p.message, p.render()
    assert "Allowed here" not in p.message


# --------------------------------------------------------------------------------- duplicate keys


def test_a_key_given_twice_is_refused_naming_both_lines(workdir: Path) -> None:
    p = only_problem(lora_yaml() + "method: qlora\n")
    assert (p.path, p.line, p.column) == ("method", 11, 1)
    assert "on line 2 and again on line 11" in p.message and "remove one" in p.message
    text = lora_yaml().replace("  logging_steps: 1\n", "  logging_steps: 1\n  max_steps: 5\n")
    p = only_problem(text)
    assert (p.path, p.line) == ("train.max_steps", 11) and "on line 7 and again on line 11" in p.message
    two = problems_of(lora_yaml() + "model: ./other\nmethod: full\n")
    assert [q.path for q in two] == ["model", "method"]  # each duplicate is its own problem


def test_yaml_that_merges_or_aliases_keys_is_not_a_duplicate() -> None:
    assert load_yaml("base: &b {r: 4, alpha: 8}\nlora:\n  <<: *b\n  r: 2\nagain: *b\n") == {
        "base": {"r": 4, "alpha": 8},
        "lora": {"r": 2, "alpha": 8},
        "again": {"r": 4, "alpha": 8},
    }
    with pytest.raises(DuplicateKeys, match=r"'1\.0' is given twice"):
        load_yaml("a:\n  1: x\n  1.0: y\n")  # one key once built: the second would replace the first


def test_a_preset_with_a_duplicate_key_or_a_syntax_error_names_the_line(tmp_path: Path) -> None:
    preset = tmp_path / "nbtrain.lab.yaml"
    preset.write_text("methods: [lora]\nmethods: [full]\n")
    with pytest.raises(ConfigError, match=r"'methods' is given twice.*line 1 and again on line 2"):
        load_preset(preset)
    preset.write_text("methods: [lora\n")
    with pytest.raises(ConfigError, match=r"'\[' opened here is never closed.*\(line 1, column 10\)"):
        load_preset(preset)
    with pytest.raises(YamlSyntax):
        load_yaml("a:\n\tb: 1\n")
