"""A verb's shape: its name, help, arguments (``argparse.add_argument`` specs) and the functions that
answer it on each surface. The table of every verb is ``nbtrain.ui.verbs``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.errors import NbtrainError

Args = argparse.Namespace


class VerbUsageError(NbtrainError):
    """Arguments that parse but do not make a valid request; the surface adds the verb's usage."""


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: option strings (or a positional name) and its keywords."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        options = dict(self.options)
        if "help" in options:
            options["help"] = escape_help(options["help"])
        parser.add_argument(*self.flags, **options)


def escape_help(text: str) -> str:
    """``text`` for argparse, which formats help with ``%``: ``%%finetune`` must stay as written."""
    return text.replace("%", "%%")


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Verb:
    name: str
    help: str
    args: tuple[Arg, ...]
    call: Callable[[Args], Any]
    notebook: Callable[[Any, Args], Any]
    terminal: Callable[[Any, Args], int] | None = None  # None: a notebook verb
    aliases: tuple[str, ...] = ()

    @property
    def notebook_only(self) -> bool:
        return self.terminal is None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for a in self.args:
            a.add_to(parser)

    def option_strings(self) -> set[str]:
        return {f for a in self.args for f in a.flags if f.startswith("-")} | {
            f"--no-{f[2:]}"
            for a in self.args
            if a.options.get("action") is argparse.BooleanOptionalAction
            for f in a.flags
            if f.startswith("--")
        }
