"""The panel's To cell: a ``%%finetune`` cell with the form's config inserted below the panel.

In JupyterLab and Notebook 7 the lab extension inserts the cell at once (labextension/src/tocell.ts): the
panel says hello on a comm when it is made, and once the extension has answered, To cell sends the cell's
text on a new comm. Elsewhere (no extension, another frontend) IPython's set_next_input is what there is,
and a notebook applies that only when the next cell runs: the panel says so."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

import ipywidgets as widgets

from nbtrain.contract.errors import NbtrainError

# The comm target of the lab extension's "insert a cell" (labextension/src/tocell.ts).
CELLS_TARGET: Final = "nbtrain.cells"


class ToCell:
    """The To cell button of the panel whose DOM class is ``dom_class``, inserting ``source()`` (YAML)."""

    def __init__(
        self,
        dom_class: str,
        source: Callable[[], str],
        report: Callable[[str | None, str | None], None],
        magic: Callable[[], str] = lambda: "%%finetune",
    ) -> None:
        self.dom_class = dom_class
        self._source = source
        self._magic = magic  # the cell's first line: %%finetune, and its options (--estimate --on SPEC)
        self._report = report  # (error, status): the panel's error line (None clears it) and status line
        self._frontend = False  # the lab extension answered: To cell inserts the cell through it
        self.button = widgets.Button(
            description="To cell", icon="clipboard", tooltip="insert a %%finetune cell with this config"
        )
        self._hello: Any = None

    def hello(self) -> None:
        """Say hello to the lab extension; its answer makes To cell insert the cell through it."""
        self._hello = self._open_comm({"action": "hello", "panel": self.dom_class}, self._on_hello)

    def close(self) -> None:
        if self._hello is not None:
            with contextlib.suppress(Exception):
                self._hello.close()

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

    def click(self) -> None:
        # the first time it loads the magics (a few seconds on a cold kernel): the button says it is busy
        button = self.button
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
        source = self._magic() + "\n" + self._source()
        if self._frontend:
            self._open_comm(
                {"action": "insert", "panel": self.dom_class, "source": source}, self._on_inserted
            )
            self._report(None, "inserting a %%finetune cell below the panel…")
            return
        shell.set_next_input(source, replace=False)
        # Jupyter delivers this with the reply of the next executed cell; say so, or it looks lost.
        self._report(
            None,
            "a new %%finetune cell with this config follows the next cell you run (the nbtrain "
            "JupyterLab extension, which inserts it at once, is not active in this frontend)",
        )

    def _on_inserted(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data", {})
        if "inserted" in data:
            self._report(None, "a %%finetune cell with this config is below the panel: run it to start")
        else:
            self._report(f"the notebook could not insert the cell: {data.get('error', data)}", None)
