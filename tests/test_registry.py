from __future__ import annotations

import threading
from pathlib import Path

from nbtrain import registry


def test_find_by_id_name_and_prefix(tmp_path: Path) -> None:
    registry.add("20260101-000000-a-0001", "a", tmp_path / "1", "queued", created=1.0)
    registry.add("20260101-000001-a-0002", "a", tmp_path / "2", "queued", created=2.0)
    registry.add("20260102-000000-b-0003", "b", tmp_path / "3", "queued", created=3.0)
    assert [r.id for r in registry.find("20260101-000000-a-0001")] == ["20260101-000000-a-0001"]
    assert registry.find("a")[0].id == "20260101-000001-a-0002"  # the newest of that name
    assert [r.id for r in registry.find("20260102")] == ["20260102-000000-b-0003"]
    assert registry.find("2026010_") == []  # LIKE wildcards in a reference are literal
    assert registry.find("zzz") == []


def test_concurrent_writers_all_land(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def add(i: int) -> None:
        try:
            registry.add(f"id-{i:03d}", "n", tmp_path / str(i), "queued", created=float(i))
        except BaseException as e:  # surfaced below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(registry.rows()) == 40


def test_update_and_remove(tmp_path: Path) -> None:
    registry.add("x", "n", tmp_path / "x", "queued")
    registry.update("x", state="running", pid=42)
    row = registry.rows()[0]
    assert (row.state, row.pid) == ("running", 42)
    registry.remove("x")
    assert registry.rows() == []


def test_rebuild_registers_run_dirs_it_does_not_know(tmp_path: Path) -> None:
    from nbtrain.rundir import RunPaths, atomic_write_json, write_status

    for i in range(2):
        paths = RunPaths(tmp_path / "runs" / f"run-{i}")
        paths.make()
        atomic_write_json(paths.resolved, {"id": f"run-{i}", "name": f"n{i}"})
        write_status(paths, "completed")
    registry.add("run-0", "n0", tmp_path / "runs" / "run-0", "completed")
    assert registry.rebuild(tmp_path / "runs") == 1
    assert sorted(r.id for r in registry.rows()) == ["run-0", "run-1"]
    assert registry.rebuild(tmp_path / "runs") == 0
