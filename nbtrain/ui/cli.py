"""``nbtrain`` command line: the verbs of ``%finetune``, generated from the same verb table
(nbtrain.ui.verbs), over the same control functions.

    nbtrain run CONFIG.yaml [--name N] [--dry-run] [--wait]
    nbtrain list | status RUN | logs RUN [-n N] | stop RUN | wait RUN | attach RUN | ...
    nbtrain VERB --help

A notebook verb (panel, chat, launch-function) is listed, and says where to run it.
Exit codes: 0 done, 1 failed (or the run did not complete), 2 bad usage or config, 3 timed out.
"""

from __future__ import annotations

import argparse
import sys

from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.ui.verb import Verb, VerbUsageError, escape_help
from nbtrain.ui.verbs import TABLE, find, notebook_only_message, unknown_verb


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``nbtrain`` parser, and the sub-parser of each verb by name."""
    ap = argparse.ArgumentParser(prog="nbtrain", description="Fine-tune LLMs; runs live in run directories.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="VERB")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for verb in TABLE:
        help_ = f"(notebook verb) {verb.help}" if verb.notebook_only else verb.help
        help_ = escape_help(help_)
        p = sub.add_parser(verb.name, aliases=list(verb.aliases), help=help_, description=help_)
        verb.add_arguments(p)
        parsers[verb.name] = p
    return ap, parsers


def _run(verb: Verb, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    assert verb.terminal is not None
    try:
        return verb.terminal(verb.call(args), args)
    except VerbUsageError as e:
        parser.error(str(e))  # exits 2 with the verb's usage


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap, parsers = build_parser()
    if argv and not argv[0].startswith("-"):
        verb = find(argv[0])
        if verb is None:
            ap.print_usage(sys.stderr)
            print(f"nbtrain: {unknown_verb(argv[0])}", file=sys.stderr)
            return 2
        if verb.notebook_only and not {"-h", "--help"} & set(argv[1:]):
            print(notebook_only_message(verb), file=sys.stderr)
            return 2
    args = ap.parse_args(argv)
    verb = find(args.cmd)
    assert verb is not None
    try:
        return _run(verb, parsers[verb.name], args)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except NbtrainError as e:
        print(f"nbtrain: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
