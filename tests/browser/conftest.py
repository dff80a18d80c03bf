"""JupyterLab in headless Debian chromium, driven with Playwright: the fixtures of the browser tests.

Needs /usr/bin/chromium (apt-get install chromium), the playwright and jupyterlab Python packages, and the
built extension (`make labext`). Outside `make test` a missing piece skips these tests; `make test` sets
NBTRAIN_REQUIRE_BROWSER=1, so there a missing piece fails them instead of passing silently. Never
`playwright install`: the system chromium is used (STACK-NOTES).
"""

from __future__ import annotations

import contextlib
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

CHROMIUM = Path("/usr/bin/chromium")
BUILT = ROOT / "nbtrain" / "labextension"
SHOTS = ROOT / "test-output" / "browser"
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


def missing() -> str | None:
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium (apt-get install chromium)"
    for mod in ("playwright", "jupyterlab"):
        try:
            __import__(mod)
        except ImportError:
            return f"the {mod} package is not installed (pip install -e '.[browser]')"
    if not (BUILT / "package.json").exists():
        return "the lab extension is not built (make labext)"
    return None


@pytest.fixture(autouse=True)
def _browser_prerequisites() -> None:
    why = missing()
    if why is None:
        return
    if os.environ.get("NBTRAIN_REQUIRE_BROWSER"):
        pytest.fail(f"the browser tests are required here (NBTRAIN_REQUIRE_BROWSER) but {why}")
    pytest.skip(why)


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    """Where a test saves its screenshots: test-output/browser/<test name>/ (or NBTRAIN_BROWSER_ARTIFACTS)."""
    root = Path(os.environ.get("NBTRAIN_BROWSER_ARTIFACTS", SHOTS))
    out = root / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    return out


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


def no_news_toast(lab_dir: Path) -> None:
    """No "get notified about Jupyter news?" toast over the pictures: the user setting of the lab started
    in ``lab_dir`` (the ``lab`` fixture's JUPYTER_CONFIG_DIR), read when the page loads."""
    news = (
        lab_dir
        / "jupyter_config/lab/user-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    )
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false"}')


def write_notebook(path: Path, cells: list[Any]) -> Path:
    """A Python 3 notebook at ``path``: each cell a source string (code) or an nbformat cell."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) if isinstance(c, str) else c for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@contextlib.contextmanager
def lab_page(lab: tuple[str, str], where: str, viewport: dict[str, int], **page: Any) -> Iterator[Any]:
    """(browser, page, errors): chromium on ``where`` of the JupyterLab of ``lab`` (e.g. "lab/tree/x.ipynb"),
    with every uncaught page error collected in ``errors``; the browser closes at the end."""
    from playwright.sync_api import sync_playwright

    url, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport=viewport, **page)
            errors: list[str] = []
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.goto(f"{url}/{where}?token={token}")
            yield browser, tab, errors
        finally:
            browser.close()
