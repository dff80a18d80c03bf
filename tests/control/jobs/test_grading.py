"""Run records saved in a notebook and nbtrain.check, on one real run started from a %%finetune cell in a
real kernel; the executed notebook is written to disk and read back as an autograder would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest

import nbtrain
from nbtrain.control.jobs.grading import RECORD_MIME
from tests.conftest import lora_yaml
from tests.notebook import error_of, execute, text_of

pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Any, Path, Path]:
    """A notebook that trains in the background, waits in another cell, records on demand and checks;
    executed headless and saved. Returns (notebook, its path, the run directory)."""
    from nbtrain.examples import write_dataset

    work = tmp_path_factory.mktemp("graded")
    (work / "tiny-llama").symlink_to(tiny_model)
    write_dataset(work / "data" / "add.jsonl")
    cells = [
        "%load_ext nbtrain",
        f"%%finetune --name graded --no-view\n{lora_yaml(STEPS)}",
        # run.wait() (no %finetune wait here) brings the record to the final state before it returns; the
        # kernel's output is flushed, not waited for, so a watcher thread a second later would be too late
        "import nbtrain\nfrom nbtrain.control.jobs.grading import _SHOWN\n"
        "nbtrain.get_run('graded').wait(timeout=300)\nassert _SHOWN and all(shown.final for shown in _SHOWN)",
        "%finetune record graded",
        "r = nbtrain.check('graded', final_loss_below=100, min_steps=12, loss_decreased=True, "
        "adapter_exists=True)\nr.assert_passed()\nr",
        "nbtrain.check('graded', final_loss_below=1e-6, config={'lora.r': 64}).assert_passed()",
        "import sys; print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))",
    ]
    mp = pytest.MonkeyPatch()
    mp.setenv("NBTRAIN_HOME", str(work / "home"))
    mp.setenv("NBTRAIN_RUNS_DIR", str(work / "runs"))
    try:
        nb = execute(cells, work, allow_errors=True)
    finally:
        mp.undo()
    path = work / "graded.ipynb"
    nbformat.write(nb, path)
    run_dirs = list((work / "runs").iterdir())
    assert len(run_dirs) == 1
    return nb, path, run_dirs[0]


def test_finetune_cell_saves_a_record_that_reaches_the_final_state(graded: tuple[Any, Path, Path]) -> None:
    nb, _, run_dir = graded
    assert error_of(nb.cells[1]) is None and error_of(nb.cells[2]) is None, text_of(nb.cells[1])
    outs = [o for o in nb.cells[1].outputs if RECORD_MIME in o.get("data", {})]
    assert len(outs) == 1
    assert outs[0]["metadata"]["nbtrain"]["record"] == run_dir.name
    rec = outs[0]["data"][RECORD_MIME]
    # updated in place by run.wait() in the next cell
    assert rec["state"] == "completed" and rec["step"] == STEPS
    assert "completed at step 12/12" in outs[0]["data"]["text/plain"]
    assert text_of(nb.cells[-1]).strip() == "[]"  # records and checks keep the kernel light


def test_records_reads_config_plan_estimate_and_final_metrics_back_from_the_file(
    graded: tuple[Any, Path, Path],
) -> None:
    _, path, run_dir = graded
    recs = nbtrain.records(path)
    assert [r["id"] for r in recs] == [run_dir.name]  # the on-demand record replaces the earlier one
    rec = recs[0]
    assert rec["cell"] == 3 and rec["name"] == "graded"
    assert rec["config"]["method"] == "lora" and rec["config"]["train"]["max_steps"] == STEPS
    assert "max_steps: 12" in rec["config_text"]
    assert rec["plan"]["device"] == "cpu" and rec["plan"]["strategy"] == "none"
    assert rec["estimate"]["per_device_bytes"] > 0
    assert rec["final_metrics"]["step"] == STEPS and rec["logged_records"] >= STEPS
    assert rec["final_metrics"]["loss"] < rec["first_metrics"]["loss"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(rec["output_files"])


def test_check_passes_in_the_notebook_and_fails_with_a_readable_table(graded: tuple[Any, Path, Path]) -> None:
    nb, _, _ = graded
    assert error_of(nb.cells[4]) is None
    shown = text_of(nb.cells[4])
    assert ": 5/5 passed" in shown and "PASS  adapter saved" in shown
    err = error_of(nb.cells[5])
    assert err is not None and err[0] == "AssertionError"
    assert "1/3 passed" in err[1] and "FAIL  final loss" in err[1] and "< 1e-06" in err[1]
    assert "FAIL  config lora.r" in err[1] and "64" in err[1]


def test_check_from_a_saved_record_is_checked_against_its_run_first(graded: tuple[Any, Path, Path]) -> None:
    _, path, _ = graded
    rec = nbtrain.records(path)[0]
    report = nbtrain.check(rec, min_steps=STEPS, adapter_exists=True, config={"objective": "sft"},
                           metrics_below={"loss": 100.0}, metrics_above={"tokens_per_s": 0})  # fmt: skip
    assert report.passed, report.text()
    assert report.rows[0].check == "record is the run's" and report.rows[0].actual == "yes"
    assert "&#10003; pass" in report._repr_html_()
    failing = nbtrain.check(rec, state="failed", adapter_exists=False, eval_loss_below=1.0)
    assert [r.check for r in failing.failed] == ["state", "final eval loss", "adapter saved"]
    assert failing.to_dict()["passed"] is False
    assert "(none)" in failing.text()  # no eval loss was logged: shown, and a failure
    with pytest.raises(AssertionError, match="1/4 passed"):
        failing.assert_passed()


def test_a_record_edited_by_hand_or_without_its_run_fails_the_check(
    graded: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """The grade is what the run recorded: a record whose loss, config or state was edited, one taken
    with a run directory whose metrics were rewritten after, or one whose run is not here fails the row
    "record is the run's", whatever else it claims; verify=False grades a record as it stands."""
    import copy
    import shutil

    _, path, run_dir = graded
    rec = nbtrain.records(path)[0]

    def why(r: dict) -> str:
        report = nbtrain.check(r, final_loss_below=1e-3)
        row = report.rows[0]
        assert row.check == "record is the run's" and not row.passed and not report.passed
        return row.actual

    better = copy.deepcopy(rec)
    better["final_metrics"]["loss"] = 1e-4
    assert nbtrain.check(better, final_loss_below=1e-3).rows[1].passed  # the loss row alone would pass it
    assert why(better) == "the record's final_metrics differ from its run's"
    other = copy.deepcopy(rec)
    other["config"]["lora"]["r"] = 64
    other["state"], other["step"] = "completed", STEPS + 1
    assert why(other) == "the record's config, state differ from its run's"
    assert "carries no evidence" in why({k: v for k, v in rec.items() if k != "evidence"})
    gone = {**rec, "run_dir": str(tmp_path / "gone")}
    assert "is not here" in why(gone) and "verify=False" in why(gone)
    assert nbtrain.check(gone, min_steps=STEPS, verify=False).passed
    # the run directory copied and its metrics rewritten to match an edited record: the bytes differ
    copied = tmp_path / run_dir.name
    shutil.copytree(run_dir, copied)
    metrics = copied / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"loss": ', '"loss": 0.0001, "was": '))
    assert "does not begin with the bytes" in why({**rec, "run_dir": str(copied)})


def test_a_record_taken_mid_run_still_matches_once_its_run_has_logged_more(
    graded: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """metrics.jsonl only grows: a record made earlier is checked against the bytes it was made from, not
    against the lines logged after it."""
    import json
    import shutil

    from nbtrain.control.jobs.grading import record_mismatch, run_record

    _, _, run_dir = graded
    copied = tmp_path / run_dir.name
    shutil.copytree(run_dir, copied)
    rec = run_record(copied)
    with (copied / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"t": 0.0, "step": 99, "loss": 0.001}) + "\n")
    assert record_mismatch(rec) is None
    assert run_record(copied)["final_metrics"]["loss"] == 0.001  # a new record reads the new line
