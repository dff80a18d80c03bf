"""A widget form for a run config, for people who would rather not type YAML.

    import nbtrain; nbtrain.panel()            # or: %finetune panel

The form is another way to write the same YAML a ``%%finetune`` cell takes: it shows that YAML live,
validates it with ``nbtrain.control.prepare.validate``, the check Launch itself goes by (so every inline
error is the message launching would give, on the field it belongs to, and a form without errors
launches), previews the first data rows as the model will see them, and launches, stops, loads and
exports runs through ``nbtrain.control.start``.

Nothing here imports torch, transformers or bitsandbytes: the data preview renders the model's chat
template with jinja2 directly (the way transformers does), and validation that needs bitsandbytes runs
its probe in a subprocess (see ``nbtrain.control.config.schema``). Validation and the preview run in a
background thread, debounced, so typing never waits for them and a slow first check does not block the kernel.

The package, by job: ``fields`` (what the form shows and the text <-> YAML rules), ``datapreview`` (the
first rows as the model sees them), ``files`` (path suggestions), ``debounce`` (the background checker's
thread), ``layout`` (where the widgets sit), ``runarea`` (the launched run under the form), ``tocell`` (To
cell), ``planfor`` (which hardware the plan is for) and ``widget`` (the form itself).
"""

from __future__ import annotations

from nbtrain.control.config.chat_template import ChatTemplate, find_chat_template
from nbtrain.ui.panel.datapreview import Preview, PreviewRow, data_preview, preview_html
from nbtrain.ui.panel.fields import (
    STRATEGY_CHOICES,
    UNSET,
    PanelField,
    config_from_run,
    format_scalar,
    panel_fields,
    parse_scalar,
)
from nbtrain.ui.panel.files import model_candidates
from nbtrain.ui.panel.widget import ConfigPanel, panel, validate

__all__ = [
    "STRATEGY_CHOICES",
    "UNSET",
    "ChatTemplate",
    "ConfigPanel",
    "PanelField",
    "Preview",
    "PreviewRow",
    "config_from_run",
    "data_preview",
    "find_chat_template",
    "format_scalar",
    "model_candidates",
    "panel",
    "panel_fields",
    "parse_scalar",
    "preview_html",
    "validate",
]
