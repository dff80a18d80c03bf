"""Replay every fault and hostile input of issue 2/9 ("nothing lost, nothing wedged, nobody in") and fail if
any regresses: ``python -m tests.faults.replay`` (or ``make faults``), extra arguments go to pytest.

Everything runs on loopback and temp dirs (the full-disk cases on small tmpfs mounts where this user may
mount one). The suite (``make test``) runs the same tests with 5 kills around checkpoint rotation; the
replay runs 20 (``NBTRAIN_ROTATION_KILLS`` to change it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (the case, a test file, the tests in it that reproduce the case: none = the whole file); tests/faults/
# holds the files written for this issue.
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("kills around checkpoint rotation (20x)", "tests/faults/test_checkpoint_faults.py", ()),
    ("resume's repair keeps a whole checkpoint", "tests/contract/test_rundir.py",
     ("test_repair_deletes_only_remnants_without_a_whole_trainer_state",)),
    ("one writer per run dir", "tests/faults/test_run_faults.py",
     ("test_one_writer_per_run_dir_concurrent_resumes_start_one_worker",
      "test_a_worker_started_by_hand_on_a_locked_run_dir_refuses_to_write")),
    ("stop never signals a reused pid", "tests/control/launch/test_process.py",
     ("test_a_stop_never_signals_a_group_whose_leader_pid_was_reused",)),
    ("a run dir deleted while it trains", "tests/control/runs/test_run_state.py",
     ("test_a_deleted_run_dir_reads_as_lost_and_stop_does_not_recreate_it",)),
    ("disk full, NaN loss, memory about to run out", "tests/faults/test_run_faults.py", ()),
    ("a corrupt status file", "tests/control/runs/test_run_state.py",
     ("test_a_corrupt_status_file_reads_as_failed_and_other_runs_still_read",)),
    ("NUL-padded metrics lines; NaN written as valid JSON", "tests/contract/test_rundir.py",
     ("test_a_nul_padded_or_undecodable_line_is_skipped_not_fatal",
      "test_nan_and_infinity_are_written_as_valid_json_and_flagged")),
    ("a corrupt registry is rebuilt", "tests/control/runs/test_registry.py",
     ("test_a_corrupt_registry_is_set_aside_and_rebuilt_from_the_run_dirs",)),
    ("the OpenAI-compatible server under hostile clients", "tests/faults/test_serve_faults.py", ()),
    ("FIFOs and links in a run dir", "tests/contract/test_rundir.py",
     ("test_a_fifo_is_refused_at_once_by_every_reader_not_waited_on",
      "test_a_symlink_is_refused_not_followed")),
    ("endless and torn metrics lines", "tests/control/runs/test_metrics.py", ()),
    ("config and preset: bounds, alias bombs, secrets, rules, pickles",
     "tests/faults/test_config_faults.py", ()),
    ("data: bad bytes, deep rows, truncated files, huge rows", "tests/faults/test_data_faults.py", ()),
    ("a killed export's leftovers", "tests/worker/test_export.py",
     ("test_leftovers_of_killed_exports_are_cleared_and_a_target_moved_aside_is_put_back",)),
    ("trust boundaries: another uid's run dirs, a copied run dir, a status file of the wrong shape",
     "tests/faults/test_trust_faults.py", ()),
    ("images: a huge picture in a small file, many in one request, a FIFO, a trickling URL, a private host",
     "tests/faults/test_image_faults.py", ()),
    ("one writer per run dir however the warm process stalls; 40 starts beside a stalled client; a passed "
     "descriptor under any number", "tests/faults/test_warm_faults.py", ()),
    ("grades: notebook hooks under a lab preset", "tests/control/config/test_preset.py",
     ("test_hooks_rule_refuses_notebook_code_in_training_unless_the_preset_lists_it",)),
    ("grades: a record edited by hand or without its run", "tests/control/jobs/test_grading.py",
     ("test_a_record_edited_by_hand_or_without_its_run_fails_the_check",)),
    ("example-data writes the format its suffix says", "tests/examples/test_examples.py",
     ("test_alpaca_to_a_csv_file_is_csv_with_the_alpaca_columns",)),
    # the third audit (issue 57)
    ("N1: an export into a run, the runs root or NBTRAIN_HOME, or over files no export wrote",
     "tests/faults/test_export_faults.py", ()),
    ("a stop of a run whose steps outlast its floor (API, CLI); checkpoints by time; wait on a stopped run",
     "tests/faults/test_stop_faults.py", ()),
    ("the sidebar's stop of a slow run", "tests/ui/server/test_handlers.py",
     ("test_the_sidebars_stop_waits_for_a_slow_step_and_says_so_while_it_does",)),
    ("N2: a course preset's SLURM limits by every sbatch spelling; requeues within max_time; quoted paths",
     "tests/faults/test_preset_slurm_faults.py", ()),
    ("N3: another user's serve.json and tensorboard.json; registry rows that are no run; garbage launch.json",
     "tests/faults/test_foreign_files_faults.py", ()),
    ("N4-N6, D8: nested JSON, a trickling image host, a huge picture's header, URL credentials, long prompts",
     "tests/faults/test_input_bounds_faults.py", ()),
    ("N7, N8: layer indices, NUL in paths; the panel's Load, Save names and secret check bounded",
     "tests/faults/test_config_bounds_faults.py", ()),
    ("idle warm processes bounded per user and gone when memory is short",
     "tests/faults/test_warm_bounds_faults.py", ()),
    ("a live view never draws one panel ahead of another", "tests/ui/test_dashboard.py",
     ("test_a_view_draws_each_poll_whole_never_one_panel_ahead_of_another",)),
]  # fmt: skip


def main(argv: list[str]) -> int:
    targets: list[str] = []
    for case, file, tests in CASES:
        print(f"- {case}: {file}" + (f" ({', '.join(tests)})" if tests else ""))
        targets += [f"{file}::{t}" for t in tests] if tests else [file]
    listed = {file for _, file, _ in CASES}
    for path in sorted((ROOT / "tests" / "faults").glob("test_*.py")):  # a new fault file is replayed too
        if (rel := str(path.relative_to(ROOT))) not in listed:
            print(f"- (not in the table) {rel}")
            targets.append(rel)
    env = {**os.environ, "NBTRAIN_ROTATION_KILLS": os.environ.get("NBTRAIN_ROTATION_KILLS", "20")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *dict.fromkeys(targets)]
    cmd += argv
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
