"""Errors a user sees. Each names the cause and the fix; config problems are collected, not raised singly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class NbtrainError(Exception):
    """Base class for errors nbtrain reports to a user (the magics show them without a traceback)."""


@dataclass(frozen=True)
class Problem:
    path: str  # key path as the user wrote it, e.g. "train.lerning_rate"; "" for the whole config
    message: str  # what is wrong and how to fix it
    line: int | None = None  # 1-based line in the YAML body, where known
    source: str | None = None  # that line's text
    column: int | None = None  # 1-based column in that line, where it matters (YAML syntax errors)

    def render(self) -> str:
        where = self.path or "config"
        at = f"line {self.line}" + (f", column {self.column}" if self.column else "")
        loc = (
            f" ({at}: {self.source.strip()!r})"
            if self.line and self.source
            else (f" ({at})" if self.line else "")
        )
        return f"- {where}{loc}: {self.message}"


class ConfigError(NbtrainError):
    """One or more problems in a run config; nothing was started and nothing was written."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        n = len(self.problems)
        head = f"Invalid nbtrain config: {n} problem{'s' if n != 1 else ''}. Nothing was started."
        super().__init__("\n".join([head, *(p.render() for p in self.problems)]))


class RunNotFound(NbtrainError):
    pass


class RunFailed(NbtrainError):
    """Raised by ``Run.wait()`` when the run ended in ``failed``."""


class RowError(ValueError):
    """A data row does not match its format; the message says what is wrong with it and how to fix it
    (``nbtrain.contract.formats`` and the modules it uses raise it; the kernel and the worker name the
    row)."""
