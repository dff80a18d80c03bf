"""The sidebar and status bar in a real JupyterLab (headless chromium), on run directories written the way
a worker writes them: every state, progress, loss and its sparkline, grouping, filter and folding, what
each card shows (id, start time, folder) and which actions it offers, Stop / Resume / Delete through the
REST API, the status bar's tooltip and click; then the same sidebar in Jupyter Notebook 7's left panel.

NBTRAIN_UPDATE_SCREENSHOTS=1 writes the sidebar's picture to docs/screenshots/sidebar.png (otherwise it stays
in the test's folder under test-output/browser/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.rundir import RunPaths, atomic_write_json, lock_run, write_status
from nbtrain.hardware import probe
from tests.browser.conftest import lab_page, write_notebook
from tests.conftest import ROOT
from tests.ui.server.fakes import make_run

pytestmark = pytest.mark.browser

DOCS = ROOT / "docs" / "screenshots"

# Notebook 7.6's own settings loader throws this on its file browser page, with nbtrain disabled as well.
NOTEBOOK_OWN_ERRORS = ("Cannot read properties of undefined (reading 'schema')",)


def test_sidebar_lists_groups_filters_stops_resumes_and_deletes_runs(
    lab: tuple[str, str], tmp_path: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    make_run("20250101-000000-demo-abcd", name="demo", state="running", step=4, losses=(2.0, 1.5, 1.25))
    make_run("20250101-000001-done-beef", name="done", state="completed", step=10, losses=(0.5,))
    # Two runs of one name: told apart by their ids and start times.
    sweep_a = make_run("20250102-090000-sweep-aaaa", name="sweep", state="stopped", step=4, checkpoint=4)
    diverged = make_run("20250102-100000-sweep-bbbb", name="sweep", state="failed", step=2)
    error = {"type": "NonFiniteTraining", "message": "the loss became nan at step 2, before any checkpoint"}
    write_status(diverged, "failed", step=2, max_steps=10, error=error)
    fetching = make_run("20250101-000002-hub-cafe", name="hub", state="starting")
    download = {"repo": "org/big", "done": 3.1e9, "total": 15.2e9, "rate": 40e6, "files": 9}
    write_status(fetching, "starting", phase="downloading model", download=download)

    viewport = {"width": 1280, "height": 1000}
    with lab_page(lab, "lab", viewport, device_scale_factor=2) as (_, page, errors):
        # Drawn at twice the pixels: the sidebar's picture is the one in docs/screenshots/.
        tab = page.locator('.jp-SideBar [data-id="nbtrain-runs"]')
        tab.click(timeout=60_000)

        def card(run_id: str) -> Any:
            return page.locator(f'.nbtrain-run[data-run-id="{run_id}"]')

        row = card("20250101-000000-demo-abcd")
        expect(row).to_be_visible(timeout=20_000)
        expect(row.locator(".nbtrain-state")).to_have_text("running")
        expect(row.locator(".nbtrain-steps")).to_have_text("step 4/10")
        expect(row.locator(".nbtrain-loss")).to_have_text("loss 1.2500")
        width = row.locator(".nbtrain-progress-bar").evaluate("e => e.style.width")
        assert float(width.rstrip("%")) == 40
        spark = row.locator(".nbtrain-spark path").get_attribute("d") or ""
        assert spark.startswith("M0.0 1.0") and spark.count("L") == 2  # three losses, highest first
        starting = card("20250101-000002-hub-cafe")
        expect(starting.locator(".nbtrain-steps")).to_have_text(
            "downloading model org/big 3.1 / 15.2 GB, 40.0 MB/s"
        )
        # Active runs first, then the ones Resume can continue (the stopped one), then the other finished
        # ones; newest first in each group.
        ids = page.locator(".nbtrain-run").evaluate_all("rows => rows.map(r => r.dataset.runId)")
        assert ids == [
            "20250101-000002-hub-cafe",
            "20250101-000000-demo-abcd",
            "20250102-090000-sweep-aaaa",
            "20250102-100000-sweep-bbbb",
            "20250101-000001-done-beef",
        ]
        expect(page.locator(".nbtrain-group-active .nbtrain-group-count")).to_have_text("2")
        expect(page.locator(".nbtrain-group-resumable .nbtrain-group-count")).to_have_text("1")
        expect(page.locator(".nbtrain-group-finished .nbtrain-group-count")).to_have_text("2")

        # What a card says: its id, when it started and the folder it is in.
        stopped, failed = card("20250102-090000-sweep-aaaa"), card("20250102-100000-sweep-bbbb")
        expect(stopped.locator(".nbtrain-run-name")).to_have_text("sweep")
        expect(failed.locator(".nbtrain-run-name")).to_have_text("sweep")
        expect(stopped.locator(".nbtrain-run-id")).to_have_text("20250102-090000-sweep-aaaa")
        expect(stopped.locator(".nbtrain-run-time")).to_have_text(re.compile(r"^started today \d\d:\d\d$"))
        expect(stopped.locator(".nbtrain-run-folder")).to_have_text("in runs")

        # The actions a card offers follow its state: none of a running run's on a finished one.
        for name in ("stop", "checkpoint", "open"):
            expect(row.locator(f".nbtrain-{name}")).to_be_visible()
        for name in ("resume", "delete"):
            expect(row.locator(f".nbtrain-{name}")).to_be_hidden()
        done = card("20250101-000001-done-beef")
        for name in ("stop", "checkpoint", "resume"):
            expect(done.locator(f".nbtrain-{name}")).to_be_hidden()
        expect(done.locator(".nbtrain-delete")).to_be_visible()
        expect(stopped.locator(".nbtrain-resume")).to_be_visible()
        expect(failed.locator(".nbtrain-resume")).to_be_hidden()  # it failed before any checkpoint: says so
        expect(failed.locator(".nbtrain-run-note")).to_have_text("Cannot resume: no checkpoint saved")
        expect(starting.locator(".nbtrain-checkpoint")).to_be_hidden()  # nothing to save before training

        # The status bar: active runs; its tooltip says there is no GPU in words, not NVML's.
        status = page.locator(".nbtrain-status")
        expect(status).to_have_text("nbtrain: 2 active runs")
        if not probe().gpus:
            title = status.get_attribute("title") or ""
            assert title.startswith("No NVIDIA GPU on this machine") and "NVML" not in title
        page.screenshot(path=str(shots / "sidebar.png"))
        page.locator("#nbtrain-runs").screenshot(path=str(shots / "sidebar-panel.png"))

        # Filter: every word must match (name, id, state, folder or model).
        box = page.locator(".nbtrain-filter")
        box.fill("sweep")
        expect(page.locator(".nbtrain-run")).to_have_count(2)
        box.fill("sweep failed")
        expect(page.locator(".nbtrain-run")).to_have_count(1)
        expect(page.locator(".nbtrain-run")).to_have_attribute("data-run-id", "20250102-100000-sweep-bbbb")
        box.fill("nothing-like-it")
        expect(page.locator(".nbtrain-message")).to_have_text("No run matches “nothing-like-it”.")
        box.fill("")
        # The finished runs fold away and back.
        toggle = page.locator(".nbtrain-group-toggle")
        toggle.click()
        expect(done).to_be_hidden()
        expect(row).to_be_visible()
        expect(stopped).to_be_visible()  # the run you stopped stays in sight: Resume is one click away
        page.screenshot(path=str(shots / "sidebar-folded.png"))
        toggle.click()
        expect(done).to_be_visible()

        # A click on the status bar opens the sidebar when it is closed.
        tab.click()
        expect(page.locator("#nbtrain-runs")).to_be_hidden()
        status.click()
        expect(page.locator("#nbtrain-runs")).to_be_visible()

        # A stop under way (asked from anywhere: here the notebook's run.stop()), waiting for a 70 s step:
        # the card says what it waits for, Stop reads Stopping… and no Checkpoint sits beside it.
        demo = RunPaths(tmp_path / "runs" / "20250101-000000-demo-abcd")
        write_status(demo, "running", step_seconds=70.0, step_ended=time.time())
        demo.control_file("stop").write_text("", encoding="utf-8")
        expect(row.locator(".nbtrain-state")).to_have_text("stopping", timeout=10_000)
        expect(row.locator(".nbtrain-steps")).to_have_text(re.compile(r"^stopping after step 5, ~\d+ s$"))
        expect(row.locator(".nbtrain-stop")).to_have_text("Stopping…")
        expect(row.locator(".nbtrain-stop")).to_be_disabled()
        expect(row.locator(".nbtrain-checkpoint")).to_be_hidden()
        page.locator("#nbtrain-runs").screenshot(path=str(shots / "sidebar-stopping.png"))
        demo.control_file("stop").unlink()
        write_status(demo, "running", step_seconds=None, step_ended=None)
        expect(row.locator(".nbtrain-steps")).to_have_text("step 4/10", timeout=10_000)

        # Stop goes through ServerConnection, so it carries the XSRF header the server checks on POST.
        row.locator(".nbtrain-stop").click()
        expect(row.locator(".nbtrain-state")).to_have_text("stopped", timeout=20_000)
        expect(row).not_to_contain_text("Stopping")
        expect(row.locator(".nbtrain-stop")).to_be_hidden()
        expect(status).to_have_text("nbtrain: 1 active run")

        # Resume refused, said in a dialog: here another process holds the run's writer lock.
        fd = lock_run(sweep_a)
        assert fd is not None
        try:
            stopped.locator(".nbtrain-resume").click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text("Could not resume run sweep", timeout=20_000)
            expect(dialog).to_contain_text("is being written by another process")
            page.screenshot(path=str(shots / "sidebar-resume-refused.png"))
            dialog.locator(".jp-Dialog-button").last.click()
        finally:
            os.close(fd)
        expect(stopped.locator(".nbtrain-state")).to_have_text("stopped")

        # Delete asks first; the run's folder goes to runs/.trash/ and its card goes.
        done.locator(".nbtrain-delete").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Delete run “done”?")
        expect(dialog).to_contain_text("runs/.trash/")
        page.screenshot(path=str(shots / "sidebar-delete.png"))
        dialog.locator(".jp-mod-warn").click()
        expect(done).to_have_count(0, timeout=20_000)
        page.screenshot(path=str(shots / "sidebar-after.png"))

        # Jupyter Notebook 7: the same sidebar, in its left panel (View > Left Sidebar > Show Training runs).
        page.goto(f"{url}/tree?token={token}")
        page.locator(".lm-MenuBar-itemLabel", has_text="View").click(timeout=60_000)
        page.locator(".lm-Menu-item", has_text="Left Sidebar").click()
        page.locator(".lm-Menu-item", has_text="Show Training runs").click()
        expect(page.locator("#nbtrain-runs")).to_be_visible()
        expect(card("20250102-090000-sweep-aaaa").locator(".nbtrain-state")).to_have_text("stopped")
        expect(page.locator(".nbtrain-run")).to_have_count(4)
        page.screenshot(path=str(shots / "notebook7-sidebar.png"))
    assert not [e for e in errors if e not in NOTEBOOK_OWN_ERRORS], errors
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "sidebar-panel.png", DOCS / "sidebar.png")
    status_file: dict[str, Any] = json.loads(
        (tmp_path / "runs" / "20250101-000000-demo-abcd" / "status.json").read_text()
    )
    assert status_file["state"] == "stopped" and status_file["stop_reason"] == "sidebar"
    assert (tmp_path / "runs" / ".trash" / "20250101-000001-done-beef" / "status.json").is_file()
    assert not (tmp_path / "runs" / "20250101-000001-done-beef").exists()


def test_a_queued_slurm_run_shows_slurms_reason_and_place_and_stop_cancels_its_job(
    slurm_cluster: Any, lab: tuple[str, str], workdir: Path, shots: Path
) -> None:
    # slurm_cluster before lab: the lab's server asks the same cluster (SLURM_CONF in its environment).
    from playwright.sync_api import expect

    import nbtrain
    from tests.conftest import lora_yaml

    blocker = slurm_cluster.run(
        "sbatch", "--parsable", "-N2", "--time=5", "--wrap", "sleep 300"
    ).stdout.strip()
    try:
        text = lora_yaml(10) + "distributed:\n  slurm: {time: '00:10:00'}\n"
        run = nbtrain.finetune(text, name="on-the-cluster")
        job = json.loads(run.paths.status.read_text())["slurm_job"]
        with lab_page(lab, "lab", {"width": 1280, "height": 800}) as (_, page, errors):
            page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click(timeout=60_000)
            card = page.locator(f'.nbtrain-run[data-run-id="{run.id}"]')
            expect(card.locator(".nbtrain-state")).to_have_text("queued", timeout=30_000)
            expect(card.locator(".nbtrain-steps")).to_contain_text(
                re.compile(rf"SLURM job {job} pending \((Resources|Priority)\), position 1 in the queue"),
                timeout=30_000,
            )
            page.locator("#nbtrain-runs").screenshot(path=str(shots / "slurm-queued.png"))
            card.locator(".nbtrain-stop").click()
            expect(card.locator(".nbtrain-state")).to_have_text("stopped", timeout=30_000)
            page.locator("#nbtrain-runs").screenshot(path=str(shots / "slurm-stopped.png"))
            assert not errors, errors
        assert job not in slurm_cluster.jobs()
    finally:
        slurm_cluster.run("scancel", blocker, check=False)


def test_a_model_server_shows_on_its_runs_card_and_stops_from_there(
    lab: tuple[str, str], tmp_path: Path, shots: Path, tuned_run: Path
) -> None:
    """A completed run whose model server still runs is listed with the active runs, with the server's
    address (never its key) and a Stop server button; the status bar counts it; Stop server ends it."""
    from playwright.sync_api import expect

    from nbtrain.control.jobs.serve import find_server, serve
    from nbtrain.control.runs import registry

    root = Path.cwd() / "runs" / "20250103-000000-served-f00d"
    shutil.copytree(tuned_run, root, ignore=shutil.ignore_patterns("serve.json", "logs", "checkpoints"))
    registry.add(root.name, "served", root, None)
    make_run("20250101-000001-done-beef", name="done", state="completed", step=10, losses=(0.5,))
    handle = serve(root)
    try:
        with lab_page(lab, "lab", {"width": 1280, "height": 900}) as (_, page, errors):
            page.add_style_tag(content=".Toastify { display: none !important }")  # JupyterLab's news toast
            page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click(timeout=60_000)
            card = page.locator(f'.nbtrain-run[data-run-id="{root.name}"]')
            expect(card).to_be_visible(timeout=20_000)
            expect(page.locator(".nbtrain-group-active").locator(".nbtrain-run")).to_have_count(1)
            expect(card.locator(".nbtrain-state")).to_have_text("completed")
            expect(card.locator(".nbtrain-server-chip")).to_have_text("serving")
            expect(card.locator(".nbtrain-server-url")).to_contain_text(handle.url)
            assert handle.api_key and handle.api_key not in page.content()
            expect(card.locator(".nbtrain-delete")).to_be_hidden()  # not deleted under its server
            status = page.locator(".nbtrain-status")
            expect(status).to_have_text("nbtrain: 0 active runs · 1 model server", timeout=10_000)
            page.screenshot(path=str(shots / "sidebar-server.png"))
            card.locator(".nbtrain-server-stop").click()
            expect(card.locator(".nbtrain-server")).to_be_hidden(timeout=30_000)
            expect(status).to_have_text("nbtrain: 0 active runs", timeout=10_000)
            expect(page.locator(".nbtrain-group-active")).to_be_hidden()
            expect(card.locator(".nbtrain-delete")).to_be_visible()
        assert not errors, errors
        assert find_server(root) is None and not handle.alive()
    finally:
        if find_server(root) is not None:
            handle.stop()


def test_a_runs_page_opens_from_its_card_with_no_notebook_open_and_follows_the_run(
    lab: tuple[str, str], tmp_path: Path, shots: Path
) -> None:
    """The run's page of its own (the main area, from the card's Page): its state, steps, the charts a
    notebook's dashboard draws (the same plotly figure: its panels, axis titles and loss controls) and the
    log with the trainer's metrics lines readable, read from the server extension alone, following the run as
    it goes on and ends, the scale and smoothing chosen kept through its updates; it fills a small window
    and a wide one."""
    import time

    from playwright.sync_api import expect

    from nbtrain.contract.rundir import JsonlWriter

    paths = make_run(
        "20250104-000000-paged-abcd", name="paged", state="running", step=3, losses=(2.0, 1.5, 1.25)
    )
    with paths.rank_log(0).open("a", encoding="utf-8") as log:  # what transformers' trainer prints
        log.write("{'loss': '1.25', 'grad_norm': '0.8125', 'learning_rate': '0.001', 'epoch': '0.3'}\n")
    with lab_page(lab, "lab", {"width": 1280, "height": 800}) as (_, page, errors):
        page.add_style_tag(content=".Toastify { display: none !important }")  # JupyterLab's news toast
        page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click(timeout=60_000)
        card = page.locator('.nbtrain-run[data-run-id="20250104-000000-paged-abcd"]')
        expect(card).to_be_visible(timeout=20_000)
        card.locator(".nbtrain-page").click()
        view = page.locator(".nbtrain-run-page")
        expect(view.locator(".nbtrain-page-name")).to_have_text("paged", timeout=10_000)
        expect(view.locator(".nbtrain-state")).to_have_text("running")
        expect(view.locator(".nbtrain-page-steps")).to_have_text("step 3/10")
        figure = view.locator(".nbtrain-page-figure .js-plotly-plot")
        expect(figure).to_be_visible(timeout=20_000)

        def points() -> dict[str, int]:
            """Each trace's key (its meta, as the figure builder names it) and how many points it draws."""
            js = "gd => gd._fullData.map(t => [gd.data[t.index].meta.join(':'), t.x ? t.x.length : 0])"
            return dict(figure.evaluate(js))

        assert points()["metric:loss"] == 3
        # the dashboard's panels, axis titles and the loss panel's controls
        titles = figure.locator(".annotation-text").all_text_contents()
        for panel in ("loss", "learning rate", "gradient norm", "throughput", "memory per rank"):
            assert panel in titles, titles
        y_titles = figure.locator("[class^='g-y'][class$='title']")
        # (no memory sample yet)
        expect(y_titles).to_have_text(["loss", "learning rate", "L2 norm", "tokens/s"])
        expect(figure.locator(".g-xtitle").first).to_have_text("step")
        buttons = figure.locator(".updatemenu-button")
        expect(buttons).to_have_text(["raw", "smoothed", "linear", "log"])
        log = view.locator(".nbtrain-page-log")
        expect(log).to_contain_text("line 99")
        expect(log).to_contain_text("loss 1.25 · grad_norm 0.8125 · learning_rate 0.001 · epoch 0.3")
        expect(log).not_to_contain_text("{'loss'")
        expect(page.locator(".lm-TabBar-tab", has_text="paged")).to_be_visible()  # a tab of its own
        buttons.filter(has_text=re.compile("^log$")).click()
        buttons.filter(has_text="smoothed").click()
        w = JsonlWriter(paths.metrics, "metrics")  # the run goes on
        for step, value in ((4, 1.0), (5, 0.8)):
            w.write({"t": time.time(), "step": step, "loss": value, "lr": 1e-3, "tokens_per_s": 900.0,
                     "grad_norm": 0.5, "eval_loss": value + 0.1})  # fmt: skip
        w.close()
        w = JsonlWriter(paths.system, "system")
        w.write({"t": time.time(), "rank": 0, "rss": 1.5 * 2**30})
        w.close()
        write_status(paths, "running", step=5, max_steps=10)
        steps = re.compile(r"^step 5/10( · .+ left)?$")  # (the time left, from the records' times)
        expect(view.locator(".nbtrain-page-steps")).to_have_text(steps, timeout=10_000)
        deadline = time.monotonic() + 15
        while points().get("metric:eval_loss") != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        drawn = points()
        assert drawn["metric:loss"] == 5 and drawn["metric:eval_loss"] == 2, drawn
        assert drawn["metric:lr"] == drawn["metric:grad_norm"] == drawn["smooth:tokens_per_s"] == 2, drawn
        assert drawn["memory:0:rss"] == 1, drawn
        expect(y_titles).to_have_text(["loss", "learning rate", "L2 norm", "tokens/s", "GiB"])
        # redrawn in place: the scale and the smoothing chosen before the update hold
        assert figure.evaluate("gd => gd._fullLayout.yaxis.type") == "log"
        assert figure.evaluate("gd => [gd.data[0].opacity, gd.data[1].visible]") == [0.3, True]
        expect(page.locator(".nbtrain-page-figure .js-plotly-plot")).to_have_count(1)
        page.screenshot(path=str(shots / "run-page.png"))
        page.set_viewport_size({"width": 1920, "height": 1080})
        time.sleep(1)  # plotly fits the figure to the page's new width
        width = figure.evaluate("gd => gd._fullLayout.width")
        assert width > 1400, width
        page.screenshot(path=str(shots / "run-page-wide.png"))
        write_status(paths, "completed", step=5, max_steps=10)
        expect(view.locator(".nbtrain-state")).to_have_text("completed", timeout=10_000)
        expect(view.locator(".nbtrain-stop")).to_be_hidden()

        # A run logging every 5 steps (lab 6), no loss yet: once the worker has timed two steps, its card
        # and its page say the time left and when the first loss comes (issue 56).
        lab6 = make_run("20250104-000001-lab6-beef", name="lab6", state="running", step=1)
        resolved = {"id": "20250104-000001-lab6-beef", "name": "lab6", "config": {}}
        atomic_write_json(lab6.resolved, {**resolved, "train_args": {"logging_steps": 5}})
        write_status(lab6, "running", step=1, step_seconds=20.0, step_ended=time.time(), steps_timed=1)
        lab6_card = page.locator('.nbtrain-run[data-run-id="20250104-000001-lab6-beef"]')
        expect(lab6_card.locator(".nbtrain-steps")).to_have_text(
            "step 1/10 · first loss at step 5", timeout=20_000
        )
        write_status(lab6, "running", step=2, step_seconds=20.0, step_ended=time.time(), steps_timed=2)
        line = re.compile(r"^step 2/10 · 2 min \d\d s left · first loss at step 5, in about \d\d s$")
        expect(lab6_card.locator(".nbtrain-steps")).to_have_text(line, timeout=10_000)
        page.locator("#nbtrain-runs").screenshot(path=str(shots / "sidebar-time-left.png"))
        lab6_card.locator(".nbtrain-page").click()
        lab6_view = page.locator(".nbtrain-run-page", has=page.locator(".nbtrain-page-name", has_text="lab6"))
        expect(lab6_view.locator(".nbtrain-page-steps")).to_have_text(line, timeout=10_000)
        page.screenshot(path=str(shots / "run-page-time-left.png"))
    assert not errors, errors


def test_a_runs_page_opens_in_notebook_7_as_a_file_browser_tab_and_from_a_notebook_in_a_tab_of_its_own(
    lab: tuple[str, str], tmp_path: Path, shots: Path
) -> None:
    """Jupyter Notebook 7 keeps one widget in a page's main area: on its file browser page the run's page is
    a tab beside Files and Running (its card's Dashboard opens it there: no notebook to show it in); from a
    notebook's page, Page opens the file browser page showing the run in a new browser tab. Both follow the
    run, with the dashboard's charts (plotly's renderer loads in Notebook 7 too)."""
    from playwright.sync_api import expect

    paths = make_run(
        "20250105-000000-nb7page-abcd", name="nb7page", state="running", step=3, losses=(2.0, 1.5, 1.25)
    )
    write_notebook(tmp_path / "lab.ipynb", ["1 + 1"])

    def show_sidebar(tab: Any) -> Any:
        tab.locator(".lm-MenuBar-itemLabel", has_text="View").click(timeout=60_000)
        tab.locator(".lm-Menu-item", has_text="Left Sidebar").click()
        tab.locator(".lm-Menu-item", has_text="Show Training runs").click()
        card = tab.locator('.nbtrain-run[data-run-id="20250105-000000-nb7page-abcd"]')
        expect(card).to_be_visible(timeout=20_000)
        return card

    def follows(tab: Any, step: int) -> None:
        view = tab.locator(".nbtrain-run-page")
        expect(view.locator(".nbtrain-page-name")).to_have_text("nb7page", timeout=15_000)
        steps = re.compile(rf"^step {step}/10( · .+ left)?$")  # (the time left once two steps are timed)
        expect(view.locator(".nbtrain-page-steps")).to_have_text(steps, timeout=10_000)
        figure = view.locator(".nbtrain-page-figure .js-plotly-plot")
        expect(view.locator(".nbtrain-figure-missing")).to_have_count(0)  # plotly's renderer is there too
        menus = figure.locator(".updatemenu-button")
        expect(menus).to_have_text(["raw", "smoothed", "linear", "log"], timeout=20_000)
        assert figure.evaluate("gd => gd._fullData[0].x.length") == 3
        expect(tab.locator(".lm-TabBar-tab", has_text="nb7page")).to_be_visible()

    with lab_page(lab, "tree", {"width": 1280, "height": 860}) as (_, page, errors):
        show_sidebar(page).locator(".nbtrain-open").click()  # Dashboard, with no notebook open
        follows(page, 3)
        expect(page.locator(".jp-Dialog")).to_have_count(0)
        expect(page.locator(".lm-TabBar-tab", has_text="Files")).to_be_visible()  # beside, not instead
        page.screenshot(path=str(shots / "notebook7-run-page.png"))
        # two steps timed: the time left, in the tab and in the card beside it (issue 56)
        write_status(
            paths, "running", step=5, max_steps=10, step_seconds=30.0, step_ended=time.time(), steps_timed=2
        )
        follows(page, 5)
        left = re.compile(r"^step 5/10 · 2 min \d\d s left$")
        expect(page.locator(".nbtrain-run-page .nbtrain-page-steps")).to_have_text(left, timeout=10_000)
        expect(page.locator(".nbtrain-run .nbtrain-steps")).to_have_text(left, timeout=10_000)
        page.screenshot(path=str(shots / "notebook7-time-left.png"))

        page.goto(page.url.split("/tree")[0] + "/notebooks/lab.ipynb")
        with page.expect_popup() as opened:
            show_sidebar(page).locator(".nbtrain-page").click()
        other = opened.value
        other.on("pageerror", lambda e: errors.append(str(e)))
        assert "/tree?nbtrain-run=20250105-000000-nb7page-abcd" in other.url
        follows(other, 5)
        expect(page.locator(".jp-Notebook")).to_be_visible()  # the notebook's page stays as it was
        other.screenshot(path=str(shots / "notebook7-run-page-from-notebook.png"))
    assert not [e for e in errors if e not in NOTEBOOK_OWN_ERRORS], errors
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "notebook7-run-page.png", DOCS / "notebook7-run-page.png")
