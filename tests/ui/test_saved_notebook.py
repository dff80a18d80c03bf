"""A notebook saved after its run ended, with the kernel still alive, holds the run's final state.

The frontend here is a real kernel driven by jupyter_client and routes messages as JupyterLab 4 does
(``@jupyterlab/outputarea``): a message goes to the cell whose execute request is its parent, and an
``update_display_data`` changes only outputs of that cell that hold its display id. (nbclient maps
display ids over the whole notebook, so it did not see that a record updated from a thread or from a
later cell never reached the cell that showed it, the record saved as "queued at step 0".)
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel

from tests.conftest import lora_yaml

pytestmark = pytest.mark.slow
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
RECORD_MIME = "application/vnd.nbtrain.run+json"


class LabLikeFrontend:
    """Cells and their outputs, filled from the kernel's iopub messages with JupyterLab's routing."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.cells: list[tuple[str, list[dict[str, Any]]]] = []
        self._by_msg: dict[str, int] = {}

    def run(self, code: str, timeout: float = 300) -> None:
        msg_id = self.kc.execute(code)
        self._by_msg[msg_id] = len(self.cells)
        self.cells.append((code, []))
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            self._route(msg)
            done = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
            if done and msg["parent_header"].get("msg_id") == msg_id:
                return

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                self._route(self.kc.get_iopub_msg(timeout=left))
            except queue.Empty:
                return

    def _route(self, msg: dict[str, Any]) -> None:
        cell = self._by_msg.get(msg["parent_header"].get("msg_id", ""))
        if cell is None:
            return
        outputs = self.cells[cell][1]
        kind, content = msg["msg_type"], msg["content"]
        display_id = content.get("transient", {}).get("display_id")
        if kind in ("display_data", "execute_result"):
            outputs.append({"output_type": kind, "data": content["data"], "display_id": display_id})
        elif kind == "stream":
            outputs.append({"output_type": "stream", "name": content["name"], "text": content["text"]})
        elif kind == "error":
            outputs.append({"output_type": "error", "ename": content["ename"], "evalue": content["evalue"]})
        elif kind == "update_display_data":
            for out in outputs:
                if out.get("display_id") == display_id:
                    out["data"] = content["data"]

    def notebook(self) -> Any:
        nb = nbformat.v4.new_notebook()
        for i, (code, outputs) in enumerate(self.cells):
            cell = nbformat.v4.new_code_cell(code)
            for out in outputs:
                if out["output_type"] == "display_data":
                    cell.outputs.append(nbformat.v4.new_output("display_data", data=out["data"]))
                elif out["output_type"] == "execute_result":
                    cell.outputs.append(
                        nbformat.v4.new_output("execute_result", data=out["data"], execution_count=i + 1)
                    )
                elif out["output_type"] == "stream":
                    cell.outputs.append(nbformat.v4.new_output("stream", name=out["name"], text=out["text"]))
            nb.cells.append(cell)
        return nb


def test_notebook_saved_after_the_run_holds_the_final_figure_and_completed_record(workdir: Path) -> None:
    steps = 6
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(workdir))
    try:
        lab = LabLikeFrontend(kc)
        lab.run("%load_ext nbtrain")
        lab.run("%%finetune --name saved\n" + lora_yaml(steps))
        lab.run("1 + 1")  # a later cell: from here on ipykernel stamps the threads' messages with it
        # the run ends while this cell runs: the dashboard and the record are finished from here
        lab.run("%finetune wait saved")
        lab.drain(2.0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    errors = [o for _, outs in lab.cells for o in outs if o["output_type"] == "error"]
    assert not errors, errors
    path = workdir / "saved.ipynb"
    nbformat.write(lab.notebook(), path)
    saved = nbformat.read(path, as_version=4)

    outputs = [o for o in saved.cells[1].outputs if o["output_type"] == "display_data"]
    every = [o for c in saved.cells for o in c.outputs if "data" in o]
    assert not any(WIDGET_MIME in o["data"] for o in every)  # nothing that reopens as 'model not found'
    figures = [o["data"][PLOTLY_MIME] for o in outputs if PLOTLY_MIME in o["data"]]
    assert len(figures) == 1, [list(o["data"]) for o in outputs]  # the mid-run snapshot is gone
    assert "completed" in figures[0]["layout"]["title"]["text"]
    # the snapshot and the guard are emptied: no style left that hides an output of the saved notebook
    rest = [o for o in outputs if PLOTLY_MIME not in o["data"] and RECORD_MIME not in o["data"]]
    assert len(rest) == 2 and all(o["data"].get("text/html") == "" for o in rest), rest
    (record,) = [o["data"] for o in outputs if RECORD_MIME in o["data"]]
    assert record[RECORD_MIME]["state"] == "completed"
    assert record[RECORD_MIME]["step"] == steps
    assert f"completed at step {steps}/{steps}" in record["text/plain"]
