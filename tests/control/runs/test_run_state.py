"""What a run handle says when its directory is damaged: deleted or with a corrupt status file. Such a run
reads as failed with the reason, never as queued, and nothing re-creates a deleted directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from nbtrain.control.runs.run import Run, all_runs, create_run_dir


def new_run(name: str) -> Run:
    return create_run_dir(name, "model: x\n", {"config": {}})


def test_a_deleted_run_dir_reads_as_lost_and_stop_does_not_recreate_it(tmp_path: Path) -> None:
    run = new_run("gone")
    shutil.rmtree(run.dir)
    st = run.status()
    assert st.state == "failed" and st.error is not None and st.error["type"] == "lost"
    assert "no longer exists" in st.error["message"]
    assert run.stop().state == "failed"
    assert not run.dir.exists()
    assert run.id not in [r.id for r in all_runs()]


def test_a_corrupt_status_file_reads_as_failed_and_other_runs_still_read(tmp_path: Path) -> None:
    bad, good = new_run("bad"), new_run("good")
    for text in ("{not json", '["a list"]', '{"state": "dancing"}', '{"state": "running", "step": "x"}'):
        bad.paths.status.write_text(text, encoding="utf-8")
        st = bad.status()
        assert (st.state, st.error and st.error["type"]) == ("failed", "corrupt"), text
    assert good.status().state == "queued"
