"""The panel's look: its widths and its stylesheet (the classes its widgets add: nbtrain-step, ...)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbtrain.control.config.preset import Preset

LABEL_WIDTH = 168  # px; the labels are words, so they fit (no key path cut off)
FIELD_WIDTH = "372px"
# what sits under the fields (the plan, the buttons) starts at the fields' left edge; text (errors, status)
# at the text inside them
ERROR_STYLE = f"color:#c62828;font-size:12px;line-height:1.3;margin:0 0 2px {LABEL_WIDTH + 8}px"
CSS = f"""<style>
.nbtrain-invalid input, .nbtrain-invalid select, .nbtrain-invalid textarea {{border-color:#c62828 !important}}
.nbtrain-step {{border:1px solid var(--jp-border-color2, #e0e0e0); border-radius:6px;
  padding:4px 10px 8px 10px; margin:0 0 10px 0}}
.nbtrain-step-title {{font-size:14px; font-weight:600; margin:2px 0 6px 0;
  color:var(--jp-ui-font-color0, #212121)}}
.nbtrain-step-num {{display:inline-block; width:20px; height:20px; line-height:20px; border-radius:10px;
  background:#1565c0; color:#fff; text-align:center; font-size:12px; margin-right:8px}}
.nbtrain-step-hint {{font-weight:normal; font-size:12px; color:var(--jp-ui-font-color2, #757575);
  margin-left:8px}}
.nbtrain-label {{display:block; width:{LABEL_WIDTH - 8}px; padding-right:8px; white-space:nowrap;
  overflow:hidden; text-overflow:ellipsis; line-height:var(--jp-widgets-inline-height, 28px);
  color:var(--jp-ui-font-color1, #424242); cursor:help}}
.nbtrain-side-title {{font-weight:600; margin:4px 0; white-space:nowrap}}
.nbtrain-data-help {{font-size:12px; line-height:1.5; color:var(--jp-ui-font-color2, #616161);
  margin:2px 0 0 {LABEL_WIDTH}px}}
.nbtrain-data-help summary {{cursor:pointer}}
.nbtrain-side-title small {{font-weight:normal; color:var(--jp-ui-font-color2, #757575)}}
.nbtrain-buttons {{margin:6px 0 2px {LABEL_WIDTH}px; max-width:calc({FIELD_WIDTH} + 4px)}}
.nbtrain-buttons button {{flex:1 1 0; width:auto; min-width:0}}
.nbtrain-status {{margin:4px 0 0 {LABEL_WIDTH + 8}px; font-size:12px; line-height:1.4;
  color:var(--jp-ui-font-color1, #424242)}}
.nbtrain-load-note {{margin:2px 0 4px; font-size:12px; line-height:1.4; overflow-wrap:anywhere}}
.nbtrain-load-done {{color:#2e7d32}}
.nbtrain-load-failed {{color:#b3261e}}
.nbtrain-panel button:disabled {{filter:grayscale(100%); opacity:0.45 !important;
  cursor:not-allowed !important; box-shadow:none !important}}
.nbtrain-plan {{margin:6px 0 2px {LABEL_WIDTH}px; padding:4px 8px; font-size:12px; line-height:1.5;
  max-width:{FIELD_WIDTH}; box-sizing:border-box;
  border-left:3px solid #1565c0; background:var(--jp-layout-color2, #f5f5f5);
  color:var(--jp-ui-font-color1, #424242)}}
.nbtrain-plan-for {{font-weight:600}}
.nbtrain-plan-warning {{margin:4px 0 2px; padding-top:4px; border-top:1px solid #ffe0b2; color:#b45309}}
.nbtrain-launch-off {{max-width:calc({FIELD_WIDTH} - 8px); color:var(--jp-ui-font-color2, #616161)}}
</style>"""


def preset_note_html(preset: Preset | None) -> str:
    """The panel's note on the lab preset in force: its file and rules."""
    if preset is None:
        return ""
    rules = "".join(f"<li>{html.escape(r)}</li>" for r in preset.rules())
    return (
        f"<div class='nbtrain-preset' style='border-left:3px solid #6a1b9a;padding-left:8px'>"
        f"&#128274; <b>Lab preset</b> <code>{html.escape(str(preset.source))}</code>: greyed fields are "
        f"fixed by the course; a config outside these rules is refused."
        f"<ul style='margin:2px 0'>{rules}</ul></div>"
    )
