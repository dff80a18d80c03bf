"""Kills around checkpoint rotation (issue 2/9): with ``save_total_limit: 1`` and a checkpoint every step,
kill -9 the run at random moments (inside saves, marks and rotations) and resume it, again and again. After
every kill a complete checkpoint exists, resume picks it and never deletes it, and old ones are rotated away.

The rotation itself (nbtrain's, after the new checkpoint is marked) and resume's repair are checked on
hand-made checkpoint folders in tests/contract/test_rundir.py; this replays them on a real training run."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.rundir import COMPLETE_MARKER, checkpoints, latest_complete_checkpoint
from tests.control.test_resume import config, kill_group, wait_step

pytestmark = pytest.mark.slow


def test_kills_during_rotation_always_leave_a_complete_checkpoint_that_resume_keeps(workdir: Path) -> None:
    kills = int(os.environ.get("NBTRAIN_ROTATION_KILLS", "5"))  # the suite's share; replay with more
    rng = random.Random(int(os.environ.get("NBTRAIN_TRIAL_SEED", "11")))
    text = config(100_000, save_steps=1).replace("  save_steps: 1", "  save_steps: 1\n  save_total_limit: 1")
    run = nbtrain.finetune(text, name="rotation")
    wait_step(run, 2)
    in_the_gap = 0
    for i in range(kills):
        time.sleep(rng.uniform(0.0, 0.6))
        kill_group(run)
        found = checkpoints(run.paths)
        assert len(found) <= 2, found  # the kept one, and at most the one being written
        ckpt = latest_complete_checkpoint(run.paths)
        assert ckpt is not None, (i, found)
        in_the_gap += not (ckpt / COMPLETE_MARKER).exists()
        if i == 0:  # as if killed after the Trainer's last write, before the mark, the older one gone
            for _, d in found:
                (d / COMPLETE_MARKER).unlink(missing_ok=True)
        step = int(ckpt.name.split("-")[1])
        run = run.resume()
        assert run.resolved["resume"]["from"] == str(ckpt) and ckpt.exists()
        assert (ckpt / COMPLETE_MARKER).exists()  # verified, then marked
        wait_step(run, step + 2)  # it trains and saves again before the next kill
    st = run.stop()
    assert st.state == "stopped", run.logs(40)
    left = checkpoints(run.paths)
    assert [d.name for _, d in left] == [f"checkpoint-{st.step}"]  # save_total_limit: 1 holds
    assert not list(run.paths.checkpoints.glob(".removing-*"))
    print(f"{kills} kills around rotation: a complete checkpoint after each, {in_the_gap} found unmarked "
          f"but whole (verified and marked by resume); stopped at step {st.step}")  # fmt: skip
