"""A running run's time left and when its first loss comes: the one estimate every view shows (the cell's
header, and through the server extension the sidebar's card, the run's page and Notebook 7's tab).

Speed comes from the logged records while they are enough (their timing spans evaluations and checkpoints),
else from the worker's own step timing in status.json (``step_seconds``, written every step whether or not
it logs), so a run that logs every 5 or 50 steps has an estimate once two of its steps are timed. None
before that: one step, the first with its warm-up, says little about the rest."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtrain.control.config import trainargs
from nbtrain.control.runs.metrics import FloatArray
from nbtrain.control.runs.run import RunStatus

RECENT = 100  # logged steps the speed is measured over
MIN_INTERVALS = 4  # logged intervals the records' speed needs (a few steps say little about the rest)
MIN_TIMED = 2  # steps the worker must have timed before its step_seconds gives an estimate


def _mean_clipped(per_step: FloatArray, weights: FloatArray) -> float:
    # step-weighted mean of seconds per step, each interval clipped to [median/3, 3 x median]: a pause for
    # evaluation or a checkpoint moves it a little, and no single interval moves it much
    med = float(np.median(per_step))
    clipped = np.clip(per_step, med / 3, med * 3)
    return float(np.sum(clipped * weights) / np.sum(weights))


def logged_seconds_per_step(
    recent: FloatArray | Sequence[tuple[float, float]], pauses: tuple[tuple[float, float], ...] = ()
) -> float | None:
    """Seconds per step from the last logged records (``recent``: rows of (wall time, step), ascending),
    outliers clipped, intervals across a pause (a stop and its resume) left out; None with fewer than
    ``MIN_INTERVALS`` intervals."""
    r = np.asarray(recent, dtype=np.float64).reshape(-1, 2)[-RECENT - 1 :]
    if len(r) < 2:
        return None
    dt, ds = np.diff(r[:, 0]), np.diff(r[:, 1])
    ok = (ds > 0) & (dt > 0)
    for a, b in pauses:
        ok &= ~((r[:-1, 0] < b) & (r[1:, 0] > a))
    if ok.sum() < MIN_INTERVALS:
        return None
    return _mean_clipped(dt[ok] / ds[ok], ds[ok])


def loss_every(train_args: Mapping[str, Any] | None, max_steps: int | None) -> int | None:
    """Every how many steps the Trainer logs a loss, from resolved.json's ``train_args``: a step count, a
    fraction of the run below 1 (as transformers reads it), 1 with ``logging_first_step`` for the first
    one; None when it logs none by steps (``logging_strategy`` no or epoch)."""
    args = train_args or {}
    if str(trainargs.value(args, "logging_strategy")).lower() != "steps":
        return None
    if trainargs.value(args, "logging_first_step") is True:
        return 1
    every = trainargs.value(args, "logging_steps")
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every <= 0:
        return None
    if every < 1:
        return math.ceil(every * max_steps) if max_steps else None
    return int(every)


def remaining(seconds: float) -> str:
    """Time left in words ("18 min 10 s left"): "ETA 18:10" reads like a clock time."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s // 60 % 60:02d} min left"
    return f"{s // 60} min {s % 60:02d} s left" if s >= 60 else f"{s} s left"


def about(seconds: float) -> str:
    """How soon, roughly: "in a few seconds", "in about 40 s", "in about 3 min", "in about 2 h 10 min"."""
    s = max(0, round(seconds))
    if s < 10:
        return "in a few seconds"
    if s < 90:
        return f"in about {s} s"
    if s < 90 * 60:
        return f"in about {round(s / 60)} min"
    return f"in about {s // 3600} h {s // 60 % 60:02d} min"


@dataclass(frozen=True)
class TimeLeft:
    """What a live view says of a running run's time: ``seconds`` left to its last step (None: not known
    yet, or the run is not training), the speed it came from, and before the first logged loss the step
    it comes at and how soon."""

    seconds: float | None = None
    seconds_per_step: float | None = None
    source: str | None = None  # "logged" (the records' timing) or "steps" (status.json's step_seconds)
    first_loss_step: int | None = None
    first_loss_in: float | None = None
    loss_every: int | None = None
    max_steps: int | None = None

    @property
    def text(self) -> str | None:
        """Time left in words ("18 min 10 s left"), or None."""
        return None if self.seconds is None else remaining(self.seconds)

    @property
    def first_loss_text(self) -> str | None:
        """When the first loss comes: "first loss at step 5, in about 3 min" ("first loss at step 5" before
        two steps are timed); a run whose ``logging_steps`` lies past its last step says it logs none; None
        once a loss is logged."""
        if self.loss_every is None:
            return None
        if self.first_loss_step is None:
            return f"no loss is logged: logging_steps {self.loss_every} is past max_steps {self.max_steps}"
        text = f"first loss at step {self.first_loss_step:,}"
        return text if self.first_loss_in is None else f"{text}, {about(self.first_loss_in)}"


def time_left(
    status: RunStatus,
    *,
    logged: float | None,
    losses: int,
    loss_every: int | None,
    step: int | None = None,
    now: float,
) -> TimeLeft:
    """The estimate for ``status``: ``logged``, the seconds per step its records give
    (:func:`logged_seconds_per_step`, None while too few), else status.json's ``step_seconds`` once
    ``MIN_TIMED`` steps are timed; ``losses``: loss records read so far; ``loss_every``: :func:`loss_every`
    of its train args; ``step``: the step shown, when the records are ahead of status.json."""
    if status.state != "running" or status.stop_asked:
        return TimeLeft()  # not training: a stop under way, starting, queued or ended
    step = max(status.step, step or 0)
    spp, source = logged, "logged"
    if spp is None and status.step_seconds is not None and status.steps_timed >= MIN_TIMED:
        spp, source = status.step_seconds, "steps"
    # the step in progress: part of it has gone by since the last one ended
    into = 0.0
    if spp is not None and status.step_ended is not None and step == status.step:
        into = min(max(0.0, now - status.step_ended), spp)
    seconds = None
    if spp is not None and status.max_steps:
        seconds = max(0.0, max(0, status.max_steps - step) * spp - into)
    first_step = first_in = None
    if losses == 0 and loss_every is not None:
        # the next multiple of loss_every from here (a resumed run may be past the first; at a multiple
        # itself, its record may still be on its way)
        first_step = max(loss_every, math.ceil(step / loss_every) * loss_every)
        if status.max_steps and first_step > status.max_steps:
            first_step = None
        elif spp is not None:
            first_in = max(0.0, (first_step - step) * spp - into)
    return TimeLeft(
        seconds=seconds,
        seconds_per_step=spp,
        source=source if spp is not None else None,
        first_loss_step=first_step,
        first_loss_in=first_in,
        loss_every=loss_every if losses == 0 else None,
        max_steps=status.max_steps,
    )
