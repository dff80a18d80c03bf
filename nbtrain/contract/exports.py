"""Where an export may write: the one target rule of the kernel (``control/jobs/export``) and the export job
(``worker/jobs/export``), which checks it again just before it replaces anything.

An export writes a new folder beside the target and renames it into place; with ``overwrite`` the target it
replaces is moved aside and deleted only after the new one is whole. So the rule decides what may be
deleted, and it deletes only what an export wrote:
- never a run directory, the runs root or NBTRAIN_HOME, nor a folder that holds or lies inside one
  (the export's own result file lives in the run's logs);
- ``overwrite`` replaces an earlier export's folder (its ``nbtrain_export.json``), and only when it holds
  no file that export did not list; any other non-empty folder is refused, overwrite or not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

PROVENANCE = "nbtrain_export.json"
# An earlier export is a model's files, a tokenizer's and a few GGUF files; a folder with more entries than
# this is not one, and is not walked further.
MAX_LISTED = 10_000


def protected_problem(target: Path, protected: Iterable[tuple[Path, str]]) -> str | None:
    """Why ``target`` (resolved) may not be exported to: it is, holds or lies inside one of ``protected``
    (a resolved folder and what it is, e.g. "the run directory of run X")."""
    protected = list(protected)
    for folder, what in protected:
        if target == folder:
            return (
                f"{target} is {what}: an export there would replace it; export to a new folder outside "
                f"nbtrain's run directories"
            )
    for folder, what in protected:
        if folder in target.parents:
            return f"{target} lies inside {what} ({folder}); export to a new folder outside it"
    for folder, what in protected:
        if target in folder.parents:
            return (
                f"{target} holds {what} ({folder}): an export there would replace it; export to a new "
                f"folder of its own"
            )
    return None


def written_files(folder: Path) -> list[str]:
    """Every file and folder under ``folder``, relative and sorted: what an export wrote, for its record."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def foreign_files(target: Path) -> list[str] | None:
    """For an existing non-empty ``target``: the entries no earlier export wrote there (all of them where
    it is not an export's folder at all); an empty list when it is an earlier export's folder, as written."""
    entries: list[str] = []
    for p in target.rglob("*"):
        entries.append(str(p.relative_to(target)))
        if len(entries) > MAX_LISTED:
            return entries
    marker = target / PROVENANCE
    if marker.is_symlink() or not marker.is_file():
        return sorted(entries)
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return sorted(entries)
    if not isinstance(record, dict) or "run_id" not in record:
        return sorted(entries)
    listed = record.get("files")
    if not isinstance(listed, list):
        # An export made before exports listed their files: its top-level names are a model's; anything
        # that marks a run or nbtrain's home is not.
        return sorted(e for e in entries if Path(e).name in _NOT_EXPORTED)
    known = {str(f) for f in listed} | {PROVENANCE}
    return sorted(e for e in entries if e not in known)


# Files that say a folder is a run directory or nbtrain's home, never written by an export.
_NOT_EXPORTED = {"resolved.json", "status.json", "launch.json", "metrics.jsonl", "registry.sqlite3", ".lock"}


def target_problem(target: Path, overwrite: bool, protected: Iterable[tuple[Path, str]]) -> str | None:
    """Why the export may not write ``target`` (resolved), or None."""
    if why := protected_problem(target, protected):
        return why
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        return f"{target} exists and is not a folder; give a new folder's path for the export"
    if not target.is_dir() or not any(target.iterdir()):
        return None
    if not overwrite:
        return f"{target} is not empty; give a new directory, or overwrite=True (--overwrite) to replace it"
    foreign = foreign_files(target)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        what = (
            "is not an earlier export's folder"
            if not (target / PROVENANCE).is_file()
            else ("holds files its export did not write")
        )
        return (
            f"{target} {what} ({shown}); overwrite replaces only what an earlier export wrote, and "
            f"nothing was deleted: give a new folder, or move those files away first"
        )
    return None


def protected_dirs(run_dir: Path, home: Path, extra: Iterable[Path] = ()) -> list[tuple[Path, str]]:
    """The folders an export of ``run_dir`` must leave alone: the run, its runs root, NBTRAIN_HOME, and
    ``extra`` (the kernel adds every registered run's directory and runs root)."""
    run_dir = run_dir.resolve()
    found = [
        (run_dir, f"the run directory of run {run_dir.name}"),
        (run_dir.parent, "the runs root that holds the run"),
        (home.resolve(), "NBTRAIN_HOME (nbtrain's registry and caches)"),
    ]
    for d in extra:
        d = d.resolve()
        found += [(d, f"the run directory of run {d.name}"), (d.parent, "a runs root")]
    return found
