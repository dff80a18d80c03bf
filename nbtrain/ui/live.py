"""A live, self-updating view of one run in a notebook (HTML updated through a display handle).

It reads metrics.jsonl incrementally (only new bytes), keeps a bounded window of recent rows, and is
refreshed by one background thread at a throttled rate until the run ends. Errors in that thread are
shown in the view, never swallowed.
"""

from __future__ import annotations

import html
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from nbtrain.rundir import iter_jsonl
from nbtrain.runs import Run, RunStatus

COLUMNS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "eval_loss")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")
    return str(v)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class LiveView:
    def __init__(self, run: Run, *, interval: float = 1.0, rows: int = 8) -> None:
        self.run = run
        self.interval = interval
        self.recent: deque[dict[str, Any]] = deque(maxlen=rows)
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.last_eval: float | None = None
        self.records = 0
        self._offset = 0
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: str | None = None

    # ---------------------------------------------------------------------------------- reading
    def poll(self) -> RunStatus:
        for end, rec in iter_jsonl(self.run.paths.metrics, self._offset):
            self._offset = end
            self.records += 1
            if "loss" in rec:
                if self.first_loss is None:
                    self.first_loss = float(rec["loss"])
                self.last_loss = float(rec["loss"])
            if "eval_loss" in rec:
                self.last_eval = float(rec["eval_loss"])
            self.recent.append(rec)
        return self.run.status()

    def render(self, st: RunStatus) -> str:
        started = self._started_at()
        elapsed = (st.updated or time.time()) - started if started else 0.0
        eta = ""
        if st.max_steps and st.step and not st.done:
            eta = f", ETA {_duration(elapsed / st.step * (st.max_steps - st.step))}"
        pct = 100.0 * st.step / st.max_steps if st.max_steps else 0.0
        color = {"completed": "#2e7d32", "failed": "#c62828", "stopped": "#6d4c41"}.get(st.state, "#1565c0")
        head = (
            f"<b>{html.escape(self.run.name)}</b> <code>{html.escape(self.run.id)}</code> "
            f"<span style='color:{color};font-weight:bold'>{st.state}</span> "
            f"step {st.step}/{st.max_steps or '?'} · elapsed {_duration(elapsed)}{eta}"
        )
        if self.last_loss is not None:
            head += f" · loss {_fmt(self.last_loss)}"
            if self.first_loss is not None:
                head += f" (start {_fmt(self.first_loss)})"
        if self.last_eval is not None:
            head += f" · eval_loss {_fmt(self.last_eval)}"
        bar = f"<progress value='{pct:.1f}' max='100' style='width:100%'></progress>"
        rows = "".join(
            "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in COLUMNS) + "</tr>" for r in self.recent
        )
        table = (
            "<table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + f"</tr>{rows}</table>"
            if rows
            else "<i>waiting for the first logged step…</i>"
        )
        extra = ""
        if st.state == "completed":
            extra = f"<div>output: <code>{html.escape(str(self.run.output_dir))}</code></div>"
        if st.error:
            extra = (
                f"<div style='color:#c62828'>{html.escape(str(st.error.get('type')))}: "
                f"{html.escape(str(st.error.get('message')))}</div>"
                f"<details><summary>log tail</summary><pre>"
                f"{html.escape(st.error.get('log_tail') or self.run.logs(20))}</pre></details>"
            )
        if self.error:
            extra += f"<pre style='color:#c62828'>live view error:\n{html.escape(self.error)}</pre>"
        return f"<div class='nbtrain-live'>{head}{bar}{table}{extra}</div>"

    def _started_at(self) -> float | None:
        try:
            return float(self.run.paths.launch.stat().st_mtime)
        except FileNotFoundError:
            return None

    def text(self, st: RunStatus) -> str:
        loss = f" loss {_fmt(self.last_loss)}" if self.last_loss is not None else ""
        return f"{self.run.id}: {st.describe()}{loss}"

    # --------------------------------------------------------------------------------- showing
    def _bundle(self, st: RunStatus) -> dict[str, str]:
        return {"text/html": self.render(st), "text/plain": self.text(st)}

    def show(self, *, background: bool = True) -> None:
        from IPython.display import display

        st = self.poll()
        self._handle = display(self._bundle(st), raw=True, display_id=True)
        if background and not st.done:
            self._thread = threading.Thread(
                target=self._loop, name=f"nbtrain-live-{self.run.id}", daemon=True
            )
            self._thread.start()

    def _update(self, st: RunStatus) -> None:
        if self._handle is not None:
            self._handle.update(self._bundle(st), raw=True)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                st = self.poll()
                self._update(st)
                if st.done:
                    return
        except Exception:  # noqa: BLE001 - shown in the view instead of dying silently
            self.error = traceback.format_exc()
            try:
                self._update(self.run.status())
            except Exception:  # noqa: BLE001 - the display itself is gone: say so on the kernel's stderr
                print(f"nbtrain live view of {self.run.id} failed:\n{self.error}", file=sys.__stderr__)

    def follow(self, timeout: float | None = None) -> RunStatus:
        """Block (in the foreground) updating the view until the run ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._handle is None:
            self.show(background=False)
        while True:
            st = self.poll()
            self._update(st)
            if st.done:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run.id} still {st.describe()} after {timeout} s")
            time.sleep(self.interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
