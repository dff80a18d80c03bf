"""For courses and autograders: a run's record saved in the notebook, and checks on a run.

    %%finetune ...                 # the cell's output carries the run's record (config, plan,
                                   # estimate; final metrics once the run ends)
    %finetune record RUN           # the same for any run, on demand (nbtrain.record(run) in Python)
    nbtrain.check(run, final_loss_below=1.0, adapter_exists=True).assert_passed()   # nbgrader-style
    nbtrain.records("submitted.ipynb")   # the records a saved notebook carries, for a grader
    nbtrain.check(nbtrain.records("submitted.ipynb")[-1], min_steps=30)    # graded from the record

The kernel cannot write the .ipynb file, so the record travels as a display output: a
``application/vnd.nbtrain.run+json`` bundle with a display id, updated when the run ends (a background
thread, or ``%finetune wait`` at once). The notebook saves it with the cell's outputs, so a submitted
notebook carries its evidence even without the run directory.

Updating an output from a thread or from another cell (:class:`CellOutput`, the dashboard uses it too):
ipykernel 7 stamps a message from a thread with the parent header of the cell that ran *last*, and
JupyterLab routes ``update_display_data`` by that parent to one cell's output area, which applies it
only when it holds that display id; so an update parented to a later cell (``%finetune wait``, anything
run meanwhile) was dropped and the saved record stayed "queued at step 0". nbclient instead only reads
messages parented to the cell it is executing and maps display ids over the whole notebook. An update
is therefore sent parented to the cell that showed the output, and once more parented to the current
cell when that is another one (which JupyterLab ignores there).
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import TERMINAL_STATES, RunPaths, open_regular
from nbtrain.control.runs.follow import FollowStopped, follow
from nbtrain.control.runs.metrics import JsonlTail

if TYPE_CHECKING:
    from nbtrain.control.runs.run import Run, RunStatus

RECORD_MIME = "application/vnd.nbtrain.run+json"
RECORD_SCHEMA = 1
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


# ---------------------------------------------------------------------------------------- records


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_record(ref: str | Path | Run) -> dict[str, Any]:
    """What a run is evidence of: its config (as written and resolved), plan, memory estimate, state,
    the first and last value of every metric, and the files of its output."""
    from nbtrain.control.runs.run import get_run

    run = get_run(ref)
    resolved = run.resolved
    st = run.status()
    tail = JsonlTail(run.paths.metrics)
    logged, first, final = _metric_summary(tail.records())
    # what binds the record to its run: the bytes of metrics.jsonl it was made from (an append-only file,
    # so the run's file keeps them as its first bytes however long it grows)
    evidence = {
        "metrics_bytes": tail.offset,
        "metrics_sha256": _prefix_sha256(run.paths.metrics, tail.offset),
    }
    try:
        config_text = run.paths.config.read_text(encoding="utf-8")
    except OSError:
        config_text = None
    output = run.paths.output
    files = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    plan = {k: v for k, v in (resolved.get("plan") or {}).items() if k != "estimate"}
    error = {k: v for k, v in st.error.items() if k != "log_tail"} if st.error else None
    return {
        "schema": RECORD_SCHEMA,
        "id": run.id,
        "name": run.name,
        "run_dir": str(run.dir),
        "nbtrain_version": resolved.get("nbtrain_version"),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "state": st.state,
        "step": st.step,
        "max_steps": st.max_steps,
        "error": error,
        "config": resolved.get("config"),
        "config_text": config_text,
        "plan": plan,
        "estimate": resolved.get("estimate"),
        "hardware": resolved.get("hardware"),
        "notes": resolved.get("notes", []),
        "summary": st.summary,
        "logged_records": logged,
        "first_metrics": first,
        "final_metrics": final,
        "output_files": files,
        "evidence": evidence,
    }


def _metric_summary(records: Iterable[Mapping[str, Any]]) -> tuple[int, dict[str, float], dict[str, float]]:
    """(records, each metric's first value, each metric's last value)."""
    first: dict[str, float] = {}
    final: dict[str, float] = {}
    logged = 0
    for rec in records:
        logged += 1
        for k, v in rec.items():
            if _number(v) and k != "t":
                first.setdefault(k, v)
                final[k] = v
    return logged, first, final


def _prefix(path: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of a regular file, None when it is shorter, missing or not a file."""
    try:
        with open_regular(path) as f:
            data = f.read(size)
    except OSError:
        return None
    return data if len(data) == size else None


def _prefix_sha256(path: Path, size: int) -> str | None:
    data = _prefix(path, size)
    return None if data is None else hashlib.sha256(data).hexdigest()


def record_mismatch(rec: Mapping[str, Any]) -> str | None:
    """Why a saved record is not what its run recorded, or None when it is: the metrics file it was made
    from must still open the run's metrics.jsonl byte for byte, the figures the record gives must be that
    file's, and its config, its final state and its output files the run's. A record edited by hand, or
    copied from another run, fails here. (The run directory itself is the student's to write: a grader
    who must trust it keeps it where students cannot write, e.g. on the course's cluster.)"""
    ev = rec.get("evidence")
    size, digest = (ev.get("metrics_bytes"), ev.get("metrics_sha256")) if isinstance(ev, Mapping) else (0, 0)
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(digest, str)):
        return "the record carries no evidence of its run (made by an older nbtrain, or edited)"
    run_dir = str(rec.get("run_dir") or "")
    paths = RunPaths(Path(run_dir))
    if not run_dir or not paths.root.is_dir():
        return (
            f"its run directory {rec.get('run_dir')} is not here: grade where it is, or pass verify=False "
            f"to grade the record as it stands"
        )
    data = _prefix(paths.metrics, size)
    if data is None or hashlib.sha256(data).hexdigest() != digest:
        return "the run's metrics.jsonl does not begin with the bytes the record was made from"
    tail = JsonlTail(paths.metrics)  # the one reader, as run_record read it, up to the recorded bytes
    logged, first, final = _metric_summary(itertools.takewhile(lambda _: tail.offset <= size, tail.records()))
    differ = [
        name
        for name, mine, theirs in (
            ("logged_records", rec.get("logged_records"), logged),
            ("first_metrics", rec.get("first_metrics"), first),
            ("final_metrics", rec.get("final_metrics"), final),
        )
        if mine != theirs
    ]
    from nbtrain.control.runs.run import get_run

    try:
        run = get_run(paths.root)
        resolved, st = run.resolved, run.status()
    except (NbtrainError, OSError, ValueError):
        return "the run's resolved.json or status.json cannot be read"
    if rec.get("config") != resolved.get("config"):
        differ.append("config")
    if rec.get("state") in TERMINAL_STATES and (st.state, st.step) != (rec.get("state"), rec.get("step")):
        differ.append("state")
    output = paths.output
    missing = [f for f in rec.get("output_files") or [] if not (output / str(f)).exists()]
    if missing:
        differ.append("output_files")
    return f"the record's {', '.join(differ)} differ from its run's" if differ else None


def _record_line(rec: Mapping[str, Any]) -> str:
    fm = rec.get("final_metrics") or {}
    parts = [
        f"{rec['state']} at step {int(rec.get('step') or 0):,}"
        + (f"/{int(rec['max_steps']):,}" if rec.get("max_steps") else "")
    ]
    for key in ("loss", "eval_loss"):
        if key in fm:
            parts.append(f"{key} {fm[key]:.4g}")
    return f"nbtrain run record {rec['id']} ({rec['name']}): {', '.join(parts)}"


# A clipboard drawn inline (no emoji: a machine without an emoji font, headless Chromium, shows a box).
RECORD_MARK = (
    "<svg width='10' height='12' viewBox='0 0 10 12' aria-hidden='true' style='vertical-align:-1px'>"
    "<rect x='0.75' y='1.75' width='8.5' height='9.5' rx='1.5' fill='none' stroke='currentColor' "
    "stroke-width='1.2'/><rect x='3' y='0.5' width='4' height='2.5' rx='0.8' fill='currentColor'/></svg>"
)


def record_bundle(rec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(data, metadata) of the display output that carries ``rec``: a short visible line, the record
    itself under its own MIME type, and an ``nbtrain`` key in the output's metadata to find it by."""
    line = _record_line(rec)
    data = {
        RECORD_MIME: dict(rec),
        "text/plain": line,
        "text/html": f"<small style='color:#555'>{RECORD_MARK} {html.escape(line)} "
        f"(saved with this notebook)</small>",
    }
    return data, {"nbtrain": {"record": rec["id"], "schema": RECORD_SCHEMA}}


class CellOutput:
    """A display output of the cell that is running now, which any thread or later cell can update in
    place (see the module's docstring for why an update is sent to the showing cell's parent)."""

    def __init__(self, data: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
        from IPython.core.getipython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        self._pub: Any = getattr(shell, "display_pub", None)
        parent = getattr(self._pub, "parent_header", None)
        self._parent: dict[str, Any] | None = dict(parent) if parent else None
        meta = {"metadata": dict(metadata)} if metadata else {}
        self.handle = display(dict(data), raw=True, display_id=True, **meta)

    def update(self, data: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
        pub, parent, handle = self._pub, self._parent, self.handle
        assert handle is not None
        kw: dict[str, Any] = {"raw": True, **({"metadata": dict(metadata)} if metadata else {})}
        if pub is None or parent is None or not hasattr(pub, "set_thread_parent"):
            handle.update(dict(data), **kw)  # not an ipykernel shell: one frontend, no routing
            return
        current = pub.parent_header or {}  # in a thread: the cell that ran last
        token = pub.set_thread_parent(parent)
        try:
            handle.update(dict(data), **kw)  # JupyterLab: to the output area of the showing cell
        finally:
            pub.reset_thread_parent(token)
        if current.get("msg_id") != parent.get("msg_id"):
            handle.update(dict(data), **kw)  # nbclient: it reads only the cell it executes


class RecordDisplay:
    """A run record shown in the current cell, updated in place when the run's state changes, at most
    every ``step_every`` seconds while only its step moves, and to the final state when it ends."""

    def __init__(self, run: Run, *, poll: float = 1.0, step_every: float = 10.0) -> None:
        self.run = run
        self.poll = poll
        self.step_every = step_every
        self.final = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._out: CellOutput | None = None
        self._shown: tuple[str, int] = ("", -1)
        self._shown_at = 0.0
        self._thread: threading.Thread | None = None

    def show(self, *, watch: bool = True) -> None:
        rec = run_record(self.run)
        data, meta = record_bundle(rec)
        self._out = CellOutput(data, meta)
        self._shown, self._shown_at = (rec["state"], rec["step"]), time.monotonic()
        self.final = rec["state"] in TERMINAL_STATES
        if watch and not self.final:
            self._thread = threading.Thread(
                target=self._watch, name=f"nbtrain-record-{self.run.id}", daemon=True
            )
            self._thread.start()

    def finalize(self) -> bool:
        """Update the shown record if the run has ended; True once it shows the final state."""
        with self._lock:
            if self.final or self._out is None:
                return self.final
            rec = run_record(self.run)
            if rec["state"] not in TERMINAL_STATES:
                return False
            self._update(rec)
            self.final = True
            return True

    def _update(self, rec: Mapping[str, Any]) -> None:
        assert self._out is not None
        data, meta = record_bundle(rec)
        self._out.update(data, meta)
        self._shown, self._shown_at = (rec["state"], rec["step"]), time.monotonic()

    def _tick(self) -> RunStatus:
        # status.json each poll; the whole record (every metric) only when the state changed, or the step
        # moved and step_every seconds passed, so a notebook saved mid-run holds a current record
        st = self.run.status()
        state, step = self._shown
        moved = st.step != step and time.monotonic() - self._shown_at >= self.step_every
        if not st.done and (st.state != state or moved):
            with self._lock:
                if not self.final:
                    self._update(run_record(self.run))
        return st

    def _watch(self) -> None:
        try:
            follow(self._tick, interval=self.poll, stop=self._stop, what=f"run {self.run.id}")
            self.finalize()
        except FollowStopped:
            return
        except Exception as e:  # noqa: BLE001 - a thread has no cell; the record just stays as it was
            import sys

            print(f"nbtrain: the record of run {self.run.id} was not updated: {e!r}", file=sys.__stderr__)

    def close(self) -> None:
        self._stop.set()


_SHOWN: list[RecordDisplay] = []


def record(ref: str | Path | Run, *, watch: bool = True) -> None:
    """Save ``ref``'s run record in the notebook (as an output of the current cell); while the run is
    going, the output is updated when it ends (or at once by ``%finetune wait``)."""
    from nbtrain.control.runs.run import get_run

    shown = RecordDisplay(get_run(ref))
    shown.show(watch=watch)
    _SHOWN.append(shown)


def finalize_records(run: Run) -> None:
    """Bring this kernel's shown records of ``run`` to its final state now (``%finetune wait`` and the
    notebook Run's ``wait()`` do), so a notebook saved right after holds it, not the state a watcher thread
    would have written a second later."""
    for shown in _SHOWN:
        if shown.run == run:
            shown.finalize()


def close_records() -> None:
    for shown in _SHOWN:
        shown.close()
    _SHOWN.clear()


def records(notebook: str | Path) -> list[dict[str, Any]]:
    """The run records a saved notebook carries, in cell order, the last one of each run. Each has a
    ``cell`` key (the index of the cell it was found in)."""
    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    found: dict[str, dict[str, Any]] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []) or []:
            data = out.get("data") or {}
            rec = data.get(RECORD_MIME)
            if isinstance(rec, str):  # nbformat may store JSON types as text in older writers
                rec = json.loads(rec)
            if isinstance(rec, dict) and "id" in rec:
                found.pop(rec["id"], None)  # keep cell order of the latest one
                found[rec["id"]] = {**rec, "cell": index}
    return list(found.values())


# ----------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class CheckRow:
    check: str
    expected: str
    actual: str
    passed: bool


@dataclass
class CheckReport:
    """The result of ``nbtrain.check``: a pass/fail table (text and HTML)."""

    run_id: str
    run_name: str
    rows: list[CheckRow]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failed(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.passed]

    def text(self) -> str:
        n = sum(r.passed for r in self.rows)
        head = f"nbtrain check of run {self.run_id} ({self.run_name}): {n}/{len(self.rows)} passed"
        w = max([len(r.check) for r in self.rows] + [5])
        e = max([len(r.expected) for r in self.rows] + [8])
        lines = [head, f"  {'':4}  {'check':<{w}}  {'expected':<{e}}  actual"]
        for r in self.rows:
            lines.append(f"  {'PASS' if r.passed else 'FAIL'}  {r.check:<{w}}  {r.expected:<{e}}  {r.actual}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        n = sum(r.passed for r in self.rows)
        colour = "#2e7d32" if self.passed else "#c62828"
        body = "".join(
            f"<tr><td style='color:{'#2e7d32' if r.passed else '#c62828'};font-weight:bold'>"
            f"{'&#10003; pass' if r.passed else '&#10007; FAIL'}</td><td>{html.escape(r.check)}</td>"
            f"<td><code>{html.escape(r.expected)}</code></td><td><code>{html.escape(r.actual)}</code></td></tr>"
            for r in self.rows
        )
        return (
            f"<div><b style='color:{colour}'>{n}/{len(self.rows)} checks passed</b> for run "
            f"<code>{html.escape(self.run_id)}</code> ({html.escape(self.run_name)})"
            f"<table><tr><th></th><th>check</th><th>expected</th><th>actual</th></tr>{body}</table></div>"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "name": self.run_name,
            "passed": self.passed,
            "checks": [r.__dict__ for r in self.rows],
        }

    def assert_passed(self) -> None:
        """Raise AssertionError with the table when a check failed (an autograder's test cell)."""
        if not self.passed:
            raise AssertionError("\n" + self.text())


def _fmt(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _dotted(cfg: Mapping[str, Any], path: str) -> Any:
    cur: Any = cfg
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def check(
    run: str | Path | Run | Mapping[str, Any],
    *,
    state: str | None = "completed",
    min_steps: int | None = None,
    final_loss_below: float | None = None,
    eval_loss_below: float | None = None,
    loss_decreased: bool | None = None,
    adapter_exists: bool | None = None,
    metrics_above: Mapping[str, float] | None = None,
    metrics_below: Mapping[str, float] | None = None,
    config: Mapping[str, Any] | None = None,
    verify: bool = True,
) -> CheckReport:
    """Check a run (a Run, id, name or run directory) or a saved run record (``nbtrain.records``)
    against an exercise's requirements. Every check given becomes a row; ``state`` is checked unless
    it is None.

    ``metrics_above`` / ``metrics_below``: {metric: threshold} on each metric's last logged value
    (e.g. ``{"rewards/margins": 0}``); ``config``: {dotted key: value} the run's resolved config must
    have (e.g. ``{"objective": "dpo", "lora.r": 16}``).

    A saved record is first checked against its run directory (``record_mismatch``): the row "record is
    the run's" fails for a record edited by hand or one whose run is not here; ``verify=False`` grades a
    record as it stands (where the run directories are not kept).
    """
    rec = dict(run) if isinstance(run, Mapping) else run_record(run)
    final, first = rec.get("final_metrics") or {}, rec.get("first_metrics") or {}
    rows: list[CheckRow] = []

    def add(name: str, expected: str, actual: Any, ok: bool) -> None:
        rows.append(CheckRow(name, expected, _fmt(actual), bool(ok)))

    if isinstance(run, Mapping) and verify:
        why = record_mismatch(rec)
        add("record is the run's", "yes", why or "yes", why is None)

    if state is not None:
        add("state", state, rec.get("state"), rec.get("state") == state)
    if min_steps is not None:
        add("steps trained", f">= {min_steps}", rec.get("step"), (rec.get("step") or 0) >= min_steps)
    if final_loss_below is not None:
        v = final.get("loss")
        add("final loss", f"< {final_loss_below:g}", v, v is not None and v < final_loss_below)
    if eval_loss_below is not None:
        v = final.get("eval_loss")
        add("final eval loss", f"< {eval_loss_below:g}", v, v is not None and v < eval_loss_below)
    if loss_decreased is not None:
        a, b = first.get("loss"), final.get("loss")
        went_down = a is not None and b is not None and b < a
        actual = f"{_fmt(a)} -> {_fmt(b)}" if a is not None and b is not None else None
        add("loss decreased", "yes" if loss_decreased else "no", actual, went_down == loss_decreased)
    if adapter_exists is not None:
        files = set(rec.get("output_files") or [])
        has = "adapter_config.json" in files and any(w in files for w in _ADAPTER_WEIGHTS)
        actual = "adapter_config.json + weights" if has else (", ".join(sorted(files)) or "no output")
        add("adapter saved", "yes" if adapter_exists else "no", actual, has == adapter_exists)
    for key, low in (metrics_above or {}).items():
        v = final.get(key)
        add(f"final {key}", f"> {low:g}", v, v is not None and v > low)
    for key, high in (metrics_below or {}).items():
        v = final.get(key)
        add(f"final {key}", f"< {high:g}", v, v is not None and v < high)
    for path, want in (config or {}).items():
        got = _dotted(rec.get("config") or {}, path)
        add(f"config {path}", _fmt(want), got, got == want)
    return CheckReport(str(rec.get("id")), str(rec.get("name")), rows)


__all__ = ["RECORD_MIME", "CheckReport", "check", "record", "record_mismatch", "records", "run_record"]
