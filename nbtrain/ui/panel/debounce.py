"""One background thread that runs the latest of a stream of jobs once typing pauses."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

# -------------------------------------------------------------------------------------- debouncing


class Debouncer:
    """Runs ``job(item, generation)`` in one background thread on the latest submitted item, once
    ``delay`` seconds have passed without a newer one. Errors in the job go to ``on_error``."""

    def __init__(
        self, delay: float, job: Callable[[Any, int], None], on_error: Callable[[str], None]
    ) -> None:
        self.delay = delay
        self._job = job
        self._on_error = on_error
        self._cond = threading.Condition()
        self._item: Any = None
        self._submitted = 0
        self._taken = 0
        self._done = 0
        self._due = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def latest(self) -> int:
        return self._submitted

    def submit(self, item: Any) -> None:
        with self._cond:
            if self._closed:
                return
            self._item = item
            self._submitted += 1
            self._due = time.monotonic() + self.delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nbtrain-panel-check", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or self._done >= self._submitted, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if self._taken < self._submitted:
                        wait = self._due - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                item, gen = self._item, self._submitted
                self._taken = gen
            try:
                self._job(item, gen)
            except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
                self._on_error(traceback.format_exc())
            finally:
                with self._cond:
                    self._done = gen
                    self._cond.notify_all()
