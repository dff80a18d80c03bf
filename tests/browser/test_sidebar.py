"""The lab extension in a real JupyterLab, driven through headless Debian chromium with Playwright.

Needs /usr/bin/chromium (apt-get install chromium), the playwright and jupyterlab Python packages, and the
built extension (`make labext`); skipped otherwise. `make browser-test` runs it. Never `playwright
install`: the system chromium is used (STACK-NOTES).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.server.fakes import make_run

CHROMIUM = Path("/usr/bin/chromium")
BUILT = ROOT / "nbtrain" / "labextension"
# Without the background-networking flags chromium keeps dialling out, and this machine refuses it.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium (apt-get install chromium)"
    for mod in ("playwright", "jupyterlab"):
        try:
            __import__(mod)
        except ImportError:
            return f"the {mod} package is not installed"
    if not (BUILT / "package.json").exists():
        return "the lab extension is not built (make labext)"
    return None


pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A JupyterLab with the server extension enabled by the shipped config file and the built lab
    extension found through JUPYTER_PATH (no install into the venv needed)."""
    jpath = tmp_path / "jupyter_path"
    (jpath / "labextensions").mkdir(parents=True)
    (jpath / "labextensions" / "nbtrain").symlink_to(BUILT)
    token = secrets.token_hex(16)
    port = _free_port()
    env = {
        **os.environ,
        "JUPYTER_PATH": str(jpath),
        "JUPYTER_CONFIG_PATH": str(ROOT / "jupyter-config"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter_config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter_runtime"),
    }
    log = open(tmp_path / "lab.log", "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/nbtrain/runs?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text())
            time.sleep(0.3)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_sidebar_lists_a_run_and_stops_it(lab: tuple[str, str], tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, token = lab
    make_run("20250101-000000-demo-abcd", state="running", step=4, losses=(2.0, 1.5, 1.25))
    make_run("20250101-000001-done-beef", state="completed", step=10, losses=(0.5,))
    shots = Path(os.environ.get("NBTRAIN_BROWSER_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)

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
