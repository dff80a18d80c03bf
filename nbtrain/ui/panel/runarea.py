"""The panel's run, under its form: the dashboard of the run launched last (or the view of a sweep, when its
config has a ``sweep:`` section), Stop (off the kernel thread), the run's end watched so Stop is disabled
and the status line says how it ended, and the export form of a run with trained weights (the launched one
once it ends, or a loaded one)."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from nbtrain.contract.errors import NbtrainError
from nbtrain.control.runs.follow import FollowStopped, follow

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared
    from nbtrain.control.runs.run import Run
    from nbtrain.ui.dashboard import Dashboard
    from nbtrain.ui.export_box import ExportBox
    from nbtrain.ui.sweeps import Sweep, SweepView


class OutputWidget:
    """A sweep view's output in an ``ipywidgets.Output`` (the panel's), replaced whole at each update: the lab
    extension renders its sweep MIME there as it does in a cell."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def update(self, bundle: dict[str, Any]) -> None:
        self.out.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)


class RunArea:
    """The panel's run: ``run`` (the one launched last from the panel), ``view`` (its dashboard, shown in
    ``live``), ``stop_button``, and ``export_box`` (in ``export_area``)."""

    def __init__(self, report: Callable[[str | None, str | None], None], say: Callable[[str], None]) -> None:
        # report(error, status): the panel's error line (None clears it) and, given, its status line
        self._report = report
        self._say = say
        self.run: Run | None = None  # the run launched last from this panel
        self.view: Dashboard | None = None  # the dashboard of that run, shown in ``live``
        self.sweep: Sweep | None = None  # or the sweep launched last, and its view
        self.sweep_view: SweepView | None = None
        self._watch_stop = threading.Event()
        self.background: list[threading.Thread] = []  # Stops in progress
        self.stop_button = widgets.Button(
            description="Stop",
            button_style="warning",
            icon="stop",
            disabled=True,  # enabled while the run launched here is active
            tooltip="stop the run launched here after its current step (it saves a checkpoint)",
        )
        self.live = widgets.VBox([])  # the launched run's dashboard
        self.export_area = widgets.VBox([])  # that run's export form (once it has weights), or a loaded run's
        self.export_box: ExportBox | None = None

    def launch(self, prep: Prepared) -> str:
        """Start ``prep`` and show it here: a sweep when its config has a ``sweep:`` section, else a run;
        what the status line says."""
        if prep.resolved.config.sweep is not None:
            from nbtrain.ui.sweeps import sweep

            s = sweep(prep.resolved.text, prepared=prep)
            self.show_sweep(s)
            return f"started sweep {s.id} ({s.name}): {s.why}"
        from nbtrain.control.start import start

        run = start(prep)
        self.show(run)
        return f"started run {run.id} ({run.name})"

    def show_sweep(self, s: Sweep) -> None:
        """The sweep's view under the form (as a ``%%finetune`` cell with a sweep shows it); Stop stops it."""
        from nbtrain.ui.sweeps import SweepView

        self.close_view()
        self.close_export()
        self.run, self.sweep = None, s
        out = widgets.Output()
        view = SweepView(s)
        view.show(into=OutputWidget(out))
        self.sweep_view = view
        self.live.children = (out,)
        self._follow_until_done(s)

    def show(self, run: Run) -> None:
        """Show ``run``'s dashboard (the one a ``%%finetune`` cell shows) under the form, kept current by
        its own thread, and keep Stop enabled while the run is active.

        The dashboard's widgets are children of the panel rather than ``display()``-ed from the click
        handler: a display from a handler lands in whatever cell runs then, and its updates would carry
        the click's parent header; widget values travel over each widget's own comm.
        """
        from nbtrain.ui.dashboard import Dashboard  # plotly loads on the first launch, not with the panel

        self.close_view()  # the previous run goes on; only its view here stops
        self.run, self.sweep = run, None
        self.close_export()
        view = Dashboard(run)
        view.refresh()  # builds its widgets
        self.view = view
        self.live.children = (view.box,) if view.box is not None else ()
        view.start()
        self._follow_until_done(run)

    def _follow_until_done(self, shown: Run | Sweep) -> None:
        """Stop enabled while ``shown`` (the run or sweep launched here) is active, watched off the kernel
        thread until it ends."""
        self.stop_button.disabled = False
        stop = threading.Event()
        self._watch_stop = stop
        threading.Thread(
            target=self._watch, args=(shown, stop), name=f"nbtrain-panel-watch-{shown.id}", daemon=True
        ).start()

    def _watch(self, shown: Run | Sweep, stop: threading.Event) -> None:
        """Until ``shown`` ends: then Stop is disabled and the status line says how it ended (and a run's
        export form comes)."""
        from nbtrain.control.runs.run import Run

        what = f"{'run' if isinstance(shown, Run) else 'sweep'} {shown.id}"
        try:
            st = follow(shown.status, interval=0.5, stop=stop, what=what)
        except FollowStopped:
            return
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._report(f"following {what} failed:\n{traceback.format_exc()}", None)
            return
        if shown is self.run or shown is self.sweep:
            self.stop_button.disabled = True
            self._say(f"{what}: {st.describe()}")
            if isinstance(shown, Run):
                self.offer_export(shown)

    def offer_export(self, run: Run) -> None:
        """The export form of ``run`` under its dashboard, once it has something to export."""
        from nbtrain.control.runs.run import has_trained_weights
        from nbtrain.ui.export_box import ExportBox

        if self.export_box is not None and self.export_box.run.dir == run.dir:
            return
        self.close_export()
        if has_trained_weights(run):
            self.export_box = ExportBox(run)
            self.export_area.children = (self.export_box.box,)

    def close_export(self) -> None:
        box, self.export_box = self.export_box, None
        self.export_area.children = ()
        if box is not None and not box.busy:  # a running export finishes; its form just leaves
            box.close()

    def close_view(self) -> None:
        self._watch_stop.set()
        view, self.view = self.view, None
        if view is not None:
            view.close()
        sweep_view, self.sweep_view = self.sweep_view, None
        if sweep_view is not None:
            sweep_view.close()
        old, self.live.children = self.live.children, ()
        todo = list(old)
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    def stop(self) -> None:
        if self.sweep is not None:
            self._stop_sweep(self.sweep)
            return
        run = self.run
        if run is None:
            raise NbtrainError("no run was launched from this panel yet; Launch one first")
        self.stop_button.disabled = True  # one request is enough; the run winds down in the background
        self._report(None, f"stopping run {run.id} (it finishes its step and saves a checkpoint)…")
        # Run.stop waits for the worker to exit (up to its timeout): do that off the kernel thread.
        t = threading.Thread(
            target=self._stop_in_background, args=(run,), name="nbtrain-panel-stop", daemon=True
        )
        self.background = [b for b in self.background if b.is_alive()] + [t]
        t.start()

    def _stop_sweep(self, s: Sweep) -> None:
        self.stop_button.disabled = True
        self._report(
            None, f"stopping sweep {s.id}: each running trial finishes its step and saves a checkpoint…"
        )

        def stop() -> None:
            try:
                self._report(None, f"sweep {s.id}: {s.stop().describe()} (resume goes on)")
            except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
                self._report(f"stopping sweep {s.id} failed:\n{traceback.format_exc()}", None)

        t = threading.Thread(target=stop, name="nbtrain-panel-stop-sweep", daemon=True)
        self.background = [b for b in self.background if b.is_alive()] + [t]
        t.start()

    def _stop_in_background(self, run: Run) -> None:
        try:
            st = run.stop()
        except NbtrainError as e:
            self._report(str(e), None)
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._report(f"stopping run {run.id} failed:\n{traceback.format_exc()}", None)
        else:
            self._report(None, f"run {run.id}: {st.describe()}")
        if self.run is run and not run.status().done:
            self.stop_button.disabled = False  # it did not stop: let the user try again
