"""Sweeps in the notebook: ``nbtrain.sweep(config)`` starts one (a ``%%finetune`` cell whose YAML has a
``sweep:`` section does the same), ``nbtrain.get_sweep`` / ``nbtrain.sweeps`` find them, and the view
follows one: the sweep's figure (``figures/sweep.py``: every trial's curve, the parameters against the
metric, the trials ranked) updated in place from a thread while the sweep runs, and left as the final
figure once it ends. The view reads the sweep's folder and its trials' run directories only: what it shows
is what any kernel, the CLI or the server would read there."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from nbtrain.control.prepare import Prepared
from nbtrain.control.runs.metrics import MetricsTail
from nbtrain.control.runs.run import Run
from nbtrain.control.sweep import sweep as core
from nbtrain.ui.figures.sweep import Curve, sweep_figure

REFRESH = 1.0  # s between looks at the sweep while it runs
# nbtrain's lab extension renders this (labextension/src/sweepview.ts) instead of the figure beside it
SWEEP_VIEW_MIME = "application/vnd.nbtrain.sweep-view+json"


class Sweep(core.Sweep):
    """A sweep, as the notebook holds it: the control handle, drawn as its live view."""

    def plot(self) -> go.Figure:
        return SweepView(self).figure()

    def show(self) -> SweepView:
        view = SweepView(self)
        view.show()
        return view

    def _ipython_display_(self) -> None:
        self.show()


def _handle(s: core.Sweep) -> Sweep:
    return Sweep(s.paths.root)


def sweep(
    config: str | Path | dict[str, Any],
    name: str | None = None,
    *,
    namespace: Mapping[str, Any] | None = None,
    prepared: Prepared | None = None,
) -> Sweep:
    """Check a config with a ``sweep:`` section and start its trials in the background (a driver process
    that outlives the kernel); returns the sweep's handle at once (shown, it is the live view)."""
    return _handle(core.start_sweep(config, name=name, namespace=namespace, prepared=prepared))


def get_sweep(ref: str | Path | None = None) -> Sweep:
    """A sweep by id, name or folder; the newest one without ``ref``."""
    return _handle(core.get_sweep(ref))


def sweeps() -> list[Sweep]:
    return [_handle(s) for s in core.all_sweeps()]


class SweepView:
    """The sweep's figure in the cell that showed it, redrawn when the sweep or a trial's metric moved."""

    def __init__(self, sweep: core.Sweep) -> None:
        self.sweep = sweep
        self.tails: dict[int, MetricsTail] = {}
        self.thread: threading.Thread | None = None
        self.updates = 0
        self._stop = threading.Event()

    def curves(self, trials: list[dict[str, Any]], metric: str) -> dict[int, Curve]:
        out: dict[int, Curve] = {}
        for t in trials:
            if not t.get("run_dir"):
                continue
            tail = self.tails.get(t["number"])
            if tail is None:
                tail = self.tails[t["number"]] = MetricsTail(Run(t["run_dir"]))
            tail.poll()
            s = tail.series(metric)
            if s is not None and len(s):
                out[t["number"]] = (s.x.tolist(), s.y.tolist())
        return out

    def figure(self, st: core.SweepStatus | None = None) -> go.Figure:
        st = st or self.sweep.status()
        return sweep_figure(
            st.trials,
            title=self.title(st),
            metric=st.metric,
            minimize=st.direction != "maximize",
            best=st.best,
            curves=self.curves(st.trials, st.metric),
        )

    def title(self, st: core.SweepStatus) -> str:
        best = st.best_trial()
        head = f"<b>sweep {self.sweep.name}</b> · {st.state} · {len(st.trials)}/{st.budget} trials"
        sub = self.sweep.why
        if best is not None:
            head += f" · best: trial {best['number']}, {st.metric} {best['value']:.4g}"
        if st.state == "interrupted":
            sub = "its driver is not running: sweep.resume() (or nbtrain sweep resume) goes on"
        elif st.error:
            sub = f"failed: {st.error}"
        return f"{head}<br><span style='font-size:12px;color:#6b7280'>{sub}</span>"

    def text(self, st: core.SweepStatus | None = None) -> str:
        return f"sweep {self.sweep.id}: {(st or self.sweep.status()).describe()}"

    def bundle(self, st: core.SweepStatus | None = None) -> dict[str, Any]:
        """The figure for every frontend, and for nbtrain's lab extension (ranked above plotly) the sweep's
        id: its view reads the sweep through the server, kernel or not (labextension/src/sweepview.ts)."""
        from nbtrain.ui.dashboard import static_bundle

        st = st or self.sweep.status()  # read once: trials.json and the driver's liveness
        bundle = static_bundle(self.figure(st), self.text(st))
        bundle[SWEEP_VIEW_MIME] = {"sweep_id": self.sweep.id, "name": self.sweep.name}
        return bundle

    def signature(self, st: core.SweepStatus) -> tuple[Any, ...]:
        """Changes whenever the figure would: the sweep's state, its trials' states, their metrics' sizes."""
        sizes = tuple(
            _size(Path(t["run_dir"], "metrics.jsonl")) if t.get("run_dir") else 0 for t in st.trials
        )
        return st.state, len(st.trials), tuple(t["state"] for t in st.trials), sizes

    def show(self, *, background: bool = True, into: Any = None) -> None:
        """Display the view in the cell that runs (or in ``into``, anything with ``update(bundle)``: the
        panel's output widget), and keep it current from a thread while the sweep runs."""
        from nbtrain.control.jobs.grading import CellOutput

        st = self.sweep.status()
        if into is None:
            self.out = CellOutput(self.bundle(st))
        else:
            self.out = into
            into.update(self.bundle(st))
        if background and not st.done:
            self.thread = threading.Thread(target=self._loop, daemon=True, name=f"sweep view {self.sweep.id}")
            self.thread.start()

    def _loop(self) -> None:
        seen = self.signature(self.sweep.status())
        while not self._stop.wait(REFRESH):
            st = self.sweep.status()
            sig = self.signature(st)
            if sig == seen:
                continue
            seen = sig
            self.out.update(self.bundle(st))
            self.updates += 1
            if st.done or st.state == "interrupted":
                return

    def close(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> core.SweepStatus:
        """Block until the sweep ends; the view ends on its final figure."""
        st = self.sweep.wait(timeout)
        if self.thread is not None:
            self.thread.join(timeout=10)
        return st


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
