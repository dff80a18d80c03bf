"""The sidebar and status bar in a real JupyterLab (headless chromium), on run directories written the way
a worker writes them: every state, progress, loss and its sparkline, ordering, Stop through the REST API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.server.fakes import make_run

pytestmark = pytest.mark.browser


def test_sidebar_lists_a_run_and_stops_it(lab: tuple[str, str], tmp_path: Path, shots: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, token = lab
    make_run("20250101-000000-demo-abcd", state="running", step=4, losses=(2.0, 1.5, 1.25))
    make_run("20250101-000001-done-beef", state="completed", step=10, losses=(0.5,))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/lab?token={token}")
        page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click(timeout=60_000)

        row = page.locator('.nbtrain-run[data-run-id="20250101-000000-demo-abcd"]')
        expect(row).to_be_visible(timeout=20_000)
        expect(row.locator(".nbtrain-state")).to_have_text("running")
        expect(row.locator(".nbtrain-steps")).to_have_text("step 4/10")
        expect(row.locator(".nbtrain-loss")).to_have_text("loss 1.2500")
        width = row.locator(".nbtrain-progress-bar").evaluate("e => e.style.width")
        assert float(width.rstrip("%")) == 40
        spark = row.locator(".nbtrain-spark path").get_attribute("d") or ""
        assert spark.startswith("M0.0 1.0") and spark.count("L") == 2  # three losses, highest first
        done = page.locator('.nbtrain-run[data-run-id="20250101-000001-done-beef"]')
        expect(done.locator(".nbtrain-stop")).to_be_disabled()
        # Newest run first.
        ids = page.locator(".nbtrain-run").evaluate_all("rows => rows.map(r => r.dataset.runId)")
        assert ids == ["20250101-000001-done-beef", "20250101-000000-demo-abcd"]
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 1 active run")
        page.screenshot(path=str(shots / "sidebar.png"))

        # Stop goes through ServerConnection, so it carries the XSRF header the server checks on POST.
        row.locator(".nbtrain-stop").click()
        expect(row.locator(".nbtrain-state")).to_have_text("stopped", timeout=20_000)
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 0 active runs")
        page.screenshot(path=str(shots / "sidebar-stopped.png"))
        browser.close()
    assert not errors, errors
    status: dict[str, Any] = json.loads(
        (tmp_path / "runs" / "20250101-000000-demo-abcd" / "status.json").read_text()
    )
    assert status["state"] == "stopped"
