"""A panel's form kept across kernel restarts: the YAML it holds, saved per notebook cell.

A panel shown by a notebook cell saves its form (the YAML a ``%%finetune`` cell would hold) as it changes,
under ``$NBTRAIN_HOME/panels/<notebook>/<cell id>.yaml`` (mode 0600). After a kernel restart the same cell
showing an empty panel (``nbtrain.panel()``) gets that form back. The notebook is the session path Jupyter
gives the kernel (``JPY_SESSION_NAME``), the cell the id JupyterLab and Notebook 7 send with each execution;
outside a notebook (a script, a console) nothing is saved. A form holding anything that looks like a secret
is not written (and an older file of that cell is removed): nbtrain writes no secret to disk.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import yaml

from nbtrain.contract.paths import home_dir
from nbtrain.contract.rundir import atomic_write_text
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.rules.secrets import HF_TOKEN_VALUE, SECRET_ADVICE, secret_problems
from nbtrain.control.config.yamlsafe import DuplicateKeys, YamlLimit, YamlProblem, load_yaml

MAX_BYTES = 256 * 1024  # a form's YAML is a few hundred bytes; anything far past that is not kept
_CELL_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}\Z")


def cell_key() -> tuple[str, str] | None:
    """(notebook, cell id) of the cell running now, or None outside a notebook cell."""
    notebook = os.environ.get("JPY_SESSION_NAME")
    if not notebook:
        return None
    try:
        from IPython.core.getipython import get_ipython

        shell = get_ipython()
        parent = shell.get_parent() if shell is not None and hasattr(shell, "get_parent") else None
    except Exception:  # noqa: BLE001 - no kernel, no cell: nothing is kept
        return None
    cell = ((parent or {}).get("metadata") or {}).get("cellId")
    if not isinstance(cell, str) or not _CELL_ID.match(cell):
        return None
    return notebook, cell


def path_of(key: tuple[str, str]) -> Path:
    notebook, cell = key
    folder = hashlib.sha256(notebook.encode()).hexdigest()[:16]
    return home_dir() / "panels" / folder / f"{cell}.yaml"


def load(key: tuple[str, str] | None) -> str | None:
    """The form the cell held last, or None."""
    if key is None:
        return None
    try:
        p = path_of(key)
        if p.stat().st_size > MAX_BYTES:
            return None
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return None if is_empty(text) else text


def _empty(value: object) -> bool:
    """A form with no value filled in (an empty panel's YAML is ``data: {}``)."""
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    if isinstance(value, list):
        return all(_empty(v) for v in value)
    return value is None or value == ""


_NOT_YAML = object()  # what ``_parsed`` returns for text that is not YAML (yet: a form being typed)


def _parsed(text: str) -> object:
    """``text`` read through the one YAML reader (config/yamlsafe: size and alias expansion bounded, so an
    alias bomb is refused, never walked): its value, the ``YamlLimit`` that refused it, or ``_NOT_YAML``
    (a syntax error). A key given twice is no reason to miss a secret
    in it: that is looked for once the expansion was counted, so the plain safe read after it is bounded."""
    try:
        return load_yaml(text)
    except DuplicateKeys:
        return yaml.safe_load(text)
    except YamlLimit as e:  # an alias bomb, nesting too deep, over 1 MiB: said as such
        return e
    except YamlProblem:
        return _NOT_YAML


def is_empty(text: str) -> bool:
    raw = _parsed(text)
    return not text.strip() if raw is _NOT_YAML else not isinstance(raw, YamlLimit) and _empty(raw)


def _secret_of(raw: object, text: str) -> str | None:
    """Why ``text`` (parsed: ``raw``, or what ``_parsed`` says when it is not read) must not be written, or
    None: the config's own secret rule on a mapping, a Hugging Face token anywhere in anything else."""
    if not isinstance(raw, dict):
        found = HF_TOKEN_VALUE.search(text)
        return f"this value holds a Hugging Face token: {SECRET_ADVICE}" if found else None
    probs = Problems(text)
    secret_problems(raw, probs)
    return probs.items[0].message if probs.items else None


def secret_in(text: str) -> str | None:
    """Why ``text`` must not be written to disk (a token or a secret-named key in it, or YAML past what the
    reader reads, which cannot be looked through for one), or None."""
    raw = _parsed(text)
    if isinstance(raw, YamlLimit):
        return f"{raw}; a form nbtrain cannot read cannot be checked for secrets either"
    return _secret_of(raw, text)


def _keep(text: str) -> bool:
    """Whether ``text`` is a form to keep: not empty, not too big, and no secret in it (parsed once)."""
    if len(text.encode()) > MAX_BYTES:
        return False
    raw = _parsed(text)
    if isinstance(raw, YamlLimit):  # never a form: nothing a panel could show again
        return False
    if raw is _NOT_YAML:  # kept as typed, unless a token shows in it
        return bool(text.strip()) and _secret_of(raw, text) is None
    return not _empty(raw) and _secret_of(raw, text) is None


def save(key: tuple[str, str] | None, text: str) -> bool:
    """Keep ``text`` as the cell's form (an empty form removes it); False when it is not kept."""
    if key is None:
        return False
    p = path_of(key)
    if not _keep(text):
        p.unlink(missing_ok=True)
        return False
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_text(p, text)
    except OSError:
        return False
    return True


__all__ = ["cell_key", "load", "path_of", "save", "secret_in"]
