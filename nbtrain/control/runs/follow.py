"""The one "follow a run until it ends" loop: ``Run.wait``, the CLI, the live views and the panel use it.

A caller gives ``tick`` (read what is new and return the run's status: a bare ``run.status``, or a view's
refresh that also redraws) and decides what "ended" means; the loop owns the timing: the interval, the
deadline, an optional stop event (a view's background thread), and polling again at once while the
caller still has unread data (``behind``), so a view catches up with a long run without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar


class Followed(Protocol):
    """What the loop reads of a status (nbtrain.control.runs.run.RunStatus, a job's, a server's)."""

    @property
    def done(self) -> bool: ...
    def describe(self) -> str: ...


S = TypeVar("S", bound=Followed)  # the status type tick returns


class FollowStopped(Exception):
    """The follow loop's stop event was set before the run ended."""


def follow(
    tick: Callable[[], S],
    *,
    ended: Callable[[S], bool] | None = None,
    timeout: float | None = None,
    interval: float = 0.5,
    stop: threading.Event | None = None,
    behind: Callable[[], bool] | None = None,
    what: str = "run",
) -> S:
    """Call ``tick`` every ``interval`` seconds until ``ended(status)`` (default: a terminal state).

    Raises TimeoutError after ``timeout`` seconds (the run goes on), FollowStopped when ``stop`` is set.
    """
    is_ended = ended or (lambda st: st.done)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = tick()
        if is_ended(st):
            return st
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} still {st.describe()} after {timeout} s")
        pause = 0.0 if behind is not None and behind() else interval
        if stop is not None:
            if stop.wait(pause):
                raise FollowStopped(what)
        elif pause:
            time.sleep(pause)
