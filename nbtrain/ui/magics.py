"""IPython magics: ``%%finetune`` (a YAML cell) and ``%finetune VERB ...`` (line verbs).

Both are generated from the verb table (nbtrain.ui.verbs), as the ``nbtrain`` command line is: a cell is
the ``run`` verb with the cell body as its config. Errors are raised as ``UsageError`` (shown without a
traceback, and they stop Run All), never printed and swallowed.
"""

from __future__ import annotations

import argparse
import shlex
import threading
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.verb import Verb, VerbUsageError, escape_help
from nbtrain.ui.verbs import VERBS, find, unknown_verb
from nbtrain.ui.verbs.runs import RUN_OPTIONS
from nbtrain.ui.verbs.views import close_views


class _HelpShown(Exception):
    """``-h``/``--help`` printed the help: the magic is done."""


class _Parser(MagicArgumentParser):
    """Errors raise UsageError (IPython's parser); ``--help`` prints and ends the magic instead of
    raising SystemExit in the kernel."""

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise UsageError(message)
        raise _HelpShown

    def error(self, message: str) -> NoReturn:
        """argparse's complaint, in words: what a missing argument is (its help) and the usage."""
        missing = message.removeprefix("the following arguments are required: ")
        if missing != message:
            helps = {a.dest: (a.help or "").replace("%%", "%") for a in self._actions}  # argparse's escapes
            names = [n.strip() for n in missing.split(",")]
            message = f"{self.prog} needs " + " and ".join(
                f"{n} ({helps[n]})" if helps.get(n) else n for n in names
            )
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def _parser(prog: str, description: str) -> _Parser:
    # The plain formatter: IPython's adds reST markup that reads badly in an error message.
    return _Parser(prog=prog, description=description, add_help=True, formatter_class=argparse.HelpFormatter)


def verb_parser(verb: Verb) -> _Parser:
    p = _parser(f"%finetune {verb.name}", escape_help(verb.help))
    verb.add_arguments(p)
    return p


def cell_parser() -> _Parser:
    p = _parser("%%finetune", "Validate, plan and start a fine-tuning run from the YAML body of the cell.")
    for a in RUN_OPTIONS:
        a.add_to(p)
    return p


def _usage() -> str:
    cell = cell_parser().format_usage().strip().removeprefix("usage: ").replace(" [-h]", "")
    lines = [
        f"{cell}   (cell: YAML config)",
        "%finetune VERB ...   (%finetune VERB --help for its options)   verbs:",
    ]
    for verb in VERBS.values():
        usage = verb_parser(verb).format_usage().strip().removeprefix("usage: ").replace(" [-h]", "")
        lines.append(f"  {usage}  -- {verb.help}")
    return "\n".join(lines)


def _verb_call(verb: Verb, args: argparse.Namespace) -> Any:
    try:
        return verb.notebook(verb.call(args), args)
    except VerbUsageError as e:
        raise UsageError(f"{e}\n{verb_parser(verb).format_usage().strip()}") from None


@magics_class
class FinetuneMagics(Magics):
    @line_cell_magic
    def finetune(self, line: str, cell: str | None = None) -> Any:
        try:
            if cell is None:
                return self._line(line)
            return self._cell(line, cell)
        except _HelpShown:
            return None
        except NbtrainError as e:
            raise UsageError(str(e)) from None

    def _line(self, line: str) -> Any:
        words = shlex.split(line)
        if not words:
            raise UsageError(_usage())
        verb = find(words[0])
        if verb is None:
            raise UsageError(f"{unknown_verb(words[0])}\n{_usage()}")
        return _verb_call(verb, verb_parser(verb).parse_args(words[1:]))

    def _cell(self, line: str, cell: str) -> Any:
        args = cell_parser().parse_args(shlex.split(line))
        args.config = cell_config(line, cell)
        return _verb_call(VERBS["run"], args)


def cell_config(line: str, cell: str) -> str:
    """The config text of a ``%%finetune`` cell: its body below a comment that holds the magic's line, so
    that the YAML's line numbers are the cell's own (the ``%%finetune`` line is line 1) in every problem
    the config gets, syntax errors included, and the run's config.yaml is the cell as written. A body that
    is only a .yaml file's name stays that name (load_config reads the file)."""
    body = cell.strip()
    if "\n" not in body and body.endswith((".yaml", ".yml")):
        return body
    return f"# %%finetune {line.strip()}".rstrip() + "\n" + cell


FinetuneMagics.finetune.__doc__ = f"Fine-tune from a notebook.\n\n{_usage()}"


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(FinetuneMagics)
    # The warm process imports the training stack while the user writes the first cell, so that cell's run
    # starts warm (control.warm; NBTRAIN_WARM=0: not at all). In a thread: the kernel does not wait.
    threading.Thread(target=_start_warm, name="nbtrain-warm-start", daemon=True).start()


def _start_warm() -> None:
    try:
        from nbtrain.control.launch import warm

        warm.start()
    except Exception:  # noqa: BLE001 - the first run starts cold then, and says why in its log
        pass


def unload_ipython_extension(ipython: Any) -> None:
    close_views()
    from nbtrain.control.jobs.grading import close_records

    close_records()
