"""A sweep's view in a real JupyterLab (headless chromium): a %%finetune cell with a sweep: section shows the
sweep's figure; with its kernel shut down and the page reloaded, the view goes on following the sweep from
its folder to its end, every trial in it; Best → cell puts the winning config in a cell below; a trial cloned
with a key changed runs as a new trial, which Stop trial stops while the sweep goes on; the sidebar's trial
chip opens the sweep's page."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.browser.conftest import lab_page, no_news_toast, write_notebook
from tests.browser.test_notebook_e2e import _kernel_idle
from tests.conftest import sweep_yaml

pytestmark = pytest.mark.browser


def _kernels(url: str, token: str) -> list[dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10) as r:
        return list(json.loads(r.read()))


def test_a_sweeps_view_follows_it_after_its_kernel_is_gone_and_inserts_the_best_config(
    lab: tuple[str, str], workdir: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    no_news_toast(workdir)
    cell = "%%finetune\n" + sweep_yaml("[3.0e-3, 2.0e-3, 1.0e-3]", 30)
    nb = write_notebook(workdir / "sweep.ipynb", ["%load_ext nbtrain", cell])
    with lab_page(lab, "lab/tree/sweep.ipynb", {"width": 1300, "height": 1500}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        view = page.locator(".nbtrain-sweep-view")
        text = view.locator(".nbtrain-sweep-text")
        expect(text).to_contain_text("running", timeout=120_000)
        expect(view.locator(".js-plotly-plot")).to_have_count(1, timeout=60_000)
        page.screenshot(path=str(shots / "sweep-running.png"))

        # saved, its kernel shut down, the page reloaded: the view reads the sweep from its folder
        before = nb.stat().st_mtime_ns
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 30
        mime = "application/vnd.nbtrain.sweep-view+json"
        while nb.stat().st_mtime_ns == before or mime not in nb.read_text():
            assert time.monotonic() < deadline, "the notebook was not saved"
            time.sleep(0.2)
        for k in _kernels(url, token):
            req = urllib.request.Request(f"{url}/api/kernels/{k['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()
        page.reload()
        view = page.locator(".nbtrain-sweep-view")
        text = view.locator(".nbtrain-sweep-text")
        expect(text).to_contain_text("completed: 3/3 trials (3 completed)", timeout=240_000)
        page.wait_for_timeout(500)
        table = view.locator(".js-plotly-plot .table")
        expect(table).to_contain_text("★")
        view.scroll_into_view_if_needed()
        view.screenshot(path=str(shots / "sweep-done.png"))
        assert not _kernels(url, token) or all(k["execution_state"] != "busy" for k in _kernels(url, token))

        view.locator(".nbtrain-sweep-best").click()
        expect(view.locator(".nbtrain-sweep-note")).to_have_text("the best config is in the cell below")
        inserted = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".cm-content")
        expect(inserted).to_contain_text("# the best trial (")
        expect(inserted).to_contain_text("name: lr-best")
        assert view.locator(".nbtrain-sweep-stop").is_disabled()  # nothing left to stop

        # the sidebar: each trial's card says which trial of which sweep, the trials together in order
        page.locator('.jp-SideBar [data-id="nbtrain-runs"]').click()
        chips = page.locator(".nbtrain-run .nbtrain-run-sweep")
        expect(chips).to_have_text([f"trial {n} of sweep lr" for n in range(3)], timeout=30_000)
        page.locator(".nbtrain-filter").fill("sweep lr")
        expect(page.locator(".nbtrain-run")).to_have_count(3)
        page.locator("#nbtrain-runs").screenshot(path=str(shots / "sidebar-trials.png"))

        # the chip opens the sweep's page: the same view in the main area
        chips.first.click()
        sweep_page = page.locator(".nbtrain-sweep-page")
        expect(sweep_page.locator(".nbtrain-sweep-text")).to_contain_text(
            "completed: 3/3 trials", timeout=30_000
        )
        expect(sweep_page.locator(".js-plotly-plot")).to_have_count(1, timeout=30_000)
        expect(page.locator(".lm-TabBar-tab", has_text="sweep lr")).to_have_count(1)

        # clone trial 0 with a key outside the space changed (long enough to stop): a fourth trial, stopped
        # from the view while it runs; the sweep ends with it said so
        pick = sweep_page.locator(".nbtrain-sweep-pick")
        expect(pick.locator("option")).to_have_count(3)
        pick.select_option("0")
        assert sweep_page.locator(".nbtrain-sweep-trialstop").is_disabled()  # trial 0 has ended
        sweep_page.locator(".nbtrain-sweep-set").fill("train.max_steps=5000")
        sweep_page.locator(".nbtrain-sweep-fromckpt").check()  # from trial 0's weights (its output)
        sweep_page.locator(".nbtrain-sweep-clone").click()
        note = sweep_page.locator(".nbtrain-sweep-note")
        expect(note).to_contain_text(
            "trial 0 cloned (train.max_steps=5000, from its checkpoint)", timeout=30_000
        )
        expect(pick.locator("option")).to_have_count(4, timeout=60_000)
        pick.select_option("3")
        expect(pick.locator("option:checked")).to_have_text(
            "3 · clone of 0 (its weights) · learning_rate=0.003 max_steps=5000 · running", timeout=120_000
        )
        sweep_page.screenshot(path=str(shots / "sweep-page-clone-running.png"))
        stop = sweep_page.locator(".nbtrain-sweep-trialstop")
        expect(stop).to_be_enabled()
        stop.click()
        expect(note).to_have_text("trial 3 stopped; the sweep goes on", timeout=180_000)
        expect(sweep_page.locator(".nbtrain-sweep-text")).to_contain_text(
            "completed: 4/4 trials (3 completed, 1 stopped)", timeout=60_000
        )
        sweep_page.screenshot(path=str(shots / "sweep-page-done.png"))
    # the clone started from trial 0's adapter (its last checkpoint): its config says so, its worker loaded it
    from nbtrain.control.runs.run import last_checkpoint
    from nbtrain.control.sweep.sweep import get_sweep

    sweep = get_sweep(next((workdir / "runs" / "sweeps").iterdir()))
    clone, source = sweep.trial_run(3), sweep.trial_run(0)
    assert clone.resolved["config"]["init_from"] == str(last_checkpoint(source))
    assert "LoRA adapter weights from" in (clone.dir / "logs" / "rank0.log").read_text()
    assert not errors, errors
