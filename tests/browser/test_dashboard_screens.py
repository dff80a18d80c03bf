"""The dashboard as people see it, in a real JupyterLab (headless chromium): one short training run, shot
mid-run (live widget) and completed (the static figure it turns into). The screenshots are the ones in
docs/screenshots/, so they stay current; the checks are what a designer looked at: the phase shown before
the first step, axis titles on every panel, the same figure size live and static, no stale repr.

NBTRAIN_UPDATE_SCREENSHOTS=1 writes the two pictures to docs/screenshots/ (otherwise they go to the test's
artifacts folder only, so a test run never dirties the working tree)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.browser.conftest import lab_page, no_news_toast, write_notebook
from tests.browser.test_notebook_e2e import LOSS_POINTS_JS, _kernel_idle
from tests.conftest import ROOT, lora_yaml

pytestmark = pytest.mark.browser

DOCS = ROOT / "docs" / "screenshots"
STEPS = 400  # long enough to see it live (warm, on an idle machine: ~30 steps/s)
# What the frame says before the first step, whichever moment the browser first draws it.
PHASES = re.compile(
    r"queued|starting the training process|loading model|tokenising|waiting for the first logged step"
)
# 20,000 rows: tokenising them takes the run a few seconds before its first step, long enough to see the
# frame say so (400 rows went by in a blink once the run had its cores to itself)
CELL = "%%finetune --name tiny-lora\n" + lora_yaml(STEPS).replace(
    "  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000"
).replace("data/add.jsonl", "data/many.jsonl")
# The size of each Plotly figure among the elements given (those plotly.js drew in), and its axis titles.
PLOTS_JS = """els => els.filter(gd => gd._fullLayout).map(gd => {
    const r = gd.getBoundingClientRect();
    const titles = re => [...gd.querySelectorAll('text')].filter(t => re.test(t.getAttribute('class')))
        .map(t => t.textContent);
    return {w: Math.round(r.width), h: Math.round(r.height),
            xtitles: titles(/^x\\d*title$/), ytitles: titles(/^y\\d*title$/),
            title: (gd.querySelector('.gtitle') || {}).textContent || ''};
})"""


# How many output children of a cell show a view of the run: a drawn Plotly figure (displayed, its SVG with
# a height), or the lab extension's view that follows the run without a kernel (runview.ts).
SHOWN_VIEWS_JS = """els => els.filter(c => c.offsetHeight > 0
    && ([...c.querySelectorAll('.js-plotly-plot .main-svg')].some(s => s.getBoundingClientRect().height > 0)
        || [...c.querySelectorAll('.nbtrain-run-view')].some(v => v.offsetHeight > 0)))
    .length"""


def expect_soon(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.25)


def test_dashboard_mid_run_and_completed(
    lab: tuple[str, str], workdir: Path, tmp_path: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    from nbtrain.examples import write_dataset

    url, token = lab
    no_news_toast(tmp_path)
    write_dataset(workdir / "data" / "many.jsonl", n=20_000)
    write_notebook(workdir / "shots.ipynb", ["%load_ext nbtrain", CELL])

    with lab_page(lab, "lab/tree/shots.ipynb", {"width": 1200, "height": 1100}) as (browser, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)
        # the file browser closed: the notebook, and so the dashboard, as wide as the window allows
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        output = cells.nth(1).locator(".jp-Cell-outputWrapper")
        dashboard = output.locator(".jp-OutputArea-child").first  # the pictures: the dashboard's output

        # Before the first step the frame says what the run is doing, not an empty chart: the widget's frame
        # (if it draws before the first step) and the view that stands in for it until it draws.
        try:
            phase = output.locator(".nbtrain-run-view .nbtrain-page-steps", has_text=PHASES)
            expect(phase).to_have_count(1, timeout=60_000)
        except AssertionError:
            page.screenshot(path=str(shots / "no-phase.png"))
            raise

        page.screenshot(path=str(shots / "phase.png"))
        page.wait_for_function(f"({LOSS_POINTS_JS})() >= 20", timeout=120_000)
        page.wait_for_timeout(600)  # let the widget draw its last update
        # while live the cell also holds the static snapshot a saved notebook shows, hidden under the widget
        live = output.locator(".js-plotly-plot >> visible=true").evaluate_all(PLOTS_JS)
        assert "running" in live[0]["title"], live  # still the live widget
        dashboard.scroll_into_view_if_needed()
        dashboard.screenshot(path=str(shots / "dashboard-live.png"))

        # Saved now, mid-run, and opened where the run's kernel is not (a fresh kernel, without its widget
        # models): the snapshot shows, not "Error displaying widget: model not found".
        # (this save's file, not an earlier autosave of the starting frame: JupyterLab autosaves every 2 min)
        saved, deadline = workdir / "shots.ipynb", time.monotonic() + 30
        before = saved.stat().st_mtime_ns
        page.keyboard.press("Control+s")
        while saved.stat().st_mtime_ns == before or "application/vnd.plotly.v1+json" not in saved.read_text():
            assert time.monotonic() < deadline, "the notebook was not saved"
            time.sleep(0.2)
        shutil.copyfile(saved, workdir / "reopened.ipynb")
        other = browser.new_page(viewport={"width": 1200, "height": 1100})
        other.on("pageerror", lambda e: errors.append(str(e)))
        other.goto(f"{url}/lab/tree/reopened.ipynb?token={token}")
        # the workspace opens shots.ipynb too, in a hidden tab: the cells of the notebook in view
        shown_nb = other.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        reopened = shown_nb.nth(1).locator(".jp-Cell-outputWrapper")
        # one view shows: the snapshot's view that follows the run without a kernel, or the widget restored
        # from the widget state JupyterLab saved with the notebook; never both, never the widget's error
        children = reopened.locator(".jp-OutputArea-child")
        _kernel_idle(url, token)  # its own kernel now: the widget manager has looked for the models
        try:  # (it draws the restored widget once the kernel is connected)
            expect_soon(lambda: children.evaluate_all(SHOWN_VIEWS_JS) == 1, 60)
        except AssertionError:
            other.screenshot(path=str(shots / "reopened-not-one-figure.png"))
            raise
        shown = reopened.inner_text()
        other.screenshot(path=str(shots / "reopened-mid-run.png"))
        assert "model not found" not in shown and "Error displaying" not in shown, shown
        other.close()

        done_title = output.locator(".js-plotly-plot .gtitle", has_text="completed")
        expect(done_title).to_have_count(1, timeout=180_000)
        # and once it is the final figure, the snapshot is emptied: one figure in the cell
        expect(output.locator(".js-plotly-plot")).to_have_count(1, timeout=10_000)
        page.wait_for_timeout(600)
        done = output.locator(".js-plotly-plot").evaluate_all(PLOTS_JS)
        dashboard.screenshot(path=str(shots / "dashboard-done.png"))
        # the loss panel's controls: log scale, the smoothed curve over the faint raw one
        plot = output.locator(".js-plotly-plot")
        plot.locator(".updatemenu-button", has_text="log").click()
        plot.locator(".updatemenu-button", has_text="smoothed").click()
        page.wait_for_timeout(500)
        state = plot.evaluate("gd => [gd.layout.yaxis.type, gd.data[1].visible, gd.data[0].opacity]")
        assert state == ["log", True, 0.3], state
        dashboard.screenshot(path=str(shots / "dashboard-log-smoothed.png"))
        text = output.inner_text()
        (shots / "done-output.html").write_text(output.inner_html())

    assert not errors, errors
    assert len(live) == len(done) == 1, (live, done)  # one figure: the widget turned static, not added to
    (lv,), (dn,) = live, done
    # the figure does not jump when it turns static
    assert (lv["w"], lv["h"]) == (dn["w"], dn["h"]), (lv, dn)
    for fig in (lv, dn):
        assert fig["xtitles"].count("step") == 5, fig  # every panel, one x quantity
        assert {"loss", "learning rate", "tokens/s", "GiB"} <= {t.split(" (")[0] for t in fig["ytitles"]}
    assert "starting (step 0)" not in text and "queued" not in text
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        for name in ("dashboard-live.png", "dashboard-done.png"):
            shutil.copyfile(shots / name, DOCS / name)
