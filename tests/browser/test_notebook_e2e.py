"""The whole JupyterLab path in headless chromium: a %%finetune cell (highlighted as YAML, with key
completion) trains the tiny model, the Plotly dashboard draws its loss, the sidebar shows the run's
progress, "Open dashboard" attaches a second view, and Stop stops the run."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

import nbtrain
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import lora_yaml

pytestmark = pytest.mark.browser

CELL = "%%finetune --name e2e\n" + lora_yaml(100_000).replace(
    "  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000"
)
# How many data points the loss trace of a Plotly figure on the page holds (its gd.data, set by plotly.js).
LOSS_POINTS_JS = """() => Math.max(0, ...[...document.querySelectorAll('.js-plotly-plot')].map(gd =>
    (gd.data || []).filter(t => t.name === 'loss')
        .map(t => (t.y || []).length).reduce((a, b) => a + b, 0)))"""


def _kernel_idle(url: str, token: str, timeout: float = 90.0) -> None:
    """Wait for the notebook's kernel to exist and be idle (the toolbar's indicator shows "idle" before a
    kernel exists, STACK-NOTES)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=5) as r:
                kernels: list[dict[str, Any]] = json.loads(r.read())
            if kernels and all(
                k["execution_state"] == "idle" and k.get("connections", 0) > 0 for k in kernels
            ):
                return
        except OSError:
            pass  # the server answers 500 while the kernel is starting
        time.sleep(0.5)
    raise AssertionError("the notebook's kernel never became idle")


@pytest.fixture
def stop_runs_after(workdir: Path) -> Iterator[None]:
    """Runs are detached and outlive the kernel by design: stop whatever a failed test left running."""
    yield
    for run in nbtrain.runs():
        if not run.status().done:
            run.stop(timeout=30)


def test_finetune_cell_dashboard_sidebar_and_stop(
    lab: tuple[str, str], workdir: Path, shots: Path, stop_runs_after: None
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, token = lab
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbtrain"), nbformat.v4.new_code_cell(CELL)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, workdir / "e2e.ipynb")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/lab/tree/e2e.ipynb?token={token}")
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)

        # YAML highlighting: CodeMirror runs the YAML language on the %%finetune cell, not on the other.
        finetune_editor = cells.nth(1).locator(".cm-content")
        expect(finetune_editor).to_have_attribute("data-language", "yaml", timeout=20_000)
        assert cells.nth(0).locator(".cm-content").get_attribute("data-language") != "yaml"
        page.screenshot(path=str(shots / "yaml-cell.png"))

        # Run both cells (Shift+Enter runs one and moves to the next).
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function(f"({LOSS_POINTS_JS})() >= 3", timeout=90_000)
        except Exception:
            page.screenshot(path=str(shots / "no-dashboard.png"))
            raise
        page.screenshot(path=str(shots / "dashboard.png"))

        # The sidebar: the run, running, with progress, last loss and a sparkline.
        page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click()
        row = page.locator(".nbtrain-run", has=page.locator(".nbtrain-run-name", has_text="e2e"))
        expect(row.locator(".nbtrain-state")).to_have_text("running", timeout=30_000)
        expect(row.locator(".nbtrain-steps")).to_have_text(re.compile(r"step \d+/100000"))
        expect(row.locator(".nbtrain-loss")).to_have_text(re.compile(r"loss \d+\.\d{4}"))
        page.wait_for_function(
            "() => (document.querySelector('.nbtrain-run .nbtrain-spark path')"
            "?.getAttribute('d') || '').includes('L')",
            timeout=30_000,
        )
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 1 active run")
        page.screenshot(path=str(shots / "sidebar-running.png"))

        # "Open dashboard" inserts `%finetune attach RUN` below the active cell and runs it: a second view.
        plots_before = page.locator(".js-plotly-plot").count()
        cells_before = cells.count()
        row.locator(".nbtrain-open").click()
        expect(cells).to_have_count(cells_before + 1, timeout=20_000)
        attach = cells.locator(".cm-content", has_text="%finetune attach ")
        expect(attach).to_have_count(1)
        expect(page.locator(".js-plotly-plot")).to_have_count(plots_before + 1, timeout=60_000)
        page.screenshot(path=str(shots / "attached.png"))

        # Stop: the run saves a checkpoint and ends; the row and the status bar follow.
        row.locator(".nbtrain-stop").click()
        expect(row.locator(".nbtrain-state")).to_have_text("stopped", timeout=120_000)
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 0 active runs", timeout=10_000)
        page.screenshot(path=str(shots / "stopped.png"))

        # Key completion in a %%finetune cell: Tab offers config keys served from the validator's schema.
        attach.click()
        page.keyboard.press("Escape")
        page.keyboard.press("b")  # command mode: insert a cell below
        page.keyboard.press("Enter")  # edit it
        page.keyboard.type("%%finetune\nobjective: dpo\ntrain:\n  bet")
        page.keyboard.press("Tab")
        completer = page.locator(".jp-Completer")
        expect(completer).to_be_visible(timeout=20_000)
        expect(completer.locator(".jp-Completer-item", has_text="beta")).to_have_count(1)
        page.screenshot(path=str(shots / "completion.png"))
        browser.close()
    assert not errors, errors
    runs = list((workdir / "runs").iterdir())
    assert len(runs) == 1
    status = json.loads((runs[0] / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] >= 3
