from __future__ import annotations

import threading
import warnings
from pathlib import Path

from nbtrain.control.runs import registry


def test_find_by_id_name_and_prefix(tmp_path: Path) -> None:
    registry.add("20260101-000000-a-0001", "a", tmp_path / "1", created=1.0)
    registry.add("20260101-000001-a-0002", "a", tmp_path / "2", created=2.0)
    registry.add("20260102-000000-b-0003", "b", tmp_path / "3", created=3.0)
    assert [r.id for r in registry.find("20260101-000000-a-0001")] == ["20260101-000000-a-0001"]
    assert registry.find("a")[0].id == "20260101-000001-a-0002"  # the newest of that name
    assert [r.id for r in registry.find("20260102")] == ["20260102-000000-b-0003"]
    assert registry.find("2026010_") == []  # LIKE wildcards in a reference are literal
    assert registry.find("zzz") == []


def test_concurrent_writers_all_land(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def add(i: int) -> None:
        try:
            registry.add(f"id-{i:03d}", "n", tmp_path / str(i), created=float(i))
        except BaseException as e:  # surfaced below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(registry.rows()) == 40


def test_remove(tmp_path: Path) -> None:
    registry.add("x", "n", tmp_path / "x")
    assert [r.id for r in registry.rows()] == ["x"]
    registry.remove("x")
    assert registry.rows() == []


def test_a_registry_with_the_old_state_and_pid_columns_still_lists_and_takes_runs(tmp_path: Path) -> None:
    import sqlite3

    registry.db_path().parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(registry.db_path())
    con.execute(
        "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, run_dir TEXT NOT NULL UNIQUE,"
        " created REAL NOT NULL, state TEXT NOT NULL, pid INTEGER)"
    )
    con.execute("INSERT INTO runs VALUES ('old', 'n', ?, 1.0, 'running', 42)", (str(tmp_path / "old"),))
    con.commit()
    con.close()
    registry.add("new", "n", tmp_path / "new", created=2.0)
    assert [(r.id, r.created) for r in registry.rows()] == [("old", 1.0), ("new", 2.0)]


def test_rebuild_registers_run_dirs_it_does_not_know(tmp_path: Path) -> None:
    from nbtrain.contract.rundir import RunPaths, atomic_write_json, write_status

    for i in range(2):
        paths = RunPaths(tmp_path / "runs" / f"run-{i}")
        paths.make()
        atomic_write_json(paths.resolved, {"id": f"run-{i}", "name": f"n{i}"})
        write_status(paths, "completed")
    registry.add("run-0", "n0", tmp_path / "runs" / "run-0")
    assert registry.rebuild(tmp_path / "runs") == 1
    assert sorted(r.id for r in registry.rows()) == ["run-0", "run-1"]
    assert registry.rebuild(tmp_path / "runs") == 0


def make_run_dirs(root: Path, n: int) -> None:
    from nbtrain.contract.rundir import RunPaths, atomic_write_json, write_status

    for i in range(n):
        paths = RunPaths(root / f"run-{i}")
        paths.make()
        atomic_write_json(paths.resolved, {"id": f"run-{i}", "name": f"n{i}"})
        write_status(paths, "completed")


def test_a_corrupt_registry_is_set_aside_and_rebuilt_from_the_run_dirs(tmp_path: Path) -> None:
    from nbtrain.contract.paths import runs_root

    make_run_dirs(runs_root(), 3)
    assert len(registry.rows()) == 3
    db = registry.db_path()
    for damage in (b"this is not a database" * 100, b""):  # overwritten; truncated (reads as empty)
        db.write_bytes(damage)
        for extra in ("-wal", "-shm"):
            Path(f"{db}{extra}").unlink(missing_ok=True)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert sorted(r.id for r in registry.rows()) == ["run-0", "run-1", "run-2"]
        assert bool(damage) == any("unreadable" in str(w.message) for w in seen)
        assert [r.id for r in registry.find("run-1")] == ["run-1"]
    assert list(db.parent.glob("registry.sqlite3.corrupt-*"))  # the unreadable file is kept, not deleted


def test_a_lost_registry_entry_is_found_again_by_id(tmp_path: Path) -> None:
    from nbtrain.contract.paths import runs_root

    make_run_dirs(runs_root(), 2)
    registry.rows()
    registry.remove("run-1")
    assert [r.id for r in registry.find("run-1")] == ["run-1"]
