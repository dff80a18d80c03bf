"""SQLite index of runs, so any kernel, the CLI and the server extension can list them.

The run directory stays the source of truth (state is read from status.json); the registry only says
where runs are. WAL mode and short transactions let several kernels write at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nbtrain.paths import home_dir

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id       TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    run_dir  TEXT NOT NULL UNIQUE,
    created  REAL NOT NULL,
    state    TEXT NOT NULL,
    pid      INTEGER
);
CREATE INDEX IF NOT EXISTS runs_name ON runs(name);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created);
"""


@dataclass(frozen=True)
class Row:
    id: str
    name: str
    run_dir: str
    created: float
    state: str
    pid: int | None


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
        with con:  # one transaction
            yield con
    finally:
        con.close()


def add(run_id: str, name: str, run_dir: Path, state: str, created: float | None = None) -> None:
    def insert() -> None:
        with connect() as con:
            con.execute(
                "INSERT INTO runs (id, name, run_dir, created, state, pid) VALUES (?, ?, ?, ?, ?, NULL)",
                (run_id, name, str(run_dir), created or time.time(), state),
            )

    _retry(insert)


def update(run_id: str, *, state: str | None = None, pid: int | None = None) -> None:
    with connect() as con:
        if state is not None:
            con.execute("UPDATE runs SET state=? WHERE id=?", (state, run_id))
        if pid is not None:
            con.execute("UPDATE runs SET pid=? WHERE id=?", (pid, run_id))


def remove(run_id: str) -> None:
    with connect() as con:
        con.execute("DELETE FROM runs WHERE id=?", (run_id,))


def rows() -> list[Row]:
    """All runs, oldest first."""
    with connect() as con:
        cur = con.execute("SELECT id, name, run_dir, created, state, pid FROM runs ORDER BY created, id")
        return [Row(*r) for r in cur.fetchall()]


def find(ref: str) -> list[Row]:
    """Runs whose id equals ``ref``, whose name equals it, or whose id starts with it (in that order)."""
    with connect() as con:
        q = "SELECT id, name, run_dir, created, state, pid FROM runs WHERE {} ORDER BY created DESC, id DESC"
        for clause, arg in (("id = ?", ref), ("name = ?", ref), ("id LIKE ? ESCAPE '\\'", _like_prefix(ref))):
            found = [Row(*r) for r in con.execute(q.format(clause), (arg,)).fetchall()]
            if found:
                return found
    return []


def _like_prefix(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def rebuild(root: Path) -> int:
    """Register every run directory under ``root`` that the registry does not know (the run dirs are
    the source of truth). Returns how many were added."""
    import json

    known = {r.run_dir for r in rows()}
    added = 0
    for resolved in sorted(root.glob("*/resolved.json")):
        run_dir = resolved.parent
        if str(run_dir) in known:
            continue
        try:
            info = json.loads(resolved.read_text(encoding="utf-8"))
            state = json.loads((run_dir / "status.json").read_text(encoding="utf-8")).get("state", "queued")
        except (OSError, ValueError):
            continue
        add(
            str(info.get("id") or run_dir.name),
            str(info.get("name") or run_dir.name),
            run_dir,
            state,
            created=resolved.stat().st_mtime,
        )
        added += 1
    return added
