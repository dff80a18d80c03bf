"""How a running worker learns it should stop or checkpoint: a signal, or a file in <run>/control/."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

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

    def take_checkpoint_request(self) -> bool:
        """True once per ``control/checkpoint`` file (``%finetune checkpoint``); the file is consumed."""
        f = self.paths.control_file("checkpoint")
        try:
            f.unlink()
        except FileNotFoundError:
            return False
        return True


class LogCap:
    """Keeps this process's log (its stdout and stderr, fds 1 and 2) under a size cap.

    Output goes straight to a file, so a chatty worker never blocks; past ``max_bytes`` the file is
    rotated to ``<name>.1`` (the previous one dropped) and fds 1 and 2 are pointed at a fresh file.
    The cap is NBTRAIN_LOG_MAX_BYTES (default 64 MiB).
    """

    def __init__(self, path: Path, max_bytes: int | None = None, interval: float = 1.0) -> None:
        self.path = path
        self.max_bytes = max_bytes or int(os.environ.get("NBTRAIN_LOG_MAX_BYTES", str(64 * 2**20)))
        self.interval = interval
        self.rotations = 0

    def start(self) -> None:
        threading.Thread(target=self._loop, name="nbtrain-logcap", daemon=True).start()

    def check(self) -> None:
        try:
            size = os.fstat(1).st_size
        except OSError:
            return
        if size <= self.max_bytes or not self.path.exists():
            return
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.rotations += 1

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            self.check()
