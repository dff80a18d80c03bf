"""The run directory: the one contract between a kernel and a training process.

Both sides import this module, so it stays dependency-free (stdlib only). Layout and file meanings are
described in DESIGN.md; this module is their single implementation: paths, atomic status writes,
append-only JSONL with a schema line, and the control files a worker polls.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nbtrain.contract.errors import NbtrainError

METRICS_SCHEMA = 1
# No record nbtrain writes in a JSONL file is near this long: a longer line is skipped by every reader, in
# bounded reads, never held whole (a crash or a foreign writer can leave one with no end).
MAX_LINE = 1 << 20
# Nor is any JSON file it writes (status, launch, resolved, serve, ...) near this large.
MAX_JSON_BYTES = 16 << 20
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

    @property
    def lock(self) -> Path:
        """The writer lock: the one process that trains in this directory holds an flock on it."""
        return self.root / ".lock"

    @property
    def trainer_lock(self) -> Path:
        """The trainer's own lock: taken by the process that trains (rank 0) with a file of its own, so a
        second process on the same directory cannot train, whatever lock it was handed."""
        return self.root / ".trainer.lock"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def control_file(self, name: str) -> Path:
        return self.control / name

    def rank_pid_file(self, rank: int) -> Path:
        """Where a notebook_launcher rank records its pid (its ranks have no process group of their own)."""
        return self.control / f"pid-rank{rank}"

    def rank_pids(self) -> list[int]:
        pids = []
        for f in self.control.glob("pid-rank*"):
            try:
                pids.append(int(f.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
        return pids

    def not_yours(self, *also: Path) -> str | None:
        """Why this run directory is not this user's to act on, or None. Its folder and the files that say
        what to run or which processes to signal (config.yaml, resolved.json, launch.json, the ranks' pid
        files) must be owned by this user: in a runs root others can write to (a course's shared folder),
        a directory someone else made could otherwise have you re-run their config (their model's code,
        with trust_remote_code) or signal your own processes named in their launch.json.

        ``also``: the other files of the run whose word a caller is about to act on, checked the same way
        (serve.json and tensorboard.json: the process group a stop signals, the URL prompts are sent to,
        the key that goes with them)."""
        me = os.geteuid()
        files = [self.root, self.config, self.resolved, self.launch, *sorted(self.control.glob("pid-rank*"))]
        for f in [*files, *also]:
            try:
                owner = os.lstat(f).st_uid
            except FileNotFoundError:
                continue
            except OSError as e:
                return f"{f} cannot be read ({e.strerror})"
            if owner != me:
                fix = (
                    "To train it yourself, start a new run from its config.yaml"
                    if f == self.root
                    else f"The folder is yours: remove {f.name} if you did not expect it, and let no one "
                    f"else write there (chmod go-w {self.root})"
                )
                return (
                    f"{f} is owned by uid {owner}, not by you (uid {me}): nbtrain does not resume, stop, "
                    f"serve or load a run another user's files describe, nor signal the processes or use "
                    f"the servers they name. {fix}"
                )
        return None

    def not_a_run(self) -> str | None:
        """Why this folder is not a run directory of this user's, or None. nbtrain makes every run
        directory at an absolute path with its resolved.json in it (the registry's rows are read through
        this: a row naming ``/etc``, a relative path or another user's run is no run to list or act on),
        and a run is this user's as :meth:`not_yours` says."""
        if not self.root.is_absolute():
            return f"{self.root} is a relative path: nbtrain records every run directory by its absolute path"
        if not os.path.lexists(self.resolved):
            return f"{self.root} holds no resolved.json: it is not a run directory nbtrain made"
        return self.not_yours()

    def make(self) -> None:
        for d in (self.root, self.logs, self.control, self.checkpoints):
            d.mkdir(parents=True, exist_ok=True)


# The fd number of the run's writer lock, passed from the kernel to the process it starts (pass_fds).
RUN_LOCK_ENV = "NBTRAIN_RUN_LOCK_FD"


def lock_run(paths: RunPaths) -> int | None:
    """Take the run directory's writer lock; returns its fd, or None when another process holds it.

    An flock, so the OS releases it when the holder dies (kill -9 included) and a lost run never stays
    locked. A process started with this fd in ``pass_fds`` shares the lock: the kernel takes it, starts the
    worker with it, and closes its own copy; the worker (or its launcher) then holds it for its life.
    """
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_trainer(paths: RunPaths, wait: float = 5.0) -> int | None:
    """Take the trainer's lock (``RunPaths.trainer_lock``), opened here, never inherited; returns its fd, or
    None when another process trains in the directory. A holder that was just killed drops it as it
    exits: it is tried for ``wait`` seconds."""
    fd = os.open(paths.trainer_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)


def holds_inherited_lock(paths: RunPaths) -> bool:
    """Whether this process was handed the run's lock (``RUN_LOCK_ENV`` names an open fd on the lock file)."""
    try:
        fd = int(os.environ[RUN_LOCK_ENV])
        mine, there = os.fstat(fd), os.stat(paths.lock)
    except (KeyError, ValueError, OSError):
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never a mix. The file is
    private (0600) unless ``mode`` says otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_json(obj: Any) -> Any:
    """``obj`` with every NaN / infinite float replaced by None. Python's json writes them as bare
    ``NaN`` / ``Infinity``, which is not JSON: the browser's JSON.parse (the sidebar) rejects the file."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj: Any) -> None:
    text = json.dumps(finite_json(obj), indent=1, default=str, allow_nan=False)
    atomic_write_text(path, text + "\n")


class NotRegularFile(NbtrainError, OSError):
    """A run-directory file that is not a regular file (a FIFO, a symlink, a directory, a device): it is
    not read. A FIFO would block the reader forever, a symlink could point anywhere outside the run."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "of an unknown kind"


def _refuse(path: Path, what: str, expected: str = "a regular file") -> NotRegularFile:
    return NotRegularFile(
        f"{path} is {what}, not {expected}: nbtrain reads only regular files and directories inside a run "
        "directory (no links, pipes or devices); remove it or replace it with the file itself"
    )


def open_regular(path: Path, *, below: Path | None = None) -> IO[bytes]:
    """Open ``path`` for reading (binary) only if it is a regular file, without ever blocking or following a
    symbolic link: not its last component, nor (with ``below``, a directory above it) any component under
    ``below``. Anything else raises :class:`NotRegularFile` naming it; a missing file FileNotFoundError.

    O_NONBLOCK makes opening a FIFO return at once (a plain open() waits for a writer forever); fstat then
    refuses it. Each component is opened relative to the one above (``dir_fd``), so a link swapped in
    between a check and the open is refused too.
    """
    path = Path(path)
    parts: tuple[str, ...]
    if below is None:
        below, parts = path.parent, (path.name,)
    else:
        parts = path.relative_to(below).parts  # ValueError: a path outside ``below`` is a caller's mistake
        if not parts:
            raise _refuse(path, "the directory itself")
    dfd = os.open(below, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = below
        for part in parts[:-1]:
            here = here / part
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                raise
            except OSError:  # ELOOP / ENOTDIR: a link or a file where a directory belongs; else EACCES...
                mode = os.lstat(part, dir_fd=dfd).st_mode
                if stat.S_ISDIR(mode):
                    raise
                raise _refuse(here, _kind(mode), "a directory") from None
            os.close(dfd)
            dfd = nfd
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(parts[-1], flags, dir_fd=dfd)
        except FileNotFoundError:
            raise
        except OSError:  # ELOOP: a symlink; ENXIO: a socket; a regular file: EACCES and the like
            mode = os.lstat(parts[-1], dir_fd=dfd).st_mode
            if stat.S_ISREG(mode):
                raise
            raise _refuse(path, _kind(mode)) from None
    finally:
        os.close(dfd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, _kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: Path, *, max_bytes: int | None = None, below: Path | None = None) -> Any:
    """A JSON file, opened with :func:`open_regular` (so a FIFO or a link raises :class:`NotRegularFile`).

    With ``max_bytes`` a larger file is a ValueError, read no further than that; so is JSON nested too
    deep for the parser (RecursionError), so that callers catching ValueError catch every unreadable file.
    """
    with open_regular(path, below=below) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes} bytes: not a file nbtrain wrote")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{path} is nested too deep to parse: not a file nbtrain wrote") from None


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
        # A NaN / infinite value is written as null and named in "nonfinite" (valid JSON for every reader,
        # and the fact that the loss went NaN is kept).
        bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            record = {**finite_json(record), "nonfinite": bad}
        self._f.write(json.dumps(record, default=_json_default, allow_nan=False) + "\n")
        self._f.flush()

    def write(self, record: dict[str, Any]) -> None:
        self._write(record)

    def close(self) -> None:
        self._f.close()


def _json_default(o: Any) -> Any:
    try:
        f = float(o)  # numpy / torch scalars
    except (TypeError, ValueError):
        return str(o)
    return f if math.isfinite(f) else None


def iter_jsonl(
    path: Path, offset: int = 0, *, max_line: int = MAX_LINE
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(end_offset, record)`` for each complete line from ``offset`` on.

    Schema header lines and a trailing line without its newline (still being written) are skipped;
    resume from the last yielded offset to read only new bytes. Opened with :func:`open_regular` (a FIFO
    or a link raises :class:`NotRegularFile`); a line longer than ``max_line`` is no record and is skipped
    in bounded reads, never held whole.
    """
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return
    with f:
        f.seek(offset)
        pos = offset
        while raw := f.readline(max_line + 1):
            if len(raw) > max_line:  # too long to be a record: skip to its newline, a chunk at a time
                while not raw.endswith(b"\n"):
                    pos += len(raw)
                    raw = f.readline(max_line)
                    if not raw:
                        return
                pos += len(raw)
                continue
            if not raw.endswith(b"\n"):
                break
            pos += len(raw)
            rec = parse_record(raw)
            if rec is not None:
                yield pos, rec


def parse_record(line: bytes) -> dict[str, Any] | None:
    """One line of a JSONL file as a record, or None: the schema header, a blank line, a line torn or
    NUL-padded after a crash, not UTF-8, nested too deep to parse, or not a JSON object."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and "schema" not in rec else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [rec for _, rec in iter_jsonl(path)]


def read_tail(path: Path, n: int = 40, max_bytes: int = 256_000, *, below: Path | None = None) -> str:
    """The last ``n`` lines of a (possibly large) text file, reading at most its last ``max_bytes``.

    Opened with :func:`open_regular` (``below``: no link followed under that directory): a FIFO or a link
    raises :class:`NotRegularFile`; a missing file reads as empty."""
    try:
        with open_regular(path, below=below) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""


def tail_text(path: Path, n: int = 40, max_bytes: int = 256_000, *, below: Path | None = None) -> str:
    """:func:`read_tail`, for messages: a log that is a FIFO or a link reads as one line saying so (it never
    blocks and never shows what a link points to)."""
    try:
        return read_tail(path, n, max_bytes, below=below)
    except NotRegularFile as e:
        return f"[nbtrain: {e}]"


def request_control(paths: RunPaths, name: str, by: str | None = None) -> None:
    """Leave a request (stop, checkpoint) for the worker. Never creates the run directory itself.

    ``by`` says who asked (``{"t", "by"}`` is written, else the time alone): the worker reports it as the
    run's ``stop_reason``, even when the SIGTERM that follows a stop reaches it first.

    Written beside and renamed into place: a link or a FIFO at that name is replaced, never written
    through (that could overwrite a file outside the run, or block the writer forever)."""
    paths.control.mkdir(exist_ok=True)
    if paths.control.is_symlink():
        raise _refuse(paths.control, "a symbolic link", "a directory")
    text = str(time.time()) if by is None else json.dumps({"t": time.time(), "by": by})
    atomic_write_text(paths.control_file(name), text)


# --------------------------------------------------------------------------------------- checkpoints
# checkpoints/checkpoint-N is written by the Trainer: weights, optimizer, scheduler and RNG state, then
# trainer_state.json last. The worker marks it complete (COMPLETE_MARKER) once the Trainer is done with
# it. The worker, not the Trainer, removes old checkpoints (``save_total_limit``), and only after the new
# one is marked, so a kill at any moment leaves at least one complete checkpoint once one was written.

TRAINER_STATE = "trainer_state.json"


def checkpoint_step(d: Path) -> int | None:
    """N of a ``checkpoint-N`` directory, else None."""
    head, _, tail = d.name.partition("-")
    return int(tail) if head == "checkpoint" and tail.isdigit() else None


def checkpoints(paths: RunPaths) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint-N under RUN_DIR/checkpoints, oldest first (links skipped)."""
    found = []
    for d in paths.checkpoints.glob("checkpoint-*") if paths.checkpoints.is_dir() else []:
        step = checkpoint_step(d)
        if step is not None and d.is_dir() and not d.is_symlink():
            found.append((step, d))
    return sorted(found)


def is_marked_complete(d: Path) -> bool:
    return (d / COMPLETE_MARKER).is_file()


def holds_trainer_state(d: Path) -> bool:
    """Whether ``d`` was written to the end by the Trainer: its trainer_state.json (written after the
    weights, optimizer and RNG state) parses and names the checkpoint's own step."""
    try:
        state = json.loads((d / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("global_step") == checkpoint_step(d)


def mark_complete(d: Path) -> None:
    """Mark a fully written checkpoint complete (durably: written, flushed and synced)."""
    with open(d / COMPLETE_MARKER, "w", encoding="utf-8") as f:
        f.write(str(time.time()))
        f.flush()
        os.fsync(f.fileno())


def remove_checkpoint(d: Path) -> None:
    """Delete a checkpoint: renamed out of the ``checkpoint-*`` names first (one atomic step), then
    removed; a kill half-way leaves a ``.removing-`` folder that nothing reads (``clear_removed``)."""
    import shutil

    gone = d.with_name(f".removing-{d.name}")
    shutil.rmtree(gone, ignore_errors=True)
    try:
        os.rename(d, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def clear_removed(paths: RunPaths) -> None:
    """Finish removals a kill cut short."""
    import shutil

    for d in paths.checkpoints.glob(".removing-checkpoint-*") if paths.checkpoints.is_dir() else []:
        shutil.rmtree(d, ignore_errors=True)


def latest_complete_checkpoint(paths: RunPaths, *, repair: bool = False) -> Path | None:
    """The newest checkpoint to resume from: marked complete, or unmarked but holding a complete trainer
    state (a kill between the Trainer's last write and the worker's marker).

    With ``repair`` (resume, holding the run's lock) such a checkpoint is marked, and the unmarked
    remnants that hold no complete state (killed while written, or while removed) are deleted; a
    checkpoint with a complete trainer state is never deleted."""
    if repair:
        clear_removed(paths)
    best: Path | None = None
    for _, d in checkpoints(paths):
        if not is_marked_complete(d):
            if not holds_trainer_state(d):
                if repair:
                    remove_checkpoint(d)
                continue
            if repair:
                mark_complete(d)
        best = d
    return best


def rotate_checkpoints(paths: RunPaths, keep: int, *, also_keep: Path | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond the newest ``keep`` (never the newest complete one,
    nor ``also_keep``: the best model's), and unmarked remnants older than the newest complete one.
    Returns what was deleted. Call only after the newest checkpoint is marked."""
    found = checkpoints(paths)
    complete = [d for _, d in found if is_marked_complete(d)]
    if not complete:
        return []
    newest_step = checkpoint_step(complete[-1]) or 0
    kept = {d.name for d in complete[-max(1, keep) :]}
    if also_keep is not None:
        kept.add(also_keep.name)
    gone = []
    for step, d in found:
        if d.name in kept or step > newest_step:  # a newer one may be being written right now
            continue
        if d in complete or not is_marked_complete(d):
            remove_checkpoint(d)
            gone.append(d)
    return gone


def set_aside_metrics(paths: RunPaths, step: int, attempt: int) -> None:
    """A resume from the checkpoint of ``step``: keep the metrics up to it; move the later ones (the lost
    part of ``attempt``) to ``metrics.attempt<N>.jsonl``, marked, so no step is drawn twice."""
    keep: list[dict[str, Any]] = []
    later: list[dict[str, Any]] = []
    for rec in read_jsonl(paths.metrics):
        (later if rec.get("step", 0) > step else keep).append(rec)
    if later:
        with open(paths.root / f"metrics.attempt{attempt}.jsonl", "a", encoding="utf-8") as f:
            for rec in later:
                f.write(json.dumps({**rec, "superseded_by_resume_at": step}) + "\n")
    header = json.dumps({"schema": METRICS_SCHEMA, "kind": "metrics"})
    atomic_write_text(paths.metrics, "\n".join([header, *(json.dumps(r) for r in keep)]) + "\n")


def reread_status(paths: RunPaths, raw: dict[str, Any]) -> dict[str, Any]:
    """status.json read again (an engine's job ended: its worker may have written the final state since
    ``raw`` was read), else ``raw``."""
    try:
        return read_json(paths.status)
    except (FileNotFoundError, ValueError):
        return raw
