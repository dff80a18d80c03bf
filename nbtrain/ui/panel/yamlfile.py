"""A panel's form saved to, and loaded from, a YAML file the user names: the file a ``%%finetune`` cell, the
``nbtrain`` command line or another notebook can use as it is.

Saving writes the form's YAML (what the panel shows beside it) to a ``.yaml``/``.yml`` path, relative to the
notebook's folder. An existing file is replaced only when asked again (the button says so); the folder must
exist; a form holding anything that looks like a secret is not written (nbtrain writes no secret to disk);
the file is written whole or not at all (a temporary file renamed over it). Loading goes through the one
config reader (``parse_source``), so a file the panel loads is read exactly as ``%%finetune`` would read it.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets
from pydantic import ValidationError

from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.contract.rundir import atomic_write_text
from nbtrain.control.config.load import parse_source
from nbtrain.control.config.problems import Problems, schema_problems
from nbtrain.control.config.schema import RunConfig
from nbtrain.ui.panel.saved import secret_in

SUFFIXES = (".yaml", ".yml")
BUTTON_WIDTH = "100px"  # "Replace" with its icon fits


def is_yaml_name(ref: str) -> bool:
    """Whether what the user typed names a YAML file (rather than a run)."""
    return ref.strip().lower().endswith(SUFFIXES)


def _shown(p: Path, base: Path) -> str:
    """``p`` as the user would type it: relative to the notebook's folder when it lies below it."""
    try:
        return str(p.relative_to(base))
    except ValueError:
        return str(p)


def control_character(name: str) -> str | None:
    """What in ``name`` no file name typed in a box should hold: a line break, a tab, a NUL byte or another
    control character (a name holding one is a file no one can type or list plainly, or none at all)."""
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    if bad is None:
        return None
    return {"\n": "a line break", "\r": "a line break", "\t": "a tab", "\0": "a NUL byte"}.get(
        bad, f"the control character {bad!r}"
    )


def target(name: str, base: Path) -> Path:
    """The file ``name`` (relative to ``base``) would be saved to. Raises NbtrainError naming the fix."""
    name = name.strip()
    if not name:
        raise NbtrainError("type a file name next to Save, such as my-run.yaml")
    bad = control_character(name)
    if bad is not None:
        raise NbtrainError(
            f"the file name {name!r} holds {bad}: type the name on one line, such as my-run.yaml"
        )
    if not is_yaml_name(name):
        raise NbtrainError(f"{name!r} is not a YAML file name: end it with .yaml (for example {name}.yaml)")
    p = Path(name).expanduser()
    p = p if p.is_absolute() else base / p
    if p.is_dir():
        raise NbtrainError(f"{_shown(p, base)} is a folder: type a file name inside it")
    if not p.parent.is_dir():
        raise NbtrainError(
            f"the folder {_shown(p.parent, base)} does not exist: create it first, "
            "or save next to the notebook"
        )
    return p


# A config's top-level keys: the schema's, and chat_template: (read by load_config before the schema).
CONFIG_KEYS = frozenset({*RunConfig.model_fields, "chat_template"})


def not_a_config(raw: Any, text: str) -> str | None:
    """Why ``raw`` (``text`` as the config reader read it) is not an nbtrain config, or None: empty, not a
    mapping, none of a config's keys, or keys a config does not have (said by the schema, with lines)."""
    if raw is None:
        return "it is empty; a config holds at least model: and data: train:"
    if not isinstance(raw, dict):
        return f"it holds a {type(raw).__name__}: the config must be a mapping of keys (model:, data:, ...)"
    unknown = [k for k in raw if k not in CONFIG_KEYS]
    if len(unknown) == len(raw):
        shown = ", ".join(str(k) for k in unknown[:8]) + (", ..." if len(unknown) > 8 else "")
        return (
            f"it is not an nbtrain config: none of its keys ({shown}) is one of a config's (model:, data:, "
            f"train:, lora:, ...)"
        )
    if not unknown:
        return None
    probs = Problems(text)
    try:
        RunConfig.model_validate(raw)
    except ValidationError as e:
        schema_problems(e, raw, probs)
    said = [p for p in probs.items if p.path in {str(k) for k in unknown}]
    return "it is not an nbtrain config as it is: " + "; ".join(
        (f"line {p.line}: " if p.line else "") + p.message for p in said
    )


def read(name: str, base: Path) -> dict[str, Any]:
    """The config in the YAML file ``name`` (relative to ``base``), read by the one config reader as a
    ``%%finetune`` cell holding its name would be, for the panel's Load. Raises NbtrainError naming the file
    and why it is not loaded: not there, unreadable, not YAML, or not an nbtrain config (``not_a_config``)."""
    name = name.strip()
    bad = control_character(name)
    if bad is not None:
        raise NbtrainError(f"{name!r} was not loaded: the file name holds {bad}")
    p = Path(name).expanduser()
    try:
        raw, text, _ = parse_source(p if p.is_absolute() else base / p)
    except ConfigError as e:
        raise NbtrainError(f"{name} was not loaded: {'; '.join(q.message for q in e.problems)}") from None
    except OSError as e:
        raise NbtrainError(f"{name} was not loaded: {e.strerror or e}") from None
    why = not_a_config(raw, text)
    if why is not None:
        raise NbtrainError(f"{name} was not loaded: {why}")
    return raw


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, for every thread at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def save(text: str, p: Path, base: Path, *, replace: bool = False) -> None:
    """Write the form's YAML ``text`` to ``p`` (from ``target``; ``base``: the notebook's folder, to name it).
    Raises FileExistsError when the file exists and ``replace`` is not set, NbtrainError when it cannot or
    must not be written."""
    why = secret_in(text)
    if why is not None:
        raise NbtrainError(f"not saved: {why}")
    if p.exists() and not replace:
        raise FileExistsError(str(p))
    try:
        mode = p.stat().st_mode & 0o777 if p.exists() else 0o666 & ~_umask()
        atomic_write_text(p, text if text.endswith("\n") else text + "\n", mode=mode)
    except OSError as e:
        raise NbtrainError(f"could not write {_shown(p, base)}: {e.strerror or e}") from None


class SaveRow:
    """The panel's Save row: a file name and a button that writes the form there, with what happened said
    right below it. A name that exists turns the button into Replace (ask again); editing the name asks
    again."""

    def __init__(self, form: Callable[[], str], problems: Callable[[], int]) -> None:
        self._form, self._problems = form, problems
        self.name = widgets.Text(
            placeholder="my-run.yaml", layout=widgets.Layout(flex="1 1 auto", width="auto", max_width="260px")
        )
        self.button = widgets.Button(
            description="Save",
            icon="save",
            tooltip="write the form's YAML to this file (beside the notebook unless a folder is given)",
            layout=widgets.Layout(flex="0 0 auto", width=BUTTON_WIDTH),
        )
        self.note = widgets.HTML("")
        self.message = ""  # what the note says, as text
        self.error = False
        row = widgets.HBox([self.name, self.button], layout=widgets.Layout(align_items="center"))
        self.widget = widgets.VBox([row, self.note])
        self._replace: Path | None = None  # the existing file the next click replaces
        self.name.observe(lambda _change: self._arm(None), names="value")
        self.button.on_click(lambda _button: self.click())

    def _arm(self, path: Path | None) -> None:
        self._replace = path
        self.button.description = "Replace" if path else "Save"
        self.button.button_style = "warning" if path else ""

    def _say(self, message: str, error: bool = False) -> None:
        self.message, self.error = message, error
        color = "#c62828" if error else "var(--jp-ui-font-color1, #424242)"
        style = f"font-size:12px;line-height:1.35;color:{color}"
        self.note.value = f"<div style='{style}'>{html.escape(message)}</div>"

    def click(self) -> None:
        """Save, saying what happened below the row (a widget's click has no cell to fail in)."""
        try:
            self.save()
        except NbtrainError as e:
            self._say(str(e), error=True)
        except Exception as e:  # noqa: BLE001 - said below the row, not lost in the kernel's log
            self._say(f"unexpected error: {type(e).__name__}: {e}", error=True)

    def save(self) -> None:
        name, base = self.name.value.strip(), Path.cwd()
        path = target(name, base)
        try:
            save(self._form(), path, base, replace=path == self._replace)
        except FileExistsError:
            self._arm(path)
            self._say(f"{name} exists: press Replace to write the form over it")
            return
        self._arm(None)
        left = self._problems()
        still = f" ({left} problem{'s' if left != 1 else ''} still marked in the form)" if left else ""
        self._say(
            f"saved to {name}{still}. Load reads it back; a %%finetune cell holding just its name runs it."
        )


__all__ = [
    "CONFIG_KEYS", "SUFFIXES", "SaveRow", "control_character", "is_yaml_name", "not_a_config", "read", "save",
    "secret_in", "target",
]  # fmt: skip
