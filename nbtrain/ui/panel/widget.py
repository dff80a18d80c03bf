"""The panel itself: the ipywidgets form, its live YAML and inline errors, the data preview, and the
Launch / Stop / To cell / Export buttons with the run's dashboard below."""

from __future__ import annotations

import contextlib
import copy
import html
import math
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

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
from nbtrain.control.runs.follow import FollowStopped, follow
from nbtrain.control.runs.run import Run, get_run
from nbtrain.ui.panel import saved, yamlfile
from nbtrain.ui.panel.datapreview import PRE_STYLE, data_preview, preview_html, preview_inputs
from nbtrain.ui.panel.debounce import Debouncer
from nbtrain.ui.panel.fields import (
    GROUPS,
    SECTIONS,
    STEPS,
    TOP_ORDER,
    UNSET,
    PanelField,
    config_from_run,
    format_scalar,
    format_targets,
    panel_fields,
    parse_names,
    parse_scalar,
    parse_targets,
    preset_fields,
    same_value,
    section_active,
)
from nbtrain.ui.panel.files import CANDIDATES_EVERY, data_candidates, model_candidates
from nbtrain.ui.panel.plan import plan_html, plan_lines
from nbtrain.ui.panel.style import CSS, ERROR_STYLE, FIELD_WIDTH, LABEL_WIDTH, preset_note_html

if TYPE_CHECKING:
    from nbtrain.control.prepare import Prepared
    from nbtrain.ui.dashboard import Dashboard
    from nbtrain.ui.export_box import ExportBox

# ------------------------------------------------------------------------------------------- panel

ConfigSource = str | Path | Mapping[str, Any] | Run | None

# The comm target of the lab extension's "insert a cell" (labextension/src/tocell.ts).
CELLS_TARGET: Final = "nbtrain.cells"


def label_html(f: PanelField) -> str:
    """A field's label: its words, with the YAML key and its help as the tooltip."""
    title, text = html.escape(f.tooltip), html.escape(f.label or f.path)
    return f"<label class='nbtrain-label' title='{title}'>{text}</label>"


def _side_title(title: str, hint: str) -> str:
    return f"<div class='nbtrain-side-title'>{html.escape(title)} <small>{html.escape(hint)}</small></div>"


class ConfigPanel:
    """The form. Display it (last expression of a cell, or ``.show()``); drive it from code with
    ``fields[path].value = ...``, ``set_config``, ``to_yaml``/``to_dict``, and the buttons' ``click()``.
    """

    def __init__(self, config: ConfigSource = None, *, debounce: float = 0.25, preview_rows: int = 3) -> None:
        self.preset = find_preset()  # instructor mode: its fixed fields show filled and disabled
        self.spec = preset_fields(panel_fields(), self.preset)
        self._by_path = {f.path: f for f in self.spec}
        self.preview_rows = preview_rows
        self.run: Run | None = None  # the run launched last from this panel
        self.view: Dashboard | None = None  # the dashboard of that run, shown in ``live``
        self._watch_stop = threading.Event()
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
        self._frontend = False  # the lab extension answered: To cell inserts the cell through it
        self._candidates_at = -math.inf
        self._action_error: str | None = None
        self._background: list[threading.Thread] = []
        self._preview_key: Any = None
        self._debouncer = Debouncer(debounce, self._check, self._job_failed)

        self.fields: dict[str, Any] = {f.path: self._make_widget(f) for f in self.spec}
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
        self.stop_button = widgets.Button(
            description="Stop",
            button_style="warning",
            icon="stop",
            disabled=True,  # enabled while the run launched here is active
            tooltip="stop the run launched here after its current step (it saves a checkpoint)",
        )
        self.to_cell_button = widgets.Button(
            description="To cell", icon="clipboard", tooltip="insert a %%finetune cell with this config"
        )
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
        self.live = widgets.VBox([])  # the launched run's dashboard
        self.export_area = widgets.VBox([])  # that run's export form (once it has weights), or a loaded run's
        self.export_box: ExportBox | None = None
        self.launch_button.on_click(self._guard(self._launch))
        self.stop_button.on_click(self._guard(self._stop))
        self.to_cell_button.on_click(self._guard(self._to_cell))
        self.load_button.on_click(self._guard(self._load))
        for f in self.spec:
            self.fields[f.path].observe(self._changed_handler(f.path), names="value")
        self.data_help = widgets.HTML("")
        self.rows: dict[str, Any] = {}  # a field's label, box and error line
        self.groups = {g: self._group(g) for g in GROUPS}
        self.groups["Data"].children = (*self.groups["Data"].children, self.data_help)
        self.preset_note = widgets.HTML(preset_note_html(self.preset))
        self.widget = self._layout()
        self.widget.add_class("nbtrain-panel")
        self.widget.add_class(self.dom_class)
        self._refresh_candidates(Path.cwd())
        self._hello = self._open_comm({"action": "hello", "panel": self.dom_class}, self._on_hello)

        self._filling = True
        try:
            self._apply_preset()
        finally:
            self._filling = False
        # the form this cell held before a kernel restart (ui/panel/saved.py), for an empty panel
        self._cell = saved.cell_key()
        self._saved = None if config is not None else saved.load(self._cell)
        if isinstance(config, Run):
            self.set_config(config_from_run(config.config))
        elif config is not None:
            self.set_config(config)
        elif self._saved is not None:
            self.set_config(self._saved)
            self._say("the form this cell held before the kernel restarted")
        else:
            self._refresh()

    # --------------------------------------------------------------------------------- building
    def _make_widget(self, f: PanelField) -> Any:
        # No description: ipywidgets shows a tooltip only on a widget without one, so the label is a
        # widget of its own (label_html) and the key and its help show on both.
        common: dict[str, Any] = {"layout": widgets.Layout(width=FIELD_WIDTH), "tooltip": f.tooltip}
        if f.kind == "choice":
            w = widgets.Dropdown(options=f.options(), value=f.default, **common)
            w.disabled = len(f.choices) < 2
            return w
        if f.kind == "path":  # typed freely, with what is on disk offered as it is typed
            return widgets.Combobox(
                value="", options=[], ensure_option=False, placeholder=f.placeholder, **common
            )
        if f.choices:
            return widgets.Combobox(
                value="",
                options=[str(c) for c in f.choices],
                ensure_option=False,
                placeholder=f.placeholder,
                **common,
            )
        return widgets.Text(value="", placeholder=f.placeholder, **common)

    def _group(self, name: str) -> Any:
        for f in self.spec:
            if f.group == name:
                line = widgets.HBox(
                    [self.labels[f.path], self.fields[f.path]], layout=widgets.Layout(align_items="center")
                )
                self.rows[f.path] = widgets.VBox([line, self.error_labels[f.path]])
        return widgets.VBox([self.rows[f.path] for f in self.spec if f.group == name])

    def _layout(self) -> Any:
        """The flow: one numbered step after another (model, method, data, hyperparameters, start), the
        YAML and the data preview beside it, the launched run's dashboard below."""
        self.steps: dict[str, Any] = {}
        for n, (title, hint, groups) in enumerate(STEPS, 1):
            head = widgets.HTML(
                f"<div class='nbtrain-step-title'><span class='nbtrain-step-num'>{n}</span>"
                f"{html.escape(title)}<span class='nbtrain-step-hint'>{html.escape(hint)}</span></div>"
            )
            children = [head, *(self.groups[g] for g in groups)]
            if title == "Start":
                buttons = widgets.HBox([self.launch_button, self.stop_button, self.to_cell_button])
                buttons.add_class("nbtrain-buttons")
                children += [self.plan_area, self.error_area, buttons, self.status_area]
            box = widgets.VBox(children)
            box.add_class("nbtrain-step")
            self.steps[title] = box
        form = widgets.VBox(list(self.steps.values()), layout=widgets.Layout(width="580px", flex="0 0 auto"))
        load = widgets.HBox([self.load_ref, self.load_button], layout=widgets.Layout(align_items="center"))
        side = widgets.VBox(
            [
                widgets.HTML(_side_title("Start from a run or a file", "fill the form with its config")),
                load,
                widgets.HTML(_side_title("YAML", "what a %%finetune cell would hold")),
                self.yaml_view,
                widgets.HTML(_side_title("Save the form", "to a YAML file beside the notebook")),
                self.save_row.widget,
                widgets.HTML(_side_title("Data preview", "the first rows as the model sees them")),
                self.preview,
            ],
            layout=widgets.Layout(min_width="300px", flex="1 1 0", margin="0 10px 0 14px", overflow="hidden"),
        )
        return widgets.VBox(
            [
                widgets.HTML(CSS),
                self.preset_note,
                widgets.HBox([form, side], layout=widgets.Layout(align_items="flex-start")),
                self.live,
                self.export_area,
            ]
        )

    # ------------------------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def close(self) -> None:
        """Stop the background checker and live view, and close the widgets (a kernel keeps every
        widget, with its layout and style, until it is closed)."""
        self._debouncer.close()
        self._close_view()
        self._close_export()
        for c in (self._hello,):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
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
                self._apply_preset()
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
        return parse_scalar(w.value)

    @property
    def method(self) -> Any:
        return self.fields["method"].value

    def to_dict(self) -> dict[str, Any]:
        """The config the form represents: set fields, changed dropdowns, and keys it has no field for."""
        with self._lock:
            values = {f.path: self._read(f) for f in self.spec}
            extra = copy.deepcopy(self._extra)
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
        return out

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
        text = _dump(cfg)
        self.yaml_view.value = f"<pre style='{PRE_STYLE}'>{html.escape(text)}</pre>"
        self._debouncer.submit((text, cfg, Path.cwd()))

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
        for t in list(self._background):
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

    def _check(self, item: tuple[str, dict[str, Any], Path], gen: int) -> None:
        text, cfg, base = item
        if time.monotonic() - self._candidates_at > CANDIDATES_EVERY:
            self._refresh_candidates(base)
        if text != self._saved:
            saved.save(self._cell, text)  # kept for this cell across a kernel restart
            self._saved = text
        problems, prep = check_config(text)
        key = (preview_inputs(cfg, base), self.preview_rows)
        html_preview = None
        if key != self._preview_key:
            html_preview = preview_html(data_preview(cfg, base, self.preview_rows))
        if gen != self._debouncer.latest:
            return  # a newer change is queued; its check will show the current state
        with self._lock:
            self._apply_problems(problems)
            self._show_plan(prep)
            if html_preview is not None:
                self.preview.value = html_preview
                self._preview_key = key

    def _show_plan(self, prep: Prepared | None) -> None:
        """The plan Launch would start (None: the form would not start), under the form; each empty
        training field shows the value that plan uses ("planned"), or its default until the config is
        whole."""
        self.plan_text = plan_lines(prep) if prep is not None else []
        self.planned = dict(prep.train_args) if prep is not None else {}
        self.planned_plan = prep.plan.to_dict() if prep is not None else {}
        self.plan_area.value = plan_html(self.plan_text) if self.plan_text else ""
        planned = self.planned
        for f in self.spec:
            w = self.fields[f.path]
            key = f.path.removeprefix("train.")
            if f.kind != "scalar" or not f.path.startswith("train.") or not hasattr(w, "placeholder"):
                continue
            want = f"{format_scalar(planned[key])} (planned)" if key in planned else f.placeholder
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
        for p in problems:
            target = self._target(p.path)
            if target is None:
                general.append(f"{p.path or 'config'}: {p.message}")
            else:
                by_field.setdefault(target, []).append(p.message)
        with self._lock:
            self._problems = {k: "\n".join(v) for k, v in by_field.items()}
            self._all_general = general
            self._show_problems()
            ready = not by_field and not general  # Launch is green only for a form that would start
            self.launch_button.button_style = "success" if ready else ""
            self.launch_button.tooltip = (
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
        with self._lock:
            self._reveal = True  # from now on every problem shows, touched or not
            self._show_problems()
        text = self.to_yaml()
        try:
            prep = start.prepare(text)
        except ConfigError as e:
            self._apply_problems(e.problems)
            raise
        run = start.start(prep)
        self.run = run
        self._show_run(run)
        self._action(None, f"started run {run.id} ({run.name})")

    def _show_run(self, run: Run) -> None:
        """Show ``run``'s dashboard (the one a ``%%finetune`` cell shows) under the form, kept current by
        its own thread, and keep Stop enabled while the run is active.

        The dashboard's widgets are children of the panel rather than ``display()``-ed from the click
        handler: a display from a handler lands in whatever cell runs then, and its updates would carry
        the click's parent header; widget values travel over each widget's own comm.
        """
        from nbtrain.ui.dashboard import Dashboard  # plotly loads on the first launch, not with the panel

        self._close_view()  # the previous run goes on; only its view here stops
        self._close_export()
        view = Dashboard(run)
        view.refresh()  # builds its widgets
        self.view = view
        self.live.children = (view.box,) if view.box is not None else ()
        view.start()
        self.stop_button.disabled = False
        stop = threading.Event()
        self._watch_stop = stop
        threading.Thread(
            target=self._watch, args=(run, stop), name=f"nbtrain-panel-watch-{run.id}", daemon=True
        ).start()

    def _watch(self, run: Run, stop: threading.Event) -> None:
        """Until ``run`` ends: then Stop is disabled and the status line says how it ended."""
        try:
            st = follow(run.status, interval=0.5, stop=stop, what=f"run {run.id}")
        except FollowStopped:
            return
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._action(f"following run {run.id} failed:\n{traceback.format_exc()}")
            return
        if self.run is run:
            self.stop_button.disabled = True
            self._say(f"run {run.id}: {st.describe()}")
            self._offer_export(run)

    def _offer_export(self, run: Run) -> None:
        """The export form of ``run`` under its dashboard, once it has something to export."""
        from nbtrain.control.runs.run import has_trained_weights
        from nbtrain.ui.export_box import ExportBox

        if self.export_box is not None and self.export_box.run.dir == run.dir:
            return
        self._close_export()
        if has_trained_weights(run):
            self.export_box = ExportBox(run)
            self.export_area.children = (self.export_box.box,)

    def _close_export(self) -> None:
        box, self.export_box = self.export_box, None
        self.export_area.children = ()
        if box is not None and not box.busy:  # a running export finishes; its form just leaves
            box.close()

    def _close_view(self) -> None:
        self._watch_stop.set()
        view, self.view = self.view, None
        if view is not None:
            view.close()
        old, self.live.children = self.live.children, ()
        todo = list(old)
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    def _stop(self) -> None:
        run = self.run
        if run is None:
            raise NbtrainError("no run was launched from this panel yet; Launch one first")
        self.stop_button.disabled = True  # one request is enough; the run winds down in the background
        self._action(None, f"stopping run {run.id} (it finishes its step and saves a checkpoint)…")
        # Run.stop waits for the worker to exit (up to its timeout): do that off the kernel thread.
        t = threading.Thread(
            target=self._stop_in_background, args=(run,), name="nbtrain-panel-stop", daemon=True
        )
        self._background = [b for b in self._background if b.is_alive()] + [t]
        t.start()

    def _stop_in_background(self, run: Run) -> None:
        try:
            st = run.stop()
        except NbtrainError as e:
            self._action(str(e))
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the panel
            self._action(f"stopping run {run.id} failed:\n{traceback.format_exc()}")
        else:
            self._action(None, f"run {run.id}: {st.describe()}")
        if self.run is run and not run.status().done:
            self.stop_button.disabled = False  # it did not stop: let the user try again

    # ------------------------------------------------------------------------------------ To cell
    # In JupyterLab and Notebook 7 the lab extension inserts the cell at once (labextension/src/tocell.ts):
    # the panel says hello on a comm when it is made, and once the extension has answered, To cell sends
    # the cell's text on a new comm. Elsewhere (no extension, another frontend) IPython's set_next_input
    # is what there is, and a notebook applies that only when the next cell runs: the panel says so.

    def _open_comm(self, data: dict[str, Any], on_msg: Callable[[dict[str, Any]], None]) -> Any:
        """A comm to the frontend's ``nbtrain.cells`` target; outside a kernel, comm's inert stand-in."""
        try:
            from comm import create_comm
        except ImportError:  # no kernel stack at all
            return None
        c = create_comm(target_name=CELLS_TARGET, data=data)
        c.on_msg(on_msg)
        return c

    def _on_hello(self, msg: dict[str, Any]) -> None:
        if msg.get("content", {}).get("data", {}).get("ready"):
            self._frontend = True

    def _to_cell(self) -> None:
        # the first time it loads the magics (a few seconds on a cold kernel): the button says it is busy
        button = self.to_cell_button
        button.description = "To cell…"
        button.disabled = True
        try:
            self._insert_cell()
        finally:
            button.description = "To cell"
            button.disabled = False

    def _insert_cell(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise NbtrainError("'To cell' needs IPython or Jupyter; copy the YAML shown above instead")
        # the cell is a %%finetune cell: make sure the magic exists in this kernel (%load_ext nbtrain)
        shell.extension_manager.load_extension("nbtrain")
        source = "%%finetune\n" + self.to_yaml()
        if self._frontend:
            self._open_comm(
                {"action": "insert", "panel": self.dom_class, "source": source}, self._on_inserted
            )
            self._action(None, "inserting a %%finetune cell below the panel…")
            return
        shell.set_next_input(source, replace=False)
        # Jupyter delivers this with the reply of the next executed cell; say so, or it looks lost.
        self._action(
            None,
            "a new %%finetune cell with this config follows the next cell you run (the nbtrain "
            "JupyterLab extension, which inserts it at once, is not active in this frontend)",
        )

    def _on_inserted(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data", {})
        if "inserted" in data:
            self._action(None, "a %%finetune cell with this config is below the panel: run it to start")
        else:
            self._action(f"the notebook could not insert the cell: {data.get('error', data)}")

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
        self._offer_export(run)


def _dump(cfg: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(cfg), sort_keys=False, allow_unicode=True, width=100)


def validate(text: str) -> list[Problem]:
    """What would stop ``text`` from launching (empty when Launch would start it): the one validation
    entry every surface uses, so the form shows exactly the messages Launch would raise."""
    return validate_config(text)


def panel(config: ConfigSource = None) -> ConfigPanel:
    """A config panel, empty or filled from YAML text, a .yaml path, a dict, or a Run's config."""
    return ConfigPanel(config)
