"""The verb table: every verb reaches both surfaces (``%finetune`` and ``nbtrain``) with the same options."""

from __future__ import annotations

import argparse

import pytest

from nbtrain.ui import cli
from nbtrain.ui.magics import _HelpShown, cell_parser, verb_parser
from nbtrain.ui.verb import Verb
from nbtrain.ui.verbs import TABLE, VERBS
from nbtrain.ui.verbs.runs import RUN_OPTIONS


def _shape(parser: argparse.ArgumentParser) -> tuple[set[str], list[str]]:
    """A parser's option strings (without -h/--help) and its positionals, in order."""
    options = {
        s for a in parser._actions if not isinstance(a, argparse._HelpAction) for s in a.option_strings
    }
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    return options, positionals


def _expected(verb: Verb) -> tuple[set[str], list[str]]:
    return verb.option_strings(), [a.flags[0] for a in verb.args if a.positional]


def test_every_verb_reaches_both_surfaces_with_the_same_options() -> None:
    _, cli_parsers = cli.build_parser()
    assert list(cli_parsers) == [v.name for v in TABLE]
    for verb in TABLE:
        magic = _shape(verb_parser(verb))
        terminal = _shape(cli_parsers[verb.name])
        assert magic == terminal == _expected(verb), verb.name
        assert magic[0] or magic[1] or not verb.args, verb.name


def test_the_table_holds_every_verb_either_surface_had() -> None:
    before = {
        # %finetune verbs before the table
        "list", "status", "logs", "stop", "checkpoint", "resume", "attach", "wait", "launch-function",
        "compare", "panel", "estimate", "record", "preview", "serve", "chat", "eval", "export", "tensorboard",
        # nbtrain verbs before the table
        "run", "probe", "tiny-model", "example-data",
    }  # fmt: skip
    assert before <= set(VERBS)
    assert {v.name for v in TABLE if v.notebook_only} == {"launch-function", "panel", "chat"}
    assert VERBS["eval"].option_strings() >= {
        "--batch-size",
        "--compare-base",
        "--file",
        "--tasks",
        "--limit",
    }


def test_a_finetune_cell_takes_the_options_of_the_run_verb() -> None:
    options, positionals = _shape(cell_parser())
    run_options, run_positionals = _expected(VERBS["run"])
    assert positionals == [] and run_positionals == ["config"]
    assert options == run_options == {f for a in RUN_OPTIONS for f in a.flags}


def test_cli_parses_what_the_magic_parses() -> None:
    ap, _ = cli.build_parser()
    words = ["export", "r1", "--to", "out", "--no-merge", "--dtype", "bf16", "--push-to-hub", "me/x"]
    magic = vars(verb_parser(VERBS["export"]).parse_args(words[1:]))
    terminal = vars(ap.parse_args(words))
    assert terminal.pop("cmd") == "export"
    assert magic == terminal
    assert magic["merge"] is False and magic["dtype"] == "bf16" and magic["push_to_hub"] == "me/x"


@pytest.mark.parametrize("verb", [v.name for v in TABLE])
def test_help_of_each_verb_on_both_surfaces(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(_HelpShown):
        verb_parser(VERBS[verb]).parse_args(["--help"])
    magic = capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main([verb, "--help"])
    assert exit_.value.code == 0
    terminal = capsys.readouterr().out
    assert magic.startswith(f"usage: %finetune {verb}") and terminal.startswith(f"usage: nbtrain {verb}")
    for option in VERBS[verb].option_strings():
        assert option in magic and option in terminal
    # help text shows %%finetune as written (argparse formats help with %)
    if "%%finetune" in VERBS[verb].help:
        assert "%%finetune" in magic


@pytest.mark.parametrize("verb", ["chat", "panel", "launch-function"])
def test_a_notebook_verb_in_the_terminal_says_where_to_run_it(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([verb, "anything"]) == 2
    err = capsys.readouterr().err
    assert f"`nbtrain {verb}` is a notebook verb: run `%finetune {verb}` in a notebook" in err


def test_export_without_a_folder_in_the_terminal_is_a_usage_error_naming_to(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:  # in a notebook it opens the export form (test_magics)
        cli.main(["export", "r1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: nbtrain export" in err and "give --to DIR" in err


def test_an_unknown_verb_in_the_terminal_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stauts", "r1"]) == 2
    err = capsys.readouterr().err
    assert "unknown verb 'stauts'. Did you mean 'status'?" in err and "tensorboard" in err


def test_an_alias_reaches_its_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ls"]) == 0 and cli.main(["list"]) == 0
    # (each may say under it what the user's warm processes hold: the suite's own warm process is one)
    runs = [line for line in capsys.readouterr().out.splitlines() if "warm process" not in line]
    assert runs == ["no runs yet", "no runs yet"]


def test_serve_without_a_run_is_a_usage_error_with_the_verb_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: nbtrain serve" in err and "name the RUN to serve" in err
