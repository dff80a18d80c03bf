"""Exports never delete what they did not write (issue 57, N1): an export with overwrite into the run's own
directory, the runs root, NBTRAIN_HOME or any folder holding one of them is refused before anything starts,
and the export job checks the same rule again before it replaces anything; overwrite replaces an earlier
export's folder only while it holds nothing that export did not write."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from nbtrain.worker.jobs import export as worker


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its SHA-256, every folder as "dir": byte for byte what is there."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def layout(run_copy: Path, tmp_path: Path) -> dict[str, Path]:
    """The run copy in its runs root beside another run and a user's file, and NBTRAIN_HOME with a file."""
    root = run_copy.parent
    other = root / "other-run"
    other.mkdir()
    (other / "resolved.json").write_text('{"id": "other-run"}')
    (other / "notes.txt").write_text("another run's own file")
    (root / "my-notes.md").write_text("the user's file beside the runs")
    home = Path(os.environ["NBTRAIN_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "courses.json").write_text("{}")
    nbtrain.runs()  # the registry as it stands (it registers the runs it finds under the runs root)
    return {"run": run_copy, "root": root, "home": home, "top": tmp_path}


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("run", "is the run directory"),
        ("run/output", "lies inside the run directory"),
        ("root", "is the runs root"),
        ("top", "holds the run directory"),
        ("home", "is NBTRAIN_HOME"),
        ("home/sub", "lies inside NBTRAIN_HOME"),
    ],
)
def test_export_with_overwrite_into_a_run_the_runs_root_or_home_is_refused_and_changes_nothing(
    layout: dict[str, Path], where: str, said: str
) -> None:
    base, _, sub = where.partition("/")
    target = layout[base] / sub if sub else layout[base]
    before = snapshot(layout["top"]), snapshot(layout["home"])
    with pytest.raises(NbtrainError, match=said):
        nbtrain.export(layout["run"], to=target, overwrite=True)
    assert (snapshot(layout["top"]), snapshot(layout["home"])) == before
    assert not (layout["run"] / "logs" / "export.log").exists()  # nothing was started


def test_the_export_job_refuses_the_run_directory_itself_when_asked_directly(
    layout: dict[str, Path],
) -> None:
    """The job checks again (a target that changed after the kernel looked, or the job run by hand)."""
    result = layout["top"] / "result.json"
    before = snapshot(layout["root"])
    for target in (layout["run"], layout["root"]):
        args = [str(layout["run"]), "--to", str(target), "--no-merge", "--overwrite", "--result", str(result)]
        assert worker.main(args) == 2
        assert "an export there would replace it" in json.loads(result.read_text())["error"]
    assert snapshot(layout["root"]) == before


def test_overwrite_replaces_an_earlier_export_but_not_a_folder_of_the_users_files(
    run_copy: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    before = snapshot(mine)
    with pytest.raises(
        NbtrainError, match=r"is not an earlier export's folder \(thesis.tex\).*nothing was deleted"
    ):
        nbtrain.export(run_copy, to=mine, merge=False, overwrite=True)
    assert snapshot(mine) == before

    out = tmp_path / "adapter"
    nbtrain.export(run_copy, to=out, merge=False)
    record = json.loads((out / "nbtrain_export.json").read_text())
    assert "adapter_model.safetensors" in record["files"] and "nbtrain_export.json" in record["files"]
    first = snapshot(out)
    nbtrain.export(run_copy, to=out, merge=False, overwrite=True)  # an export's own folder: replaced
    assert set(snapshot(out)) == set(first)

    (out / "my-eval.txt").write_text("added by hand after the export")
    with pytest.raises(NbtrainError, match=r"holds files its export did not write \(my-eval.txt\)"):
        nbtrain.export(run_copy, to=out, merge=False, overwrite=True)
    assert (out / "my-eval.txt").read_text() == "added by hand after the export"
