"""A running run's time left and its first loss (control/runs/eta): from the logged records while they are
enough, else from the worker's step timing in status.json once two steps are timed, whatever logging_steps
is; nothing for a run that is not training."""

from __future__ import annotations

import numpy as np
import pytest

from nbtrain.control.runs.eta import about, logged_seconds_per_step, loss_every, remaining, time_left
from nbtrain.control.runs.run import RunStatus

NOW = 1_000_000.0


def running(step: int, *, timed: int, spp: float | None = 3.0, ended: float | None = NOW) -> RunStatus:
    return RunStatus(
        "running", step=step, max_steps=100, step_seconds=spp, step_ended=ended, steps_timed=timed
    )


def test_two_timed_steps_give_the_time_left_before_any_loss_is_logged() -> None:
    left = time_left(running(2, timed=2), logged=None, losses=0, loss_every=5, now=NOW)
    assert left.seconds == pytest.approx(98 * 3.0) and left.source == "steps"
    assert left.text == "4 min 54 s left"
    assert left.first_loss_step == 5 and left.first_loss_in == pytest.approx(9.0)
    assert left.first_loss_text == "first loss at step 5, in a few seconds"


def test_one_timed_step_gives_no_time_left_but_says_where_the_first_loss_comes() -> None:
    left = time_left(running(1, timed=1, spp=40.0), logged=None, losses=0, loss_every=50, now=NOW)
    assert left.seconds is None and left.text is None
    assert left.first_loss_text == "first loss at step 50"


def test_the_step_in_progress_counts_down_between_status_writes() -> None:
    st = running(10, timed=5, spp=70.0, ended=NOW - 30)
    left = time_left(st, logged=None, losses=0, loss_every=50, now=NOW)
    assert left.seconds == pytest.approx(90 * 70.0 - 30)
    assert left.first_loss_in == pytest.approx(40 * 70.0 - 30)
    assert left.first_loss_text == "first loss at step 50, in about 46 min"
    # never below the step's end: a step slower than the median leaves the rest, not less
    late = time_left(
        running(10, timed=5, spp=70.0, ended=NOW - 500), logged=None, losses=0, loss_every=50, now=NOW
    )
    assert late.seconds == pytest.approx(89 * 70.0)


def test_the_logged_records_timing_wins_once_there_are_enough_and_the_first_loss_is_gone() -> None:
    left = time_left(running(40, timed=5, spp=9.0, ended=None), logged=1.5, losses=8, loss_every=5, now=NOW)
    assert left.source == "logged" and left.seconds == pytest.approx(60 * 1.5)
    assert left.first_loss_text is None and left.first_loss_step is None


@pytest.mark.parametrize("state", ["queued", "starting", "stopped", "completed", "failed", "stopping"])
def test_a_run_that_is_not_training_has_no_time_left(state: str) -> None:
    st = RunStatus(state, step=4, max_steps=10, step_seconds=1.0, step_ended=NOW, steps_timed=4)
    left = time_left(st, logged=1.0, losses=0, loss_every=5, now=NOW)
    assert left.text is None and left.first_loss_text is None


def test_a_stop_under_way_has_no_time_left() -> None:
    st = running(4, timed=4)
    st.stop_asked = True
    assert time_left(st, logged=None, losses=0, loss_every=5, now=NOW).text is None


def test_a_resumed_run_past_a_logging_step_waits_for_the_next_one() -> None:
    left = time_left(running(7, timed=2, spp=2.0), logged=None, losses=0, loss_every=5, now=NOW)
    assert left.first_loss_step == 10 and left.first_loss_in == pytest.approx(6.0)
    # at a logging step itself the record may be on its way: that step, any moment now
    at = time_left(running(5, timed=2, spp=2.0), logged=None, losses=0, loss_every=5, now=NOW)
    assert at.first_loss_step == 5 and at.first_loss_text == "first loss at step 5, in a few seconds"


def test_logging_steps_past_the_last_step_says_no_loss_is_logged() -> None:
    left = time_left(running(2, timed=2), logged=None, losses=0, loss_every=500, now=NOW)
    assert left.first_loss_text == "no loss is logged: logging_steps 500 is past max_steps 100"
    assert left.text == "4 min 54 s left"


def test_loss_every_reads_the_train_args_as_the_trainer_does() -> None:
    assert loss_every({"logging_steps": 5}, 100) == 5
    assert loss_every({"logging_steps": 0.1}, 95) == 10  # a fraction of the run, rounded up
    assert loss_every({"logging_steps": 50, "logging_first_step": True}, 100) == 1
    assert loss_every({}, 100) == 10  # TRL's default (SFTConfig's, not transformers' 500): trainargs.value
    assert loss_every({"logging_strategy": "epoch", "logging_steps": 5}, 100) is None
    assert loss_every({"logging_strategy": "no"}, 100) is None
    assert loss_every({"logging_steps": "five"}, 100) is None
    assert loss_every(None, 100) == 10


def test_records_timing_needs_four_intervals_and_leaves_out_a_pause() -> None:
    rows = [(NOW + i * 2.0, 5.0 * i) for i in range(4)]  # every 5 steps, 2 s apart: 0.4 s a step
    assert logged_seconds_per_step(rows) is None  # three intervals
    rows.append((NOW + 8.0, 20.0))
    assert logged_seconds_per_step(rows) == pytest.approx(0.4)
    # an hour stopped between two records: that interval is not a step's time
    rows += [(NOW + 3608.0, 25.0), *[(NOW + 3608.0 + 2.0 * i, 25.0 + 5.0 * i) for i in range(1, 5)]]
    pause = ((NOW + 3600.0, NOW + 3600.0),)
    assert logged_seconds_per_step(np.array(rows), pause) == pytest.approx(0.4)


def test_words_for_time_left_and_how_soon() -> None:
    assert remaining(4) == "4 s left" and remaining(130) == "2 min 10 s left"
    assert remaining(3 * 3600 + 5 * 60) == "3 h 05 min left"
    assert about(3) == "in a few seconds" and about(45) == "in about 45 s"
    assert about(190) == "in about 3 min" and about(2 * 3600 + 600) == "in about 2 h 10 min"
