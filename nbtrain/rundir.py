"""The run directory: the one contract between a kernel and a training process.

Both sides import this module, so it stays dependency-free (stdlib only). Layout and file meanings are
described in DESIGN.md; this module is their single implementation: paths, atomic status writes,
append-only JSONL with a schema line, and the control files a worker polls.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_SCHEMA = 1
# Written into checkpoints/checkpoint-N by the worker once the Trainer has saved all of it; resume
# trusts only checkpoints that carry it.
COMPLETE_MARKER = ".nbtrain-complete"

ACTIVE_STATES = ("queued", "starting", "running", "stopping")
TERMINAL_STATES = ("completed", "failed", "stopped")
STATES = ACTIVE_STATES + TERMINAL_STATES


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def resolved(self) -> Path:
        return self.root / "resolved.json"

    @property
    def launch(self) -> Path:
        return self.root / "launch.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def system(self) -> Path:
        return self.root / "system.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def output(self) -> Path:
        return self.root / "output"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def control_file(self, name: str) -> Path:
        return self.control / name

    def make(self) -> None:
        for d in (self.root, self.logs, self.control, self.checkpoints):
            d.mkdir(parents=True, exist_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=str) + "\n")


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_status(
    paths: RunPaths,
    state: str,
    *,
    step: int | None = None,
    max_steps: int | None = None,
    error: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Write status.json atomically, keeping fields the caller did not mention."""
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}")
    try:
        old: dict[str, Any] = read_json(paths.status)
    except (FileNotFoundError, json.JSONDecodeError):
        old = {}
    new = {**old, **extra, "state": state, "updated": time.time()}
    if step is not None:
        new["step"] = step
    if max_steps is not None:
        new["max_steps"] = max_steps
    new.setdefault("step", 0)
    new.setdefault("max_steps", None)
    new["error"] = (error or {"type": "unknown", "message": "the run failed"}) if state == "failed" else None
    atomic_write_json(paths.status, new)
    return new


class JsonlWriter:
    """Append-only JSONL file whose first line names the schema version.

    Each record is written with one ``write`` call and flushed, so a reader sees whole lines except
    possibly a partial last one, which readers skip until it is complete.
    """

    def __init__(self, path: Path, kind: str) -> None:
        new = not path.exists() or path.stat().st_size == 0
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the writer
        if new:
            self._write({"schema": METRICS_SCHEMA, "kind": kind})

    def _write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, default=_json_default) + "\n")
        self._f.flush()

    def write(self, record: dict[str, Any]) -> None:
        self._write(record)

    def close(self) -> None:
        self._f.close()


def _json_default(o: Any) -> Any:
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)


def iter_jsonl(path: Path, offset: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(end_offset, record)`` for each complete line from ``offset`` on.

    Schema header lines and a trailing line without its newline (still being written) are skipped;
    resume from the last yielded offset to read only new bytes.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        f.seek(offset)
        pos = offset
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            pos += len(raw)
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "schema" not in rec:
                yield pos, rec


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [rec for _, rec in iter_jsonl(path)]


def tail_text(path: Path, n: int = 40, max_bytes: int = 256_000) -> str:
    """The last ``n`` lines of a (possibly large) text file, reading at most ``max_bytes``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""


def request_control(paths: RunPaths, name: str) -> None:
    paths.control.mkdir(parents=True, exist_ok=True)
    paths.control_file(name).write_text(str(time.time()), encoding="utf-8")
