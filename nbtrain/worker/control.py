"""How a running worker learns it should stop or checkpoint: a signal, or a file in <run>/control/."""

from __future__ import annotations

import time

from nbtrain.rundir import RunPaths


class StopControl:
    """Polled between steps; cheap enough to check on every step (one ``stat``, throttled)."""

    def __init__(self, paths: RunPaths, poll_interval: float = 0.5) -> None:
        self.paths = paths
        self.reason: str | None = None
        self._poll_interval = poll_interval
        self._last_poll = 0.0

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    @property
    def requested(self) -> bool:
        if self.reason is None:
            now = time.monotonic()
            if now - self._last_poll >= self._poll_interval:
                self._last_poll = now
                if self.paths.control_file("stop").exists():
                    self.request("control/stop")
        return self.reason is not None
