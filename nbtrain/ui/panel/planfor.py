"""The panel's "Plan for" choice: which hardware the plan and estimate under the form are made for.

- this machine (the default): the machine the notebook sits on, as a ``%%finetune`` cell plans;
- a SLURM partition: the config's ``distributed: slurm: partition:`` (the job is planned for the
  partition's nodes, ``control/plan/target.py``); the choice writes that key, keeping the rest of a loaded
  ``slurm:`` section, and the problems of reading the partition show under its box;
- named hardware ("8xA100-40GB", ``hardware/named.py``): a what-if, ``prepare(..., on=spec)``; the spec
  is read by ``named.parse`` as it is typed (its message shows inline), the config is left as it is,
  Launch is off (a run starts on the machine it runs on) and To cell writes ``--estimate --on SPEC``.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Callable
from typing import Any, Final

import ipywidgets as widgets

from nbtrain.hardware.named import Target, parse
from nbtrain.ui.panel.style import ERROR_STYLE, FIELD_WIDTH, LABEL_WIDTH

HERE: Final = "here"
SLURM: Final = "slurm"
NAMED: Final = "named"
CHOICES: Final = (
    ("this machine (default)", HERE),
    ("a SLURM partition", SLURM),
    ("named hardware: estimate only", NAMED),
)
# The common machines of the card table (hardware/named.CARDS), offered in the hardware box; any spec
# named.parse reads may be typed.
COMMON: Final = (
    "1xT4", "1xL4", "1xA10G", "1x4090", "1xA100-40GB", "1xA100-80GB", "8xA100-40GB", "8xA100-80GB",
    "1xH100-80GB", "8xH100-80GB", "2x8xH100-80GB", "1xH200", "8xMI300X", "M3-MAX-64GB", "cpu-16",
)  # fmt: skip


def short_words(t: Target) -> str:
    """What a target is, in a few words: "8 x A100-40GB", "2 nodes x 8 x H100-80GB", "Apple M3 Max"."""
    nodes = f"{t.nodes} nodes x " if t.nodes > 1 else ""
    if t.card is not None:
        return f"{nodes}{t.per_node} x {t.card.key}"
    if t.apple is not None:
        return f"{t.apple.name} ({t.ram_gib} GiB)"
    return f"{nodes}a {t.cpus}-core CPU machine"


def _label(text: str, title: str) -> Any:
    return widgets.HTML(
        f"<label class='nbtrain-label' title='{html.escape(title)}'>{html.escape(text)}</label>",
        layout=widgets.Layout(width=f"{LABEL_WIDTH}px", margin="0"),
    )


class PlanFor:
    """The choice, its partition or hardware box and its inline error; ``changed()`` is called on each edit
    (the panel re-checks the form)."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self._changed = changed
        self._filling = False
        self._slurm_problems: list[str] = []
        width = widgets.Layout(width=FIELD_WIDTH)
        self.choice = widgets.Dropdown(
            options=list(CHOICES), value=HERE, layout=width,
            tooltip="which hardware the plan and memory estimate below are made for",
        )  # fmt: skip
        self.partition = widgets.Text(
            value="", placeholder="the default partition", layout=widgets.Layout(width=FIELD_WIDTH),
            tooltip="distributed.slurm.partition: the SLURM partition the job goes to; it is planned for "
            "that partition's nodes (read with scontrol)",
        )  # fmt: skip
        self.hardware = widgets.Combobox(
            value="", options=list(COMMON), ensure_option=False, placeholder="e.g. 8xA100-40GB",
            layout=widgets.Layout(width=FIELD_WIDTH),
            tooltip="[NODES x][CARDS x]CARD, an Apple Mac (M3-MAX-64GB) or cpu-N: the plan and estimate "
            "for that hardware; a run still starts on the machine it runs on",
        )  # fmt: skip
        self.error_label = widgets.HTML("")
        self.note = widgets.HTML("")  # under the buttons: why Launch is off
        self._partition_row = widgets.HBox(
            [_label("Partition", "distributed.slurm.partition"), self.partition],
            layout=widgets.Layout(align_items="center"),
        )
        self._hardware_row = widgets.HBox(
            [_label("Hardware", "the hardware to plan for (nbtrain.hardware.named)"), self.hardware],
            layout=widgets.Layout(align_items="center"),
        )
        line = widgets.HBox(
            [_label("Plan for", "which hardware the plan and estimate are made for"), self.choice],
            layout=widgets.Layout(align_items="center"),
        )
        self.widget = widgets.VBox([line, self._partition_row, self._hardware_row, self.error_label])
        for w in (self.choice, self.partition, self.hardware):
            w.observe(self._edited, names="value")
        self._show()

    # ---------------------------------------------------------------------------------- state
    @property
    def target(self) -> Target | None:
        """The named hardware chosen, read by named.parse; None for the other choices or a bad spec."""
        if self.choice.value != NAMED:
            return None
        try:
            return parse(self.hardware.value)
        except ValueError:
            return None

    @property
    def on(self) -> str | None:
        """``prepare``'s ``on=``: the named spec when it parses."""
        return self.hardware.value.strip() if self.target is not None else None

    @property
    def spec_error(self) -> str:
        """named.parse's message for the spec typed ("" when it parses, or nothing is typed yet)."""
        if self.choice.value != NAMED or not self.hardware.value.strip():
            return ""
        try:
            parse(self.hardware.value)
        except ValueError as e:
            return str(e)
        return ""

    @property
    def error(self) -> str:
        """What shows under the choice: the spec's problem, or the SLURM section's."""
        if self.choice.value == NAMED:
            return self.spec_error
        return "\n".join(self._slurm_problems) if self.choice.value == SLURM else ""

    def launch_refusal(self) -> str | None:
        """Why Launch is off for this choice (named hardware: the plan is an estimate only), or None."""
        if self.choice.value != NAMED:
            return None
        t = self.target
        if t is None:
            return "name the hardware to plan for (e.g. 8xA100-40GB); Launch starts runs on this machine"
        return (
            f"planned for {short_words(t)}: the estimate only; runs start where they run — use a SLURM "
            "partition or this machine to launch"
        )

    def magic_line(self) -> str:
        """To cell's first line: ``%%finetune``, with ``--estimate --on SPEC`` for named hardware."""
        on = self.on
        return f"%%finetune --estimate --on {shlex.quote(on)}" if on else "%%finetune"

    # --------------------------------------------------------------------------- config <-> it
    def section(self, extra: dict[Any, Any]) -> dict[Any, Any]:
        """The keys the form has no field for (``extra``, a copy) with ``distributed: slurm:`` as the choice
        says: present with the partition typed for a SLURM partition, left out otherwise (the panel keeps
        a loaded section, so choosing the partition again brings it back)."""
        dist = extra.get("distributed")
        slurm = dist.get("slurm") if isinstance(dist, dict) else None
        if self.choice.value == SLURM:
            if not isinstance(dist, dict):
                if dist is not None:
                    return extra  # not a mapping: the validator says so on the YAML as written
                dist = extra["distributed"] = {}
            if slurm is None:
                slurm = dist["slurm"] = {}
            if isinstance(slurm, dict):
                name = self.partition.value.strip()
                if name:
                    slurm["partition"] = name
                else:
                    slurm.pop("partition", None)
        elif isinstance(dist, dict) and "slurm" in dist:
            del dist["slurm"]
            if not dist:
                del extra["distributed"]
        return extra

    def load(self, raw: dict[Any, Any]) -> None:
        """A config put in the form: ``distributed: slurm:`` chooses the partition (its name in the box);
        without it a SLURM choice goes back to this machine, named hardware stays chosen."""
        dist = raw.get("distributed")
        slurm = dist.get("slurm") if isinstance(dist, dict) else None
        self._filling = True
        try:
            if slurm is not None:
                self.choice.value = SLURM
                part = slurm.get("partition") if isinstance(slurm, dict) else None
                self.partition.value = "" if part is None else str(part)
            elif self.choice.value == SLURM:
                self.choice.value = HERE
                self.partition.value = ""
        finally:
            self._filling = False
        self._show()

    def slurm_problems(self, messages: list[str]) -> None:
        """The problems the last check found in ``distributed: slurm:`` (its partition not readable, ...)."""
        self._slurm_problems = messages
        self._show_error()

    # ----------------------------------------------------------------------------------- view
    def _edited(self, _change: dict[str, Any]) -> None:
        self._show()
        if not self._filling:
            self._changed()

    def _show(self) -> None:
        chosen = self.choice.value
        self._partition_row.layout.display = "" if chosen == SLURM else "none"
        self._hardware_row.layout.display = "" if chosen == NAMED else "none"
        self._show_error()
        refusal = self.launch_refusal()
        note = (
            f"<div class='nbtrain-status nbtrain-launch-off'>{html.escape(refusal)}</div>" if refusal else ""
        )
        if self.note.value != note:
            self.note.value = note

    def _show_error(self) -> None:
        msg = self.error
        value = f"<div style='{ERROR_STYLE};white-space:pre-wrap'>{html.escape(msg)}</div>" if msg else ""
        if self.error_label.value != value:
            self.error_label.value = value
        box = self.hardware if self.choice.value == NAMED else self.partition
        for w in (self.hardware, self.partition):
            if msg and w is box:
                w.add_class("nbtrain-invalid")
            else:
                w.remove_class("nbtrain-invalid")
