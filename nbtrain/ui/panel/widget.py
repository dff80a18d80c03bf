"""The panel itself: the ipywidgets form, its live YAML and inline errors, the data preview, Load, and
Launch; the run launched (its dashboard, Stop, its export form) is ``runarea``'s, To cell ``tocell``'s."""

from __future__ import annotations

import copy
import html
import math
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import yaml

from nbtrain.contract.errors import ConfigError, NbtrainError, Problem
from nbtrain.contract.formats import FORMAT_HELP
from nbtrain.contract.objectives import OBJECTIVES, rewards_objectives
from nbtrain.control import start
from nbtrain.control.config.load import parse_source
from nbtrain.control.config.preset import find_preset
from nbtrain.control.prepare import check_config
from nbtrain.control.prepare import validate as validate_config
from nbtrain.control.runs.run import Run, get_run
from nbtrain.ui.panel import examples, saved, sweepform, yamlfile
from nbtrain.ui.panel.datapreview import PRE_STYLE, data_preview, preview_html, preview_inputs
from nbtrain.ui.panel.debounce import Debouncer
from nbtrain.ui.panel.fields import (
    GROUPS,
    SECTIONS,
    TOP_ORDER,
    UNSET,
    PanelField,
    config_from_run,
    format_scalar,
    format_targets,
    panel_fields,
    parse_names,
    parse_targets,
    preset_fields,
    same_value,
    section_active,
)
from nbtrain.ui.panel.files import CANDIDATES_EVERY, data_candidates, model_candidates
from nbtrain.ui.panel.layout import field_widget, label_html, numbered_steps, page
from nbtrain.ui.panel.plan import placeholders, plan_html, plan_lines
from nbtrain.ui.panel.planfor import NAMED, PlanFor
from nbtrain.ui.panel.runarea import RunArea
from nbtrain.ui.panel.style import ERROR_STYLE, LABEL_WIDTH, preset_note_html
from nbtrain.ui.panel.tocell import ToCell

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared
    from nbtrain.ui.dashboard import Dashboard
    from nbtrain.ui.export_box import ExportBox

# ------------------------------------------------------------------------------------------- panel

ConfigSource = str | Path | Mapping[str, Any] | Run | None
KEEPS_CLASS = "nbtrain-panel-keeps"  # on a form whose values come back when its cell runs again


class ConfigPanel:
    """The form. Display it (last expression of a cell, or ``.show()``); drive it from code with
    ``fields[path].value = ...``, ``set_config``, ``to_yaml``/``to_dict``, and the buttons' ``click()``.
    """

    def __init__(self, config: ConfigSource = None, *, debounce: float = 0.25, preview_rows: int = 3) -> None:
        self.preset = find_preset()  # instructor mode: its fixed fields show filled and disabled
        self.spec = preset_fields(panel_fields(), self.preset)
        self._by_path = {f.path: f for f in self.spec}
        self.preview_rows = preview_rows
        self.status_message = ""
        self.dom_class = f"nbtrain-panel-{uuid.uuid4().hex[:12]}"  # finds the panel's cell in the page
        self._set: set[str] = set()  # dropdowns the user (or the loaded config) set explicitly
        self._touched: set[str] = set()  # fields the user changed, or a loaded config filled
        self._reveal = False  # Launch was pressed: every problem shows, touched or not
        self._extra: dict[Any, Any] = {}  # keys the form has no field for, written back unchanged
        self._filling = False
        self._lock = threading.RLock()
        self._problems: dict[str, str] = {}  # every field problem of the last check
        self._all_general: list[str] = []  # and those without a field
        self._field_errors: dict[str, str] = {}  # what shows of them
        self._general_errors: list[str] = []
        self._candidates_at = -math.inf
        self._action_error: str | None = None
        self._ready = False  # the last check found nothing that would stop Launch
        self._preview_key: Any = None
        self._debouncer = Debouncer(debounce, self._check, self._job_failed)

        self.fields: dict[str, Any] = {f.path: field_widget(f) for f in self.spec}
        self.labels = {
            f.path: widgets.HTML(label_html(f), layout=widgets.Layout(width=f"{LABEL_WIDTH}px", margin="0"))
            for f in self.spec
        }
        self.error_labels = {f.path: widgets.HTML("") for f in self.spec}
        self.yaml_view = widgets.HTML("")
        self.error_area = widgets.HTML("")
        self.plan_area = widgets.HTML("")  # what Launch would start: the plan and its estimate
        self.plan_text: list[str] = []  # the same, as lines
        self.planned: dict[str, Any] = {}  # the train args that plan would use
        self.planned_plan: dict[str, Any] = {}  # and the plan itself (Plan.to_dict())
        self.status_area = widgets.HTML("")
        self.preview = widgets.HTML("")
        self.launch_button = widgets.Button(
            description="Launch", button_style="success", icon="play", tooltip="check the config and start it"
        )
        self.run_area = RunArea(self._action, self._say)  # the run launched here: its view, Stop, export
        self.stop_button = self.run_area.stop_button
        self.plan_for = PlanFor(self._plan_for_changed)  # this machine, a SLURM partition, named hardware
        self.to_cell = ToCell(self.dom_class, self.to_yaml, self._action, self.plan_for.magic_line)
        self.to_cell_button = self.to_cell.button
        self.load_ref = widgets.Text(
            placeholder="run id or name, or a .yaml file",
            layout=widgets.Layout(flex="1 1 auto", width="auto", max_width="260px"),
        )
        self.load_button = widgets.Button(
            description="Load",
            icon="folder-open",
            tooltip="fill the form with a run's config or a YAML file's",
            layout=widgets.Layout(flex="0 0 auto", width=yamlfile.BUTTON_WIDTH),
        )
        self.save_row = yamlfile.SaveRow(self.to_yaml, lambda: len(self.problems))
        self.live = self.run_area.live  # the launched run's dashboard
        self.export_area = self.run_area.export_area  # its export form, or a loaded run's
        self.launch_button.on_click(self._guard(self._launch))
        self.stop_button.on_click(self._guard(self.run_area.stop))
        self.to_cell_button.on_click(self._guard(self.to_cell.click))
        self.load_note = widgets.HTML()  # what Load did, beside it (the status line is steps below)
        self.load_button.on_click(self._load_clicked)
        for f in self.spec:
            self.fields[f.path].observe(self._changed_handler(f.path), names="value")
        self.data_help = widgets.HTML("")
        self.rows: dict[str, Any] = {}  # a field's label, box and error line
        self.groups = {g: self._group(g) for g in GROUPS}
        self.groups["Data"].children = (*self.groups["Data"].children, self.data_help)
        self.preset_note = widgets.HTML(preset_note_html(self.preset))
        self.widget = self._layout()
        self._show_plan(None, {})  # the planned values from the first moment, before any check
        self.widget.add_class("nbtrain-panel")
        self.widget.add_class(self.dom_class)
        self._refresh_candidates(Path.cwd())
        self.to_cell.hello()

        self._filling = True
        try:
            self._apply_preset()
        finally:
            self._filling = False
        # the form this cell held before a kernel restart (ui/panel/saved.py), for an empty panel
        self._cell = saved.cell_key()
        self._saved = None if config is not None else saved.load(self._cell)
        self._restores = config is None and self._cell is not None  # running the cell again brings it back
        self._keeps(self._restores)
        if isinstance(config, Run):
            self.set_config(config_from_run(config.config))
        elif config is not None:
            self.set_config(config)
        elif self._saved is not None:
            self.set_config(self._saved)
            self._say("the form this cell held before the kernel restarted")
        else:
            self._refresh()

    @property
    def run(self) -> Run | None:
        """The run launched last from this panel."""
        return self.run_area.run

    @property
    def view(self) -> Dashboard | None:
        """The dashboard of that run, shown in ``live``."""
        return self.run_area.view

    @property
    def export_box(self) -> ExportBox | None:
        """The export form under it (once the run has weights), or a loaded run's."""
        return self.run_area.export_box

    # --------------------------------------------------------------------------------- building
    def _group(self, name: str) -> Any:
        for f in self.spec:
            if f.group == name:
                line = widgets.HBox(
                    [self.labels[f.path], self.fields[f.path]], layout=widgets.Layout(align_items="center")
                )
                self.rows[f.path] = widgets.VBox([line, self.error_labels[f.path]])
        return widgets.VBox([self.rows[f.path] for f in self.spec if f.group == name])

    def _layout(self) -> Any:
        """The form's steps, the column beside them, and the run's dashboard and export form below."""
        buttons = widgets.HBox([self.launch_button, self.stop_button, self.to_cell_button])
        buttons.add_class("nbtrain-buttons")
        start = [self.plan_for.widget, self.plan_area, self.error_area, buttons, self.plan_for.note]
        self.steps = numbered_steps(self.groups, [*start, self.status_area])
        return page(
            self.steps,
            load=[self.load_ref, self.load_button],
            load_note=self.load_note,
            yaml_view=self.yaml_view,
            save=self.save_row.widget,
            preview=self.preview,
            preset_note=self.preset_note,
            below=[self.live, self.export_area],
        )

    # ------------------------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _keeps(self, keeps: bool) -> None:
        """Say on the form whether running its cell again brings its values back (an empty panel in a
        notebook cell, its form saved: not one holding a secret), for the one line the lab extension shows
        in its place once the kernel is gone (labextension/src/kernellost.ts) instead of the form's widgets,
        each greyed with a broken link."""
        if keeps:
            self.widget.add_class(KEEPS_CLASS)
        else:
            self.widget.remove_class(KEEPS_CLASS)

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def close(self) -> None:
        """Stop the background checker and live view, and close the widgets (a kernel keeps every
        widget, with its layout and style, until it is closed)."""
        self._debouncer.close()
        self.run_area.close_view()
        self.run_area.close_export()
        self.to_cell.close()
        todo = [self.widget]
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            for part in (getattr(w, "layout", None), getattr(w, "style", None), w):
                if isinstance(part, widgets.Widget):
                    part.close()

    # --------------------------------------------------------------------------- config <-> form
    @classmethod
    def from_yaml(cls, text: str, **kwargs: Any) -> ConfigPanel:
        """A panel showing ``text`` (YAML). Raises ConfigError if it is not YAML or not a mapping."""
        return cls(text, **kwargs)

    @classmethod
    def from_run(cls, ref: str | Path | Run, **kwargs: Any) -> ConfigPanel:
        return cls(get_run(ref), **kwargs)

    def set_config(self, source: str | Path | Mapping[str, Any]) -> None:
        """Fill the form from YAML text, a .yaml path or a dict; keys without a field are kept as they are."""
        raw: Any
        if isinstance(source, Mapping):
            raw = dict(source)
        else:
            raw, _, _ = parse_source(source)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            kind = type(raw).__name__
            raise ConfigError(
                [Problem("", f"the config must be a mapping of keys (model:, data:, ...), got {kind}")]
            )
        raw = copy.deepcopy(raw)
        with self._lock:
            self._filling = True
            try:
                self._set.clear()
                self._extra = {}
                for f in self.spec:
                    self._write(f, UNSET)
                for key, value in raw.items():
                    if isinstance(key, str) and key in self._by_path:
                        self._write(self._by_path[key], value)
                    elif key in SECTIONS and isinstance(value, dict):
                        rest: dict[Any, Any] = {}
                        for sub, v in value.items():
                            path = f"{key}.{sub}"
                            if path in self._by_path:
                                self._write(self._by_path[path], v)
                            else:
                                rest[sub] = v
                        self._extra[key] = rest
                    else:
                        self._extra[key] = value
                for path, text in sweepform.fill(self._extra, self._by_path).items():
                    self.fields[path].value = text
                if isinstance(raw.get("sweep"), dict) and "method" not in raw["sweep"]:
                    self._write(self._by_path["sweep.method"], "tpe")  # the schema's, not the form's grid
                self._apply_preset()
                self.plan_for.load(raw)  # distributed: slurm: chooses its partition
                # what a loaded config holds was written by someone: its problems show at once
                self._touched = {f.path for f in self.spec if self._read(f) is not UNSET}
            finally:
                self._filling = False
        self._refresh()

    def _apply_preset(self) -> None:
        """Fill and disable the fields the lab preset fixes; always write the dropdowns it restricts
        (their first allowed value may not be the schema's default). Called while filling."""
        if self.preset is None:
            return
        for path, value in self.preset.locked().items():
            f = self._by_path.get(path)
            if f is None:
                continue  # no field (train.seed): the preset fills it in when the config is checked
            self._write(f, value)
            self.fields[path].disabled = True
            self.fields[path].tooltip = f"fixed by the lab preset {self.preset.source}"
        for f in self.spec:
            if f.kind == "choice" and self.preset.choices(f.path) is not None:
                self._set.add(f.path)

    def _write(self, f: PanelField, value: Any) -> None:
        w = self.fields[f.path]
        if f.kind == "choice":
            if value is UNSET:
                w.options = f.options()
                w.value = f.default
                self._set.discard(f.path)
                return
            if not any(same_value(value, c) for c in f.choices):
                # Keep a value the form does not offer, so it is shown, validated and written back.
                w.options = [*f.options(), (f"{value!r} (not allowed)", value)]
            w.value = value
            self._set.add(f.path)
        elif f.kind in ("text", "path"):
            w.value = "" if value is UNSET else value if isinstance(value, str) else str(value)
        elif f.kind == "targets":
            w.value = format_targets(value)
        elif f.kind == "names":
            is_names = isinstance(value, list) and all(isinstance(x, (str, dict)) for x in value)
            w.value = ", ".join(map(format_scalar, value)) if is_names else format_scalar(value)
        else:
            w.value = format_scalar(value)

    def _read(self, f: PanelField) -> Any:
        w = self.fields[f.path]
        if f.kind == "choice":
            v = w.value
            return v if f.path in self._set or not same_value(v, f.default) else UNSET
        if f.kind in ("text", "path"):
            return w.value.strip() or UNSET
        if f.kind == "targets":
            return parse_targets(w.value)
        if f.kind == "names":
            return parse_names(w.value)
        return sweepform.read(f, w.value)  # several values, separated by commas: a sweep tries each

    @property
    def method(self) -> Any:
        return self.fields["method"].value

    def to_dict(self) -> dict[str, Any]:
        """The config the form represents: set fields, changed dropdowns, and keys it has no field for."""
        with self._lock:
            values = {f.path: self._read(f) for f in self.spec}
            extra = self.plan_for.section(copy.deepcopy(self._extra))  # slurm: as Plan for says
        method = self.method
        out: dict[Any, Any] = {}
        keys = [*TOP_ORDER, *(k for k in extra if k not in TOP_ORDER)]
        for key in keys:
            if key in SECTIONS:
                if not section_active(key, method):
                    continue
                sub = {
                    f.key: values[f.path]
                    for f in self.spec
                    if f.section == key and "." in f.path and values[f.path] is not UNSET
                }
                more = extra.get(key, UNSET)
                if isinstance(more, dict):
                    out[key] = {**sub, **{k: v for k, v in more.items() if k not in sub}}
                elif sub:
                    out[key] = sub
                elif more is not UNSET:
                    out[key] = more
                elif key == "data":
                    out[key] = {}  # required: an empty form then reports data.train as missing
            elif key in values:
                if values[key] is not UNSET:
                    out[key] = values[key]
            elif key in extra:
                out[key] = extra[key]
        return sweepform.lift(out)

    def to_yaml(self) -> str:
        return _dump(self.to_dict())

    # ------------------------------------------------------------------------------- reacting
    def _changed_handler(self, path: str) -> Callable[[dict[str, Any]], None]:
        def changed(change: dict[str, Any]) -> None:
            if self._filling:
                return
            if self._by_path[path].kind == "choice":
                self._set.add(path)
            self._touched.add(path)
            if path == "model":  # an example model picked by name: the box then holds its path
                examples.pick(change["new"], self.fields[path], self._say, self._action)
            if self._action_error is not None:  # the last button's error was about the form before this
                self._action(None)
            self._refresh()

        return changed

    def _refresh(self) -> None:
        """Re-show the YAML now and queue validation and the preview (debounced, in the background)."""
        method = self.method
        self.groups["LoRA"].layout.display = "" if section_active("lora", method) else "none"
        self.groups["QLoRA"].layout.display = "" if section_active("quantization", method) else "none"
        self._show_objective_fields()
        cfg = self.to_dict()
        self.groups["Sweep"].layout.display = "" if "sweep" in cfg else "none"
        text = _dump(cfg)
        self.yaml_view.value = f"<pre style='{PRE_STYLE}'>{html.escape(text)}</pre>"
        self._debouncer.submit((text, cfg, Path.cwd(), self.plan_for.choice.value, self.plan_for.on))

    @property
    def objective(self) -> Any:
        return self.fields["objective"].value

    def _show_objective_fields(self) -> None:
        """The data formats the objective trains on (the format dropdown offers only those), the rows
        they expect, and rewards: for grpo and rloo only."""
        objective = self.objective
        known = OBJECTIVES.get(objective) if isinstance(objective, str) else None
        self.rows["rewards"].layout.display = "" if objective in rewards_objectives() else "none"
        if known is None:
            self.data_help.value = ""
            return
        f, w = self._by_path["data.format"], self.fields["data.format"]
        allowed = ["auto", *known.formats]
        labels = {c: label for label, c in f.options()}
        options = [(labels.get(c, c), c) for c in allowed]  # the objective's order: its first is preferred
        if not any(same_value(w.value, c) for c in allowed):
            # Keep a format the objective does not take, so the validator's message shows on it.
            options.append((f"{w.value!r} (not for {objective})", w.value))
        if [v for _, v in options] != [v for _, v in w.options]:
            filling, self._filling = self._filling, True
            try:
                value = w.value
                w.options = options
                w.value = value
            finally:
                self._filling = filling
        w.disabled = len(f.choices) < 2
        rows = "".join(
            f"<div style='margin:2px 0 0 12px'><code>{html.escape(k)}</code>: "
            f"<code>{html.escape(FORMAT_HELP[k])}</code></div>"
            for k in known.formats
        )
        names = ", ".join(known.formats)
        self.data_help.value = (
            f"<details class='nbtrain-data-help'><summary>objective: {html.escape(objective)} trains on "
            f"rows like: {html.escape(names)}</summary>{rows}</details>"
        )

    def settle(self, timeout: float | None = 30.0) -> bool:
        """Wait until inline errors and the preview reflect the latest change and a Stop has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self._debouncer.settle(timeout)
        for t in list(self.run_area.background):
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            ok = ok and not t.is_alive()
        return ok

    def _refresh_candidates(self, base: Path) -> None:
        """Offer the model folders and data files found on disk in the model and data boxes."""
        self._candidates_at = time.monotonic()
        for path, found in (("model", model_candidates(base)), ("data.train", data_candidates(base))):
            w = self.fields.get(path)
            if isinstance(w, widgets.Combobox) and list(w.options) != found:
                w.options = found

    def _plan_for_changed(self) -> None:
        if self._action_error is not None:
            self._action(None)
        self._launch_state()
        self._refresh()

    def _check(self, item: tuple[str, dict[str, Any], Path, str, str | None], gen: int) -> None:
        text, cfg, base, choice, on = item
        if time.monotonic() - self._candidates_at > CANDIDATES_EVERY:
            self._refresh_candidates(base)
        if text != self._saved:
            kept = saved.save(self._cell, text)  # kept for this cell across a kernel restart
            self._saved = text
            self._keeps(self._restores and (kept or saved.is_empty(text)))
        problems, prep = check_config(text, on=on)
        if choice == NAMED and on is None:
            prep = None  # no hardware named yet (or not one nbtrain knows): no plan for this machine instead
        key = (preview_inputs(cfg, base), self.preview_rows)
        html_preview = None
        if key != self._preview_key:
            html_preview = preview_html(data_preview(cfg, base, self.preview_rows))
        if gen != self._debouncer.latest:
            return  # a newer change is queued; its check will show the current state
        with self._lock:
            self._apply_problems(problems)
            self._show_plan(prep, cfg)
            if html_preview is not None:
                self.preview.value = html_preview
                self._preview_key = key

    def _show_plan(self, prep: Prepared | None, cfg: dict[str, Any]) -> None:
        """The plan Launch would start (None: the form would not start), under the form; each empty
        training field shows the value that plan uses ("planned"; before a plan, what it will use whatever
        the model: ``plan.placeholders``)."""
        self.plan_text = plan_lines(prep) if prep is not None else []
        self.planned = dict(prep.train_args) if prep is not None else {}
        self.planned_plan = prep.plan.to_dict() if prep is not None else {}
        self.plan_area.value = plan_html(self.plan_text) if self.plan_text else ""
        boxes = [f for f in self.spec if f.kind == "scalar" and f.path.startswith("train.")]
        shown = placeholders([f.key for f in boxes], prep, cfg)
        for f in boxes:
            w = self.fields[f.path]
            want = shown.get(f.key, f.placeholder)
            if w.placeholder != want:
                w.placeholder = want

    def _job_failed(self, tb: str) -> None:
        with self._lock:
            self._general_errors = [f"checking the config failed unexpectedly:\n{tb}"]
            self._render_errors()

    def _target(self, path: str) -> str | None:
        parts = path.split(".") if path else []
        for i in range(len(parts), 0, -1):
            cand = ".".join(parts[:i])
            if cand in self._by_path:
                return cand
        return None

    def _apply_problems(self, problems: Iterable[Problem]) -> None:
        by_field: dict[str, list[str]] = {}
        general: list[str] = []
        slurm: list[str] = []  # shown under Plan for's partition box
        for p in problems:
            target = self._target(p.path)
            if target is None and p.path.startswith("distributed.slurm"):
                slurm.append(f"{p.path.removeprefix('distributed.slurm.')}: {p.message}")
            elif target is None:
                general.append(f"{p.path or 'config'}: {p.message}")
            else:
                by_field.setdefault(target, []).append(p.message)
        with self._lock:
            self._problems = {k: "\n".join(v) for k, v in by_field.items()}
            self._all_general = general
            self._show_problems()
            self.plan_for.slurm_problems(slurm)
            self._ready = not by_field and not general and not slurm  # green: a form that would start
            self._launch_state()

    def _launch_state(self) -> None:
        """Launch: green for a form that would start, off for named hardware (the plan is an estimate)."""
        off = self.plan_for.launch_refusal()
        ready = self._ready and off is None
        self.launch_button.disabled = off is not None
        self.launch_button.button_style = "success" if ready else ""
        self.launch_button.tooltip = off or (
            "check the config and start it"
            if ready
            else "the form is not complete: Launch shows every problem"
        )

    def _shows(self, path: str) -> bool:
        """Whether a field's problem shows: once Launch was pressed, once the user changed the field, or
        while it holds a value; so an empty form opens without "required key is missing" everywhere."""
        return self._reveal or path in self._touched or self._read(self._by_path[path]) is not UNSET

    def _show_problems(self) -> None:
        self._field_errors = {k: v for k, v in self._problems.items() if self._shows(k)}
        started = self._reveal or bool(self._touched) or bool(self._extra)
        self._general_errors = list(self._all_general) if started else []
        for path, label in self.error_labels.items():
            msg = self._field_errors.get(path)
            value = f"<div style='{ERROR_STYLE}'>{html.escape(msg)}</div>" if msg else ""
            if label.value != value:
                label.value = value
            w = self.fields[path]
            if msg:
                w.add_class("nbtrain-invalid")
            else:
                w.remove_class("nbtrain-invalid")
        self._render_errors()

    def _render_errors(self) -> None:
        items = [*self._general_errors, *([self._action_error] if self._action_error else [])]
        self.error_area.value = (
            "".join(f"<pre style='{PRE_STYLE};{ERROR_STYLE}'>{html.escape(m)}</pre>" for m in items)
            if items
            else ""
        )

    @property
    def errors(self) -> dict[str, str]:
        """Inline errors by field path (the validator's messages), as last shown."""
        with self._lock:
            return dict(self._field_errors)

    @property
    def problems(self) -> dict[str, str]:
        """Every field's problem of the last check, shown or not yet (an untouched empty field's)."""
        with self._lock:
            return dict(self._problems)

    @property
    def general_errors(self) -> list[str]:
        """Problems with no field of their own, and the last button's error."""
        with self._lock:
            return [*self._general_errors, *([self._action_error] if self._action_error else [])]

    # -------------------------------------------------------------------------------- buttons
    def _guard(self, action: Callable[[], None]) -> Callable[[Any], None]:
        """A click handler: widgets have no cell to fail, so errors are shown in the panel."""

        def handler(_button: Any) -> None:
            self._action(None)
            try:
                action()
            except ConfigError as e:  # shown on the fields, in the form's words: here only what it means
                n = len(e.problems)
                self._action(f"Nothing was started: {n} problem{'s' if n != 1 else ''}, marked in red above")
            except NbtrainError as e:
                self._action(str(e))
            except Exception:  # noqa: BLE001 - a click has no cell: the traceback goes to the panel
                self._action(f"unexpected error:\n{traceback.format_exc()}")

        return handler

    def _action(self, error: str | None, status: str | None = None) -> None:
        with self._lock:
            self._action_error = error
            self._render_errors()
            if status is not None:
                self._say(status)

    def _say(self, status: str) -> None:
        with self._lock:
            self.status_message = status
            self.status_area.value = f"<div class='nbtrain-status'>{html.escape(status)}</div>"

    def _launch(self) -> None:
        off = self.plan_for.launch_refusal()
        if off is not None:  # Launch is disabled then; click() from code still calls this
            raise NbtrainError(f"Nothing was started: {off}")
        with self._lock:
            self._reveal = True  # from now on every problem shows, touched or not
            self._show_problems()
        text = self.to_yaml()
        try:
            prep = start.prepare(text)
        except ConfigError as e:
            self._apply_problems(e.problems)
            raise
        self._action(None, self.run_area.launch(prep))

    def _load_clicked(self, button: Any) -> None:
        self.load_note.value = ""
        self._guard(self._load)(button)
        with self._lock:
            said, failed = self._action_error or self.status_message, self._action_error is not None
        kind = "nbtrain-load-failed" if failed else "nbtrain-load-done"
        self.load_note.value = f"<div class='nbtrain-load-note {kind}'>{html.escape(said or '')}</div>"

    def _load(self) -> None:
        ref = self.load_ref.value.strip()
        if not ref:
            raise NbtrainError("type a run id, id prefix or name, or a .yaml file, next to Load")
        if yamlfile.is_yaml_name(ref):
            # an nbtrain config or nothing: any other file is refused naming why, the form left as it was
            self.set_config(yamlfile.read(ref, Path.cwd()))
            self._action(None, f"loaded the form from {ref}")
            return
        run = get_run(ref)
        self.set_config(config_from_run(run.config))
        self._action(None, f"loaded the config of run {run.id}")
        self.run_area.offer_export(run)


def _dump(cfg: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(cfg), sort_keys=False, allow_unicode=True, width=100)


def validate(text: str) -> list[Problem]:
    """What would stop ``text`` from launching (empty when Launch would start it): the one validation
    entry every surface uses, so the form shows exactly the messages Launch would raise."""
    return validate_config(text)


def panel(config: ConfigSource = None) -> ConfigPanel:
    """A config panel, empty or filled from YAML text, a .yaml path, a dict, or a Run's config."""
    return ConfigPanel(config)
