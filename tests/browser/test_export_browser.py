"""The export form in a real JupyterLab (headless chromium): `%finetune export RUN` without --to opens it,
GGUF picked with two types, Export pressed, the job's progress in its status line, then the check's report
with the Ollama command. Screenshots in test-output/browser/<test>/ (NBTRAIN_UPDATE_SCREENSHOTS=1: also
docs/screenshots/export.png)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.browser.conftest import lab_page, write_notebook
from tests.browser.test_notebook_e2e import _kernel_idle
from tests.browser.test_panel_browser import DOCS
from tests.worker.test_export_gguf import llama_cpp_ready

pytestmark = pytest.mark.browser


def test_export_form_writes_gguf_files_and_shows_the_check(
    lab: tuple[str, str], workdir: Path, run_copy: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    llama_cpp_ready()
    url, token = lab
    write_notebook(workdir / "export.ipynb", ["%load_ext nbtrain", f"%finetune export {run_copy}"])
    with lab_page(lab, "lab/tree/export.ipynb", {"width": 1100, "height": 900}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")
        for i in range(2):
            cells.nth(i).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
        form = page.locator(".nbtrain-export")
        expect(form).to_be_visible(timeout=60_000)
        expect(form).to_contain_text("run tuned")
        to = form.locator("input[type='text']")
        expect(to).to_have_value("exports/tuned")
        q4 = form.locator("button", has_text="q4_k_m")
        expect(q4).to_be_hidden()  # the types show for GGUF only
        form.locator("button", has_text="GGUF").click()
        expect(to).to_have_value("exports/tuned-gguf")
        expect(q4).to_be_visible()
        q4.click()  # f16, q8_0 and q4_k_m are picked to begin with: leave two
        page.wait_for_timeout(300)
        form.screenshot(path=str(shots / "export-form.png"))

        form.locator("button", has_text="Export").click()
        status = form.locator(".nbtrain-export-status")
        expect(status).to_contain_text("exporting run", timeout=10_000)
        report = form.locator(".nbtrain-export-report")
        expect(report).to_contain_text("ollama create", timeout=300_000)
        assert report.locator("tr").count() == 3  # the header, f16, q8_0
        expect(status).to_contain_text("exported (gguf")
        assert form.locator(".nbtrain-export-error").count() == 0
        page.wait_for_timeout(300)
        form.screenshot(path=str(shots / "export-done.png"))
    assert not errors, errors
    out = workdir / "exports" / "tuned-gguf"
    assert sorted(p.name for p in out.glob("*.gguf")) == ["tuned-f16.gguf", "tuned-q8_0.gguf"]
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "export-done.png", DOCS / "export.png")
