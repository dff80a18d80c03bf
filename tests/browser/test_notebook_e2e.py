"""The whole JupyterLab path in headless chromium: a %%finetune cell (highlighted as YAML, with key
completion) trains the tiny model, the Plotly dashboard draws its loss, the sidebar shows the run's
progress, Kernel > Restart turns the cell's widget into the live view without a kernel (never the widget
frozen as it was), "Open dashboard" attaches a view after the restart, Stop stops the run and Resume in the
sidebar continues it."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from tests.browser.conftest import lab_page, write_notebook
from tests.conftest import lora_yaml

pytestmark = pytest.mark.browser

CELL = "%%finetune --name e2e\n" + lora_yaml(100_000).replace(
    "  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000"
)
# How many data points the loss trace of a Plotly figure on the page holds (its gd.data, set by plotly.js).
LOSS_POINTS_JS = """() => Math.max(0, ...[...document.querySelectorAll('.js-plotly-plot')].map(gd =>
    (gd.data || []).filter(t => t.name === 'loss')
        .map(t => (t.y || []).length).reduce((a, b) => a + b, 0)))"""

# Whether the sidebar's card of run `id` shows a step past `at`.
STEP_PAST_JS = """([id, at]) => {
    const s = document.querySelector(`.nbtrain-run[data-run-id='${id}'] .nbtrain-steps`);
    return !!s && Number(((s.textContent.match(/step ([\\d,]+)/) || [])[1] || '').replace(/,/g, '')) > at;
}"""


# The first step a figure's title on the page shows ("... step 19/100000 ...").
def step_in(text: str | None) -> int:
    """The step a view's title shows ("... step 1,401/100,000 ..."; the title groups thousands), or -1."""
    return int((re.findall(r"step ([\d,]+)", text or "") or ["-1"])[0].replace(",", ""))


def title_step(title: Any) -> int:
    return step_in(title.text_content())


def restart_kernel(page: Any) -> None:
    """Kernel > Restart Kernel… and Restart in its dialog, as a user does it (the frontend's own restart:
    what the notebook's widgets see)."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
    page.locator(".jp-Dialog-button.jp-mod-accept", has_text="Restart").click()


def _nudge(runtime: Path, kernel_id: str) -> bool:
    """Run an empty, silent cell over the kernel's own connection file: the busy/idle statuses it publishes
    answer an execute_request, a message type the server tracks, so its activity record follows them (a
    kernel_info_request's statuses are untracked: the server only moves "starting" to idle on them, never
    "busy"). Whether it answered."""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel_id}.json"))
    try:
        kc.load_connection_file()
        kc.start_channels()
        kc.execute("", silent=True, store_history=False, reply=True, timeout=10)
        return True
    except Exception:  # not answering is what the caller goes on to report
        return False
    finally:
        kc.stop_channels()


def _kernel_idle(url: str, token: str, timeout: float = 90.0, runtime: Path | None = None) -> None:
    """Wait for the notebook's kernel to exist and be idle (the toolbar's indicator shows "idle" before a
    kernel exists, STACK-NOTES). ``runtime`` (the lab's JUPYTER_RUNTIME_DIR): after a REST restart on a
    loaded machine the server has been seen to keep the new kernel "busy" with no activity for 90 s (it
    missed the kernel's first idle status); a kernel that stays so for 20 s is given an empty silent cell,
    every 20 s, which it answers with fresh statuses."""
    deadline = time.monotonic() + timeout
    nudge_at = time.monotonic() + 20 if runtime is not None else None
    kernels: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=5) as r:
                kernels = json.loads(r.read())
            if kernels and all(
                k["execution_state"] == "idle" and k.get("connections", 0) > 0 for k in kernels
            ):
                return
            if nudge_at is not None and runtime is not None and time.monotonic() > nudge_at and kernels:
                nudge_at = time.monotonic() + 20
                answered = [_nudge(runtime, k["id"]) for k in kernels if k["execution_state"] == "busy"]
                print(f"kernels still busy after 20 s; ran an empty cell: answered {answered}")
        except OSError:
            pass  # the server answers 500 while the kernel is starting
        time.sleep(0.5)
    raise AssertionError(f"the notebook's kernel never became idle: {kernels}")


@pytest.fixture
def stop_runs_after(workdir: Path) -> Iterator[None]:
    """Runs are detached and outlive the kernel by design: stop whatever a failed test left running."""
    yield
    for run in nbtrain.runs():
        if not run.status().done:
            run.stop(timeout=30)


def test_finetune_cell_dashboard_sidebar_stop_resume_and_attach_after_restart(
    lab: tuple[str, str], workdir: Path, shots: Path, stop_runs_after: None, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    write_notebook(workdir / "e2e.ipynb", ["%load_ext nbtrain", CELL])

    with lab_page(lab, "lab/tree/e2e.ipynb", {"width": 1400, "height": 1000}) as (_, page, errors):
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
        expect(row.locator(".nbtrain-steps")).to_have_text(re.compile(r"step [\d,]+/100,000"))
        expect(row.locator(".nbtrain-loss")).to_have_text(re.compile(r"loss \d+\.\d{4}"))
        page.wait_for_function(
            "() => (document.querySelector('.nbtrain-run .nbtrain-spark path')"
            "?.getAttribute('d') || '').includes('L')",
            timeout=30_000,
        )
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 1 active run")
        page.screenshot(path=str(shots / "sidebar-running.png"))

        # Kernel > Restart mid-run (the run goes on: it is detached). ipywidgets keeps the cell's widget drawn
        # as it last was; within 10 s the live view without a kernel shows in its place instead, says at which
        # step the kernel's view was lost (the step that widget shows) and follows the run.
        # Restart an idle kernel, as a user does once the cell has run: a run forked by the warm process is
        # running within a second, so the kernel may still be sending the dashboard's first figure, and a
        # restart in the middle of that leaves JupyterLab's kernel connection "Starting" (seen 2 of 3 times).
        _kernel_idle(url, token)
        restart_kernel(page)
        first_view = cells.nth(1).locator(".nbtrain-run-view")
        try:
            expect(first_view.locator(".nbtrain-state")).to_have_text("running", timeout=10_000)
        except AssertionError:
            page.screenshot(path=str(shots / "restart-no-view.png"))
            raise
        widget_out = cells.nth(1).locator(".jp-OutputArea-child", has=page.locator(".nbtrain-live"))
        expect(widget_out).to_be_hidden()  # the frozen widget: still on the page, not shown
        lost = title_step(widget_out.locator(".gtitle"))
        assert lost > 0
        expect(first_view.locator(".nbtrain-page-updated")).to_contain_text(
            f"live view lost at step {lost}: following the run directory"
        )
        expect(first_view.locator(".nbtrain-view-attach")).to_have_text("Re-attach")
        page.wait_for_function(
            "([el, at]) => Number(el.dataset.step) > at",
            arg=[first_view.element_handle(), lost],
            timeout=20_000,
        )
        cells.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "restarted.png"))
        _kernel_idle(url, token, runtime=tmp_path / "jupyter_runtime")
        # "Open dashboard" still attaches: the kernel lacks the magics now, so the one cell it inserts loads
        # them first, with no UsageError and no empty cell left behind.
        # Shift+Enter on the last cell left an empty cell, the active one: the attach cell takes its place.
        cells_before = cells.count()
        assert cells.nth(cells_before - 1).locator(".cm-content").inner_text().strip() == ""
        row.locator(".nbtrain-open").click()
        attach = cells.filter(has=page.locator(".cm-content", has_text="%finetune attach "))
        try:
            expect(attach).to_have_count(1, timeout=20_000)
        except AssertionError:
            page.screenshot(path=str(shots / "not-attached.png"))
            raise
        expect(cells).to_have_count(cells_before)
        expect(attach.locator(".cm-content")).to_have_text(
            re.compile(r"^%load_ext nbtrain\s*%finetune attach \S+$")
        )
        expect(attach.locator(".js-plotly-plot >> visible=true")).to_have_count(1, timeout=60_000)
        expect(attach.locator(".jp-OutputArea")).not_to_contain_text("UsageError")
        sources = cells.locator(".cm-content").evaluate_all("es => es.map(e => e.textContent.trim())")
        assert all(sources), sources
        page.screenshot(path=str(shots / "attached.png"))

        # Stop: the run saves a checkpoint and ends; the row and the status bar follow.
        row.locator(".nbtrain-stop").click()
        expect(row.locator(".nbtrain-state")).to_have_text("stopped", timeout=120_000)
        expect(row).not_to_contain_text("Stopping")
        expect(page.locator(".nbtrain-status")).to_have_text("nbtrain: 0 active runs", timeout=10_000)
        stopped_at = step_in(row.locator(".nbtrain-steps").inner_text())
        page.screenshot(path=str(shots / "stopped.png"))

        # Resume from the sidebar continues the run from its checkpoint, in the same run directory.
        row.locator(".nbtrain-resume").click()
        expect(row.locator(".nbtrain-state")).to_have_text("running", timeout=120_000)
        run_id = row.get_attribute("data-run-id")
        page.wait_for_function(STEP_PAST_JS, arg=[run_id, stopped_at], timeout=120_000)
        # the attach cell's view had ended on "stopped": it follows the resumed run again, within seconds
        view_title = attach.locator(".js-plotly-plot >> visible=true").locator(".gtitle")
        expect(view_title).to_contain_text("running", timeout=15_000)
        deadline = time.monotonic() + 20
        while step_in(view_title.text_content()) <= stopped_at:
            assert time.monotonic() < deadline, view_title.text_content()
            page.wait_for_timeout(250)
        page.screenshot(path=str(shots / "resumed.png"))

        # Saved and reloaded mid-run, with the kernel alive: the view comes back live, within 5 s of the
        # run's own step (status.json), and says "running", not a snapshot's time.
        page.keyboard.press("Escape")
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1500)
        page.reload()
        page.add_style_tag(content=".Toastify { display: none !important }")  # JupyterLab's news question
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells.first).to_be_visible(timeout=60_000)
        attach = cells.filter(has=page.locator(".cm-content", has_text="%finetune attach "))
        view_title = attach.locator(".js-plotly-plot >> visible=true").locator(".gtitle")
        expect(view_title).to_contain_text("running", timeout=30_000)
        status_file = next((workdir / "runs").iterdir()) / "status.json"
        run_step = json.loads(status_file.read_text())["step"]
        deadline = time.monotonic() + 5
        while (shown := step_in(view_title.text_content())) < run_step:
            assert time.monotonic() < deadline, (
                f"after the reload the view shows step {shown}, the run {run_step}"
            )
            page.wait_for_timeout(200)
        assert "snapshot" not in (view_title.text_content() or "")
        # (the attach cell's kernel draws its widget: the view that needs no kernel stays hidden there)
        expect(attach.locator(".nbtrain-run-view")).to_be_hidden()
        # The first cell's view lost its kernel at the restart: the lab extension follows the run from its
        # run directory there, within 5 s of its step too, and says so.
        first_view = cells.nth(1).locator(".nbtrain-run-view")
        expect(first_view.locator(".nbtrain-state")).to_have_text("running", timeout=20_000)
        run_step = json.loads(status_file.read_text())["step"]
        deadline = time.monotonic() + 5
        while int(first_view.get_attribute("data-step") or -1) < run_step:
            assert time.monotonic() < deadline, (first_view.get_attribute("data-step"), run_step)
            page.wait_for_timeout(200)
        # no widget drawn after the reload: the view was lost where the kernel's last snapshot saw the run
        expect(first_view.locator(".nbtrain-page-updated")).to_contain_text(
            re.compile(r"live view lost at step \d+: following the run directory")
        )
        # the dashboard's own figure (as the run page draws it), its loss curve among its traces
        figure = first_view.locator(".nbtrain-page-figure .js-plotly-plot")
        expect(figure).to_be_visible(timeout=20_000)
        keys = figure.evaluate("gd => gd.data.map(t => (t.meta || []).join(':'))")
        assert "metric:loss" in keys, keys
        cells.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "reloaded.png"))
        page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click()
        row = page.locator(".nbtrain-run", has=page.locator(".nbtrain-run-name", has_text="e2e"))
        expect(row.locator(".nbtrain-state")).to_have_text("running", timeout=30_000)
        row.locator(".nbtrain-stop").click()
        expect(row.locator(".nbtrain-state")).to_have_text("stopped", timeout=120_000)
        # Every view follows it to its end. The attach cell's kernel lives, but the reload cut its display ids
        # (they are not saved with the notebook), so its updates have nowhere to go: its saved snapshot is the
        # view with no kernel, and that one says "stopped" too, as does the first cell's.
        states = attach.locator(".nbtrain-run-view >> visible=true").locator(".nbtrain-state")
        deadline = time.monotonic() + 10
        while not any(
            "stopped" in (t or "") for t in states.all_text_contents() + view_title.all_text_contents()
        ):
            assert time.monotonic() < deadline, (states.all_text_contents(), view_title.all_text_contents())
            page.wait_for_timeout(250)
        expect(first_view.locator(".nbtrain-state")).to_have_text("stopped", timeout=10_000)
        # the run record saved mid-run says what it recorded, and what the run is now
        record = cells.nth(1).locator(".nbtrain-record")
        expect(record.locator(".nbtrain-record-saved")).to_contain_text("running at step")
        expect(record.locator(".nbtrain-record-now")).to_contain_text("now stopped", timeout=15_000)
        cells.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "stopped-views.png"))

        # Key completion in a %%finetune cell: Tab offers config keys served from the validator's schema.
        attach.locator(".cm-content").click()
        page.keyboard.press("Escape")
        page.keyboard.press("b")  # command mode: insert a cell below
        page.keyboard.press("Enter")  # edit it
        page.keyboard.type("%%finetune\nobjective: dpo\ntrain:\n  bet")
        page.keyboard.press("Tab")
        completer = page.locator(".jp-Completer")
        expect(completer).to_be_visible(timeout=20_000)
        try:
            # the kernel's completions come with ours, and this machine may be busy: more than 5 s
            expect(completer.locator(".jp-Completer-item", has_text="beta")).to_have_count(1, timeout=20_000)
        except AssertionError:
            page.screenshot(path=str(shots / "no-completion.png"))
            raise
        page.screenshot(path=str(shots / "completion.png"))
    assert not errors, errors
    runs = list((workdir / "runs").iterdir())
    assert len(runs) == 1
    status = json.loads((runs[0] / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] > stopped_at >= 3
    assert status["stop_reason"] == "sidebar"
    assert json.loads((runs[0] / "resolved.json").read_text())["resume"]["step"] == stopped_at
