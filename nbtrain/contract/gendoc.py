"""A documentation page generated from code: written by its generator, or checked against it (``--check``,
which the suite runs, so a page never goes stale). docs/config.md (control/config/reference.py) and
docs/plans.md (bench/plan_table.py) are made so."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def write_or_check(doc: Path, text: str, argv: Sequence[str], command: str) -> int:
    """With ``--check`` in ``argv``: 0 when ``doc`` holds ``text``, else 1, saying which ``command`` writes
    it. Without: write it. The exit status of the generator."""
    if "--check" in argv:
        if not doc.exists() or doc.read_text(encoding="utf-8") != text:
            print(f"{doc} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(text, encoding="utf-8")
    print(f"wrote {doc}")
    return 0
