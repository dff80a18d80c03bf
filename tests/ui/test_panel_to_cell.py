"""The panel's To cell over a real kernel's messages: with the lab extension answering on the
``nbtrain.cells`` comm target (labextension/src/tocell.ts speaks the other side; the browser test drives
the real one), the cell's text goes to the frontend at once; with no answer, IPython's set_next_input
carries it in the next execute reply, and the panel says it will come then."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CONFIG = "model: ./tiny-llama\ndata: {train: data/add.jsonl}\ntrain: {max_steps: 2}\n"


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Any]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc: Any, code: str, **expressions: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; its execute reply and the comm messages the kernel sent meanwhile."""
    msg_id = kc.execute(code, user_expressions=expressions)
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    comms, errors = [], []
    while True:  # iopub until this execution's idle status
        try:
            msg = kc.get_iopub_msg(timeout=60)
        except queue.Empty:
            break
        kind = msg["msg_type"]
        if kind in ("comm_open", "comm_msg", "comm_close"):
            comms.append(msg)
        elif kind == "error":
            errors.append("\n".join(msg["content"]["traceback"]))
        elif (
            kind == "status"
            and msg["parent_header"].get("msg_id") == msg_id
            and msg["content"]["execution_state"] == "idle"
        ):
            break
    assert reply["content"]["status"] == "ok", errors
    return reply, comms


def cells_comms(comms: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [
        m
        for m in comms
        if m["msg_type"] == "comm_open"
        and m["content"]["target_name"] == "nbtrain.cells"
        and m["content"]["data"].get("action") == action
    ]


def send(kc: Any, kind: str, comm_id: str, data: dict[str, Any]) -> None:
    """What a frontend sends on a comm (comm_msg / comm_close on the shell channel)."""
    kc.shell_channel.send(kc.session.msg(kind, {"comm_id": comm_id, "data": data}))


def click(kc: Any, button: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Press a button as a browser does: a click event on its widget's comm, handled while the kernel is
    idle, outside any cell. The reply of the next cell run, and the comm messages sent until then."""
    reply, _ = run(kc, "", model_id=f"{button}.model_id")
    model_id = reply["content"]["user_expressions"]["model_id"]["data"]["text/plain"].strip("'")
    send(kc, "comm_msg", model_id, {"method": "custom", "content": {"event": "click"}})
    return run(kc, "pass")


def test_to_cell_sends_the_cell_to_the_extension_at_once_when_it_answered(kernel: Any) -> None:
    _, comms = run(kernel, f"from nbtrain.ui.panel import ConfigPanel\np = ConfigPanel({CONFIG!r})")
    (hello,) = cells_comms(comms, "hello")
    panel_class = hello["content"]["data"]["panel"]
    assert panel_class.startswith("nbtrain-panel-")
    send(kernel, "comm_msg", hello["content"]["comm_id"], {"ready": True})  # the extension is here

    reply, comms = click(kernel, "p.to_cell_button")
    (insert,) = cells_comms(comms, "insert")
    data = insert["content"]["data"]
    assert data["panel"] == panel_class  # the frontend inserts below the cell that shows this panel
    assert data["source"].startswith("%%finetune\n")
    assert yaml.safe_load(data["source"].split("\n", 1)[1]) == yaml.safe_load(CONFIG)
    assert not reply["content"].get("payload")  # no set_next_input waiting for the next cell
    run(kernel, "assert p.status_message.startswith('inserting'), p.status_message")

    comm_id = insert["content"]["comm_id"]
    send(kernel, "comm_msg", comm_id, {"inserted": 3})
    send(kernel, "comm_close", comm_id, {})
    run(kernel, "assert 'below the panel: run it' in p.status_message, p.status_message")
    # the cell's magic exists in this kernel now (To cell loaded the extension)
    run(kernel, "assert 'finetune' in get_ipython().magics_manager.magics['cell']")


def test_to_cell_without_an_answer_comes_with_the_next_cells_reply(kernel: Any) -> None:
    _, comms = run(kernel, f"from nbtrain.ui.panel import ConfigPanel\np = ConfigPanel({CONFIG!r})")
    assert len(cells_comms(comms, "hello")) == 1  # nobody answers: no extension in this frontend
    reply, comms = click(kernel, "p.to_cell_button")
    assert cells_comms(comms, "insert") == []
    (payload,) = reply["content"]["payload"]  # set_next_input rides on the next cell's reply
    assert payload["source"] == "set_next_input" and payload["text"].startswith("%%finetune\n")
    run(kernel, "assert 'follows the next cell you run' in p.status_message, p.status_message")
