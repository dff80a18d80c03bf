"""Where the panel's widgets sit: a field's widget and label, the numbered steps of the form (model,
method, data, hyperparameters, start), the column beside them (Load, the YAML, Save, the data preview),
and the page with the launched run's dashboard and export form below."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from nbtrain.ui.panel.fields import STEPS, PanelField
from nbtrain.ui.panel.style import CSS, FIELD_WIDTH


def label_html(f: PanelField) -> str:
    """A field's label: its words, with the YAML key and its help as the tooltip."""
    title, text = html.escape(f.tooltip), html.escape(f.label or f.path)
    return f"<label class='nbtrain-label' title='{title}'>{text}</label>"


def field_widget(f: PanelField) -> Any:
    """The widget a field is typed or picked in."""
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


def _side_title(title: str, hint: str) -> str:
    return f"<div class='nbtrain-side-title'>{html.escape(title)} <small>{html.escape(hint)}</small></div>"


def numbered_steps(groups: Mapping[str, Any], start: Sequence[Any]) -> dict[str, Any]:
    """Each step's box by title: its number and hint over its groups of fields; ``start`` (the plan, the
    errors, the buttons, the status line) ends the Start step."""
    steps: dict[str, Any] = {}
    for n, (title, hint, names) in enumerate(STEPS, 1):
        head = widgets.HTML(
            f"<div class='nbtrain-step-title'><span class='nbtrain-step-num'>{n}</span>"
            f"{html.escape(title)}<span class='nbtrain-step-hint'>{html.escape(hint)}</span></div>"
        )
        children = [head, *(groups[g] for g in names)]
        if title == "Start":
            children += list(start)
        box = widgets.VBox(children)
        box.add_class("nbtrain-step")
        steps[title] = box
    return steps


def page(
    steps: Mapping[str, Any],
    *,
    load: Sequence[Any],
    load_note: Any,
    yaml_view: Any,
    save: Any,
    preview: Any,
    preset_note: Any,
    below: Sequence[Any],
) -> Any:
    """The flow: one numbered step after another, the YAML and the data preview beside it, ``below``
    (the launched run's dashboard, its export form) under both."""
    form = widgets.VBox(list(steps.values()), layout=widgets.Layout(width="580px", flex="0 0 auto"))
    load_row = widgets.HBox(list(load), layout=widgets.Layout(align_items="center"))
    side = widgets.VBox(
        [
            widgets.HTML(_side_title("Start from a run or a file", "fill the form with its config")),
            load_row,
            load_note,
            widgets.HTML(_side_title("YAML", "what a %%finetune cell would hold")),
            yaml_view,
            widgets.HTML(_side_title("Save the form", "to a YAML file beside the notebook")),
            save,
            widgets.HTML(_side_title("Data preview", "the first rows as the model sees them")),
            preview,
        ],
        layout=widgets.Layout(min_width="300px", flex="1 1 0", margin="0 10px 0 14px", overflow="hidden"),
    )
    return widgets.VBox(
        [
            widgets.HTML(CSS),
            preset_note,
            widgets.HBox([form, side], layout=widgets.Layout(align_items="flex-start")),
            *below,
        ]
    )
