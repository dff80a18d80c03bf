"""SQLite index of runs, so any kernel, the CLI and the server extension can list them.

The run directory stays the source of truth (state is read from status.json, processes from launch.json);
the registry only says which runs exist and where. WAL mode and short transactions let several kernels
write at once.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nbtrain.contract.paths import home_dir, runs_root
from nbtrain.contract.rundir import MAX_JSON_BYTES, RunPaths, read_json

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id       TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    run_dir  TEXT NOT NULL UNIQUE,
    created  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_name ON runs(name);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created);
CREATE TABLE IF NOT EXISTS sweeps (
    id       TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    dir      TEXT NOT NULL UNIQUE,
    created  REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Row:
    id: str
    name: str
    run_dir: str
    created: float


def db_path() -> Path:
    return home_dir() / "registry.sqlite3"


def _retry(fn: Callable[[], T]) -> T:
    """Run ``fn`` again while SQLite says the database is locked. Switching to WAL and creating the
    schema take locks the busy timeout does not always wait for when many writers start at once."""
    for attempt in range(100):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            time.sleep(min(0.5, 0.01 * (attempt + 1)))
    return fn()


@contextmanager
def connect() -> Iterator[sqlite3.Connection]:
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("PRAGMA busy_timeout=30000")
        _retry(lambda: con.execute("PRAGMA journal_mode=WAL"))
        _retry(lambda: con.executescript(_SCHEMA))
        _retry(lambda: _drop_old_columns(con))
        with con:  # one transaction
            yield con
    finally:
        con.close()


def _db(fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn`` in one transaction. A registry SQLite cannot read (truncated, overwritten, a bad disk block) is
    moved aside and started anew: the run directories are the truth, and listing adds them back."""

    def once() -> T:
        with connect() as con:
            return fn(con)

    try:
        return _retry(once)
    except (sqlite3.OperationalError, sqlite3.IntegrityError):
        # locked past every retry, read-only, no space: a real error to show, not corruption; a duplicate
        # id (a copied run directory) is the caller's to handle, and the registry is fine
        raise
    except sqlite3.DatabaseError as e:
        path = db_path()
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{path}{suffix}")
            if old.exists():
                old.replace(Path(f"{aside}{suffix}"))
        warnings.warn(f"nbtrain: the run registry {path} was unreadable ({e}); kept as {aside.name} and "
                      "rebuilt from the run directories", stacklevel=3)  # fmt: skip
        return _retry(once)


def _drop_old_columns(con: sqlite3.Connection) -> None:
    """Registries written before 0.1 kept a copy of each run's state and pid that nothing read (and that
    went stale); the run directory has both. Dropped so inserts need not invent them."""
    cols = {row[1] for row in con.execute("PRAGMA table_info(runs)")}
    for col in ("state", "pid"):
        if col in cols:
            con.execute(f"ALTER TABLE runs DROP COLUMN {col}")


def add(run_id: str, name: str, run_dir: Path, created: float | None = None) -> None:
    _db(lambda con: con.execute(
        "INSERT INTO runs (id, name, run_dir, created) VALUES (?, ?, ?, ?)",
        (run_id, name, str(run_dir), created or time.time()),
    ))  # fmt: skip


def add_sweep(sweep_id: str, name: str, folder: Path) -> None:
    """A sweep's folder (nbtrain.control.sweep), so the server and other kernels find it by id."""
    _db(lambda con: con.execute(
        "INSERT INTO sweeps (id, name, dir, created) VALUES (?, ?, ?, ?)",
        (sweep_id, name, str(folder), time.time()),
    ))  # fmt: skip


def sweep_rows() -> list[Row]:
    """Every registered sweep (its folder in ``run_dir``), oldest first; the folder may be gone."""
    return _db(lambda con: [Row(*r) for r in con.execute(
        "SELECT id, name, dir, created FROM sweeps ORDER BY created"
    )])  # fmt: skip


def remove(run_id: str) -> None:
    _db(lambda con: con.execute("DELETE FROM runs WHERE id=?", (run_id,)))


_COLUMNS = "SELECT id, name, run_dir, created FROM runs"


def rows() -> list[Row]:
    """All runs, oldest first: the registered ones, and any run directory under the runs root that the
    registry lost (it was deleted, truncated or unreadable) added back. A row whose folder is there but
    is no run directory of this user's is left out (``is_run``)."""
    rebuild(runs_root())
    return [r for r in _rows() if is_run(r)]


def is_run(row: Row) -> bool:
    """Whether a row names a run directory of this user's (``RunPaths.not_a_run``): a row naming ``/``,
    ``/etc``, a relative path or another user's folder (a registry written by hand, an old or a copied
    one) is never listed, looked up or acted on. A folder that is not there at all stays listed: it was
    deleted by hand (its run reads lost), or it is being created (registered before it is renamed into
    place)."""
    path = Path(row.run_dir)
    if path.is_absolute() and not os.path.lexists(path):
        return True
    return RunPaths(path).not_a_run() is None


def _rows() -> list[Row]:
    return _db(lambda con: [Row(*r) for r in con.execute(f"{_COLUMNS} ORDER BY created, id").fetchall()])


def find(ref: str) -> list[Row]:
    """Runs whose id equals ``ref``, whose name equals it, or whose id starts with it (in that order)."""

    def query(con: sqlite3.Connection) -> list[Row]:
        q = f"{_COLUMNS} WHERE {{}} ORDER BY created DESC, id DESC"
        for clause, arg in (("id = ?", ref), ("name = ?", ref), ("id LIKE ? ESCAPE '\\'", _like_prefix(ref))):
            found = [row for r in con.execute(q.format(clause), (arg,)).fetchall() if is_run(row := Row(*r))]
            if found:
                return found
        return []

    return _db(query) or (_db(query) if rebuild(runs_root()) else [])


def _like_prefix(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def id_time(run_id: str) -> float | None:
    """The creation time a run id carries (``20250101-093000-name-abcd``, local time), or None."""
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except (ValueError, OverflowError):
        return None


def rebuild(root: Path) -> int:
    """Register every run directory under ``root`` that the registry does not know (the run dirs are
    the source of truth). Returns how many were added."""
    known = {r.run_dir for r in _rows()}
    added = 0
    if not root.is_dir():
        return 0
    for resolved in sorted(root.glob("*/resolved.json")):
        run_dir = resolved.parent
        if str(run_dir) in known or run_dir.name.startswith("."):  # ".<id>.partial": still being created
            continue
        if RunPaths(run_dir).not_yours():  # another user's run in a shared runs root: never yours to act on
            continue
        try:
            info = read_json(resolved, max_bytes=MAX_JSON_BYTES)  # never a FIFO (it would block), a link
            created = resolved.stat().st_mtime  # the id's time comes first (below): a resume rewrites it
        except (OSError, ValueError):  # NotRegularFile is an OSError
            continue  # not readable: not listed (the run directory is left as it is)
        if not isinstance(info, dict):
            continue
        created = id_time(str(info.get("id") or run_dir.name)) or created
        try:
            add(str(info.get("id") or run_dir.name), str(info.get("name") or run_dir.name), run_dir, created)
        except sqlite3.IntegrityError:
            continue  # its id is registered under another path (a copy of a run directory)
        added += 1
    return added
