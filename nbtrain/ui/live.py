"""A live, self-updating view of one run in a notebook (HTML updated through a display handle).

It reads the run through the one metrics reader (:class:`nbtrain.control.runs.metrics.MetricsTail`: only
new bytes, a bounded window of recent rows) and is refreshed by the one follow loop
(:func:`nbtrain.control.runs.follow.follow`) in a background thread until the run ends. Errors in that
thread are shown in the view, never swallowed.
"""

from __future__ import annotations

import html
import sys
import threading
import traceback
from collections import deque
from typing import Any

from nbtrain.control.grading import CellOutput
from nbtrain.control.runs.follow import FollowStopped
from nbtrain.control.runs.follow import follow as follow_run
from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.control.runs.run import Run, RunStatus

COLUMNS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "eval_loss")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")
    return str(v)


class LiveView:
    def __init__(self, run: Run, *, interval: float = 1.0, rows: int = 8) -> None:
        self.run = run
        self.interval = interval
        self.tail = MetricsTail(run, rows=rows)
        self._handle: CellOutput | None = None  # updates reach this cell from the thread or another
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: str | None = None

    # ---------------------------------------------------------------------------------- reading
    def poll(self) -> RunStatus:
        # status before metrics: the worker writes its last metrics before its final state, so a final
        # state read first means the view's last frame has every logged step
        st = self.run.status()
        self.tail.poll()
        return st

    @property
    def recent(self) -> deque[dict[str, Any]]:
        return self.tail.recent

    @property
    def records(self) -> int:
        return self.tail.records

    @property
    def first_loss(self) -> float | None:
        return self.tail.first.get("loss")

    @property
    def last_loss(self) -> float | None:
        return self.tail.last.get("loss")

    @property
    def last_eval(self) -> float | None:
        return self.tail.last.get("eval_loss")

    def render(self, st: RunStatus) -> str:
        # the dashboard's words and numbers: elapsed over every attempt, the smoothed ETA, the phase
        from nbtrain.ui.figures import header_parts, progress, state_color  # plotly loads on first use

        p = progress(self.tail, st)
        parts = header_parts(p)
        if p.phase is None and self.last_loss is not None and self.first_loss is not None:
            parts = [f"{s} (start {_fmt(self.first_loss)})" if s.startswith("loss ") else s for s in parts]
        head = (
            f"<b>{html.escape(self.run.name)}</b> <code>{html.escape(self.run.id)}</code> "
            f"<span style='color:{state_color(st.state)};font-weight:bold'>{html.escape(parts[0])}</span> "
            + " · ".join(html.escape(s) for s in parts[1:])
        )
        bar = f"<progress value='{100 * p.fraction:.1f}' max='100' style='width:100%'></progress>"
        rows = "".join(
            "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in COLUMNS) + "</tr>" for r in self.recent
        )
        table = (
            "<table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + f"</tr>{rows}</table>"
            if rows
            else f"<i>{html.escape(p.waiting() or '')}…</i>"
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

    def text(self, st: RunStatus) -> str:
        loss = f" loss {_fmt(self.last_loss)}" if self.last_loss is not None else ""
        return f"{self.run.id}: {st.describe()}{loss}"

    # --------------------------------------------------------------------------------- showing
    def _bundle(self, st: RunStatus) -> dict[str, str]:
        return {"text/html": self.render(st), "text/plain": self.text(st)}

    def show(self, *, background: bool = True) -> None:
        st = self.poll()
        self._handle = CellOutput(self._bundle(st))
        if background and not st.done:
            self._thread = threading.Thread(
                target=self._loop, name=f"nbtrain-live-{self.run.id}", daemon=True
            )
            self._thread.start()

    def _update(self, st: RunStatus) -> None:
        if self._handle is not None:
            self._handle.update(self._bundle(st))

    def _tick(self) -> RunStatus:
        st = self.poll()
        self._update(st)
        return st

    def _loop(self) -> None:
        try:
            follow_run(self._tick, interval=self.interval, stop=self._stop, what=f"run {self.run.id}")
        except FollowStopped:
            return
        except Exception:  # noqa: BLE001 - shown in the view instead of dying silently
            self.error = traceback.format_exc()
            try:
                self._update(self.run.status())
            except Exception:  # noqa: BLE001 - the display itself is gone: say so on the kernel's stderr
                print(f"nbtrain live view of {self.run.id} failed:\n{self.error}", file=sys.__stderr__)

    def follow(self, timeout: float | None = None) -> RunStatus:
        """Block (in the foreground) updating the view until the run ends."""
        if self._handle is None:
            self.show(background=False)
        return follow_run(self._tick, timeout=timeout, interval=self.interval, what=f"run {self.run.id}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
