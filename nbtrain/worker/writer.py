"""The run-directory writes of a training step, done off the training thread.

Every logged step appends to metrics.jsonl and system.jsonl, and about once a second replaces
status.json (written whole and fsynced, so that a reader never sees half a file and a crash never leaves
an empty one). An fsync takes milliseconds on a quiet disk and hundreds of them on a busy one; on the
training thread that was a stall between steps. Here the training thread only builds the record and
queues it (O(1)); one daemon thread per process encodes and writes, in the order queued.

The writer wakes every ``INTERVAL`` seconds and writes everything queued since, rather than at each
record: a thread woken at every step took the GIL and a core from the step's two compute threads, ~2.5 ms
a step on 2 cores (the tiny model's step is ~11 ms). A live view reads the files at most 0.2 s later.

``drain()`` waits until everything queued is on disk: before a final status (completed, stopped, failed)
is written directly, so that no queued "running" lands after it.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

INTERVAL = 0.2  # seconds between the writer's rounds
_queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
_wake = threading.Event()  # drain(): write now, not at the next round


def _loop() -> None:
    while True:
        _wake.wait(INTERVAL)
        _wake.clear()
        while True:
            try:
                fn, args, kwargs = _queue.get_nowait()
            except queue.Empty:
                break
            try:
                fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - a failed write must not end the writer (or the run)
                print(
                    f"nbtrain: a run-directory write failed: {type(e).__name__}: {e}",
                    file=sys.stderr,
                    flush=True,
                )


def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` on the writer thread, after everything submitted before it."""
    global _thread
    if _thread is None or not _thread.is_alive():
        with _lock:
            if _thread is None or not _thread.is_alive():
                _thread = threading.Thread(target=_loop, name="nbtrain-writer", daemon=True)
                _thread.start()
    _queue.put((fn, args, kwargs))


def drain(timeout: float = 60.0) -> bool:
    """Return once everything submitted so far is written (True), or after ``timeout`` seconds of a
    write that does not return (a hung file system: False, and the caller goes on)."""
    if _thread is None or not _thread.is_alive():
        return True
    done = threading.Event()
    _queue.put((done.set, (), {}))
    _wake.set()
    return done.wait(timeout)
