"""Where the presets in force come from: ``$NBTRAIN_PRESET`` or the ``nbtrain.lab.yaml`` in the working
directory or a folder above it, read and checked (a bad file is a ConfigError naming it and the key), and
the required course presets remembered in ``$NBTRAIN_HOME/courses.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.contract.paths import home_dir
from nbtrain.contract.rundir import atomic_write_json
from nbtrain.control.config.preset.model import PRESET_ENV, PRESET_FILE, Preset
from nbtrain.control.config.yamlsafe import MAX_BYTES, YamlProblem, load_yaml


def _problem(path: Path, message: str) -> ConfigError:
    return ConfigError([Problem("", f"lab preset {path}: {message}")])


def load_preset(path: str | Path) -> Preset:
    """Read and check a preset file; a bad one is a ConfigError naming the file and the key."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise _problem(p, f"file not found (set by ${PRESET_ENV})" if os.environ.get(PRESET_ENV) else
                       "file not found")  # fmt: skip
    try:
        with p.open(encoding="utf-8") as f:
            raw = load_yaml(f.read(MAX_BYTES + 1))  # yaml.safe_load, size and alias expansion bounded
    except YamlProblem as e:
        where = f" (line {e.line}" + (f", column {e.column}" if e.column else "") + ")" if e.line else ""
        raise _problem(p, str(e) + where) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _problem(
            p, f"a preset is a mapping of rules (models:, methods:, ...), got {type(raw).__name__}"
        )
    if "source" in raw:
        raise _problem(p, "unknown rule 'source'")
    try:
        preset = Preset.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"] if not str(x).startswith(("list[", "dict[", "str")))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(k for k in Preset.model_fields if k != "source")
                msg = f"unknown rule; the rules are {allowed}"
            lines.append(f"{where}: {msg}")
        raise _problem(p, "; ".join(dict.fromkeys(lines))) from None
    return preset.model_copy(update={"source": p})


def preset_path(start: Path | None = None) -> Path | None:
    """$NBTRAIN_PRESET, else the first ``nbtrain.lab.yaml`` in ``start`` (the working directory) or a
    folder above it."""
    env = os.environ.get(PRESET_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return _folder_preset(start)


def _folder_preset(start: Path | None = None) -> Path | None:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PRESET_FILE
        if candidate.is_file():
            return candidate
    return None


# ------------------------------------------------------------------------------- required courses


def courses_file() -> Path:
    """Where the required course presets seen here are remembered."""
    return home_dir() / "courses.json"


def _remembered() -> list[Path]:
    try:
        data = json.loads(courses_file().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ConfigError(
            [
                Problem(
                    "",
                    f"{courses_file()} (the required course presets seen here) cannot be read: {e}; "
                    f"fix it, or delete it to forget every course",
                )
            ]
        ) from None
    paths = data.get("required", []) if isinstance(data, dict) else []
    return [Path(x) for x in paths if isinstance(x, str)]


def _save_remembered(paths: list[Path]) -> None:
    courses_file().parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(courses_file(), {"required": [str(x) for x in dict.fromkeys(paths)]})


def leave_course(path: str | Path | None = None) -> list[Path]:
    """Stop applying a required course preset here (all of them when ``path`` is None): leaving a course
    on purpose. Returns the presets forgotten."""
    known = _remembered()
    gone = known if path is None else [p for p in known if p == Path(path).expanduser().resolve()]
    if gone:
        _save_remembered([p for p in known if p not in gone])
    return gone


def _required_presets(found: Preset | None) -> list[Preset]:
    """The remembered required course presets other than ``found``, each still required (one whose
    instructor dropped ``required`` is forgotten); one whose file is gone stops everything."""
    known = _remembered()
    if found is not None and found.required and found.source not in known:
        known.append(found.source)
        _save_remembered(known)
    out: list[Preset] = []
    for src in known:
        if found is not None and src == found.source:
            continue
        if not src.is_file():
            raise ConfigError(
                [
                    Problem(
                        "",
                        f"the course preset {src} says required: true, and it is gone (moved or deleted): "
                        f"a required course's rules apply wherever you work once nbtrain has seen them, so "
                        f"nothing starts without them. Put the file back, or leave the course on purpose: "
                        f"from nbtrain.control.config.preset import leave_course; leave_course({str(src)!r})",
                    )
                ]
            )
        preset = load_preset(src)
        if preset.required:
            out.append(preset)
        else:
            leave_course(src)  # the instructor released it
    return out


def find_preset(start: Path | None = None) -> Preset | None:
    """The lab preset in force here, or None: $NBTRAIN_PRESET or the ``nbtrain.lab.yaml`` in the working
    directory or above, together with every required course preset (``chain()``): one seen before and
    remembered, or the folder's own when $NBTRAIN_PRESET points elsewhere."""
    path = preset_path(start)
    found = load_preset(path) if path is not None else None
    extra: list[Preset] = []
    folder = _folder_preset(start) if os.environ.get(PRESET_ENV) else None
    if folder is not None and folder != path:
        near = load_preset(folder)
        if near.required:
            extra.append(near)
            if near.source not in _remembered():
                _save_remembered([*_remembered(), near.source])
    extra += [p for p in _required_presets(found) if all(p.source != e.source for e in extra)]
    if found is None:
        if not extra:
            return None
        found, extra = extra[0], extra[1:]
    found._also = extra
    return found
