"""The config panel in a real JupyterLab (headless chromium): the guided form as people see it (its
screenshot is the one in docs/screenshots/), "To cell" inserting the %%finetune cell below the panel at once
(through the lab extension's comm target, no other cell run first), and that cell running.

NBTRAIN_UPDATE_SCREENSHOTS=1 writes panel.png to docs/screenshots/ (otherwise it goes to the test's
artifacts folder only, so a test run never dirties the working tree)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

import nbtrain
from tests.browser.conftest import lab_page, write_notebook
from tests.browser.test_notebook_e2e import _kernel_idle
from tests.conftest import ROOT

pytestmark = pytest.mark.browser

DOCS = ROOT / "docs" / "screenshots"
CONFIG = (
    "model: ./tiny-llama\nobjective: sft\ndata: {train: data/add.jsonl, eval_split: 0.1}\n"
    "train: {max_steps: 40, learning_rate: 3.0e-3, per_device_train_batch_size: 4,\n"
    "        lr_scheduler_type: cosine}\n"
    "lora: {r: 16, alpha: 32}\nname: adder\n"
)
# Each label of the form: its text, whether it is cut off, and its tooltip.
LABELS_JS = """() => [...document.querySelectorAll('.nbtrain-panel .nbtrain-label')]
    .filter(l => l.offsetParent !== null)
    .map(l => ({text: l.textContent, cut: l.scrollWidth > l.clientWidth + 1, title: l.title}))"""

# The left and right edges of the Start step's fields and of what sits under them.
EDGES_JS = """() => {
    const step = [...document.querySelectorAll('.nbtrain-panel .nbtrain-step')][4];
    const edge = el => {
        const r = el.getBoundingClientRect();
        return [Math.round(r.left), Math.round(r.right)];
    };
    return {
        input: edge(step.querySelector("input[placeholder='e.g. 8xA100-40GB']")),
        plan: edge(step.querySelector('.nbtrain-plan')),
        buttons: edge(step.querySelector('.nbtrain-buttons')),
        launch: edge(step.querySelector('.nbtrain-buttons button')),
        note: edge(step.querySelector('.nbtrain-launch-off')),
    };
}"""


@pytest.fixture
def stop_runs_after(workdir: Path) -> Iterator[None]:
    """Runs are detached and outlive the kernel by design: stop what the test started."""
    yield
    for run in nbtrain.runs():
        if not run.status().done:
            run.stop(timeout=30)


def test_panel_form_and_to_cell_inserts_a_runnable_cell_at_once(
    lab: tuple[str, str], workdir: Path, shots: Path, stop_runs_after: None
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    write_notebook(
        workdir / "panel.ipynb",
        [
            nbformat.v4.new_code_cell(f"import nbtrain\nnbtrain.panel({CONFIG!r})"),
            nbformat.v4.new_markdown_cell("The end of the notebook."),
        ],
    )

    with lab_page(lab, "lab/tree/panel.ipynb", {"width": 1400, "height": 1900}) as (_, page, errors):
        # tall enough for the whole panel in one picture
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")  # JupyterLab's news toast
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")

        panel = page.locator(".nbtrain-panel")
        expect(panel).to_be_visible(timeout=60_000)
        # the data preview and the YAML come from the kernel's first check: the form is settled then
        expect(panel.locator(".nbtrain-preview")).to_contain_text("row 1", timeout=30_000)
        stop = panel.locator("button", has_text="Stop")
        expect(stop).to_be_disabled()  # nothing launched from it yet
        # what Launch would start, before it is pressed: the plan and its memory estimate
        plan = panel.locator(".nbtrain-plan")
        expect(plan).to_contain_text("Plan: lora sft on cpu", timeout=30_000)
        expect(plan).to_contain_text("learning rate 0.003")
        expect(plan).to_contain_text("Memory: ~")
        steps = page.evaluate(
            "() => [...document.querySelectorAll('.nbtrain-panel .nbtrain-step-title')]"
            ".map(t => t.childNodes[1].textContent)"
        )
        assert steps == ["Model", "Method", "Data", "Hyperparameters", "Start"]
        labels = page.evaluate(LABELS_JS)
        assert labels and not [lab for lab in labels if lab["cut"]], labels
        lr = next(lab for lab in labels if lab["text"] == "Learning rate")
        assert lr["title"].startswith("train.learning_rate"), lr
        rank = next(lab for lab in labels if lab["text"] == "LoRA rank")  # the config field's own words
        assert rank["title"].startswith("lora.r: The rank of the adapter matrices"), rank
        model_box = panel.locator("input[placeholder='./model-dir or org/name']")
        options = model_box.evaluate("i => [...(i.list ? i.list.options : [])].map(o => o.value)")
        assert "./tiny-llama" in options
        page.wait_for_timeout(300)
        output = cells.nth(0).locator(".jp-Cell-outputWrapper")
        output.screenshot(path=str(shots / "panel.png"))

        # To cell: the new cell is there at once, below the panel's cell, no other cell run first
        panel.locator("button", has_text="To cell").click()
        expect(cells).to_have_count(3, timeout=5_000)
        new = cells.nth(1)
        expect(new.locator(".cm-content")).to_contain_text("%%finetune", timeout=5_000)
        expect(panel).to_contain_text("below the panel: run it", timeout=5_000)
        page.screenshot(path=str(shots / "to-cell.png"))

        # and it runs: the run starts and its dashboard shows in that cell
        new.locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        expect(new.locator(".js-plotly-plot >> visible=true")).to_have_count(1, timeout=60_000)
        assert new.locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
        assert "Error" not in new.locator(".jp-Cell-outputWrapper").inner_text()
        page.screenshot(path=str(shots / "to-cell-ran.png"))

    assert not errors, errors
    (run,) = nbtrain.runs()
    assert run.name == "adder"
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "panel.png", DOCS / "panel.png")


def test_a_kernel_restart_keeps_the_form_an_empty_panel_cell_held(
    lab: tuple[str, str], workdir: Path, shots: Path, tmp_path: Path
) -> None:
    """Fields typed into ``nbtrain.panel()``, the kernel restarted, the cell run again: the same form."""
    from playwright.sync_api import expect

    from tests.browser.test_notebook_e2e import _kernel_ids, _post

    url, token = lab
    write_notebook(workdir / "keep.ipynb", [nbformat.v4.new_code_cell("import nbtrain\nnbtrain.panel()")])
    with lab_page(lab, "lab/tree/keep.ipynb", {"width": 1400, "height": 1400}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(1, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")

        def run_cell() -> Any:
            cells.nth(0).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            panel = page.locator(".nbtrain-panel")
            expect(panel).to_be_visible(timeout=60_000)
            return panel

        panel = run_cell()
        panel.locator("input[placeholder='./model-dir or org/name']").fill("./tiny-llama")
        panel.locator("input[placeholder='data/train.jsonl']").fill("data/add.jsonl")
        expect(panel.locator(".nbtrain-plan")).to_contain_text("Plan: lora sft", timeout=30_000)  # checked
        _kernel_idle(url, token)
        _post(url, token, f"api/kernels/{_kernel_ids(url, token)[0]}/restart")
        _kernel_idle(url, token, runtime=tmp_path / "jupyter_runtime")
        panel = run_cell()
        expect(panel.locator("input[placeholder='./model-dir or org/name']")).to_have_value(
            "./tiny-llama", timeout=30_000
        )
        expect(panel.locator("input[placeholder='data/train.jsonl']")).to_have_value("data/add.jsonl")
        expect(panel).to_contain_text("the form this cell held before the kernel restarted")
        expect(panel.locator(".nbtrain-plan")).to_contain_text("Plan: lora sft", timeout=30_000)
        page.screenshot(path=str(shots / "panel-after-restart.png"))

        # Save writes the form to a file; a second Save of that name asks before replacing it; Load
        # reads it back into a form that changed meanwhile
        panel.locator("input[placeholder='my-run.yaml']").fill("keep.yaml")
        save = panel.locator("button", has_text="Save")
        save.click()
        expect(panel).to_contain_text("saved to keep.yaml", timeout=10_000)
        save.click()
        expect(panel.locator("button", has_text="Replace")).to_be_visible(timeout=10_000)
        expect(panel).to_contain_text("keep.yaml exists: press Replace")
        panel.screenshot(path=str(shots / "panel-save-replace.png"))
        panel.locator("input[placeholder='./model-dir or org/name']").fill("./elsewhere")
        panel.locator("input[placeholder='run id or name, or a .yaml file']").fill("keep.yaml")
        panel.locator("button", has_text="Load").click()
        expect(panel).to_contain_text("loaded the form from keep.yaml", timeout=10_000)
        expect(panel.locator("input[placeholder='./model-dir or org/name']")).to_have_value("./tiny-llama")
    assert not errors, errors
    saved = yaml.safe_load((workdir / "keep.yaml").read_text())
    assert saved["model"] == "./tiny-llama" and saved["data"]["train"] == "data/add.jsonl"


def test_plan_for_named_hardware_shows_its_plan_and_turns_launch_off(
    lab: tuple[str, str], workdir: Path, shots: Path
) -> None:
    """Plan for: named hardware (issue 51): a spec the parser refuses is marked inline with its message; one
    it reads replaces the plan under the form with the plan for that hardware, and Launch is off saying why.
    NBTRAIN_UPDATE_SCREENSHOTS=1 writes panel-plan-for.png to docs/screenshots/."""
    from playwright.sync_api import expect

    url, token = lab
    write_notebook(
        workdir / "planfor.ipynb", [nbformat.v4.new_code_cell(f"import nbtrain\nnbtrain.panel({CONFIG!r})")]
    )
    with lab_page(lab, "lab/tree/planfor.ipynb", {"width": 1400, "height": 1900}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(1, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        panel = page.locator(".nbtrain-panel")
        plan = panel.locator(".nbtrain-plan")
        expect(plan).to_contain_text("Plan: lora sft on cpu", timeout=60_000)
        launch = panel.locator("button", has_text="Launch")
        expect(launch).to_be_enabled()

        panel.locator("select:has(option:text('named hardware: estimate only'))").select_option(
            label="named hardware: estimate only"
        )
        box = panel.locator("input[placeholder='e.g. 8xA100-40GB']")
        expect(box).to_be_visible(timeout=10_000)
        box.fill("1xA100")
        expect(panel).to_contain_text("say which, A100-40GB or A100-80GB", timeout=10_000)
        expect(launch).to_be_disabled()
        box.fill("8xA100-40GB")
        expect(plan).to_contain_text("Planned for named hardware: 8 x A100-40GB", timeout=30_000)
        expect(plan).to_contain_text("Plan: lora sft on cuda, 8 processes, bf16")
        expect(launch).to_be_disabled()
        expect(panel.locator(".nbtrain-launch-off")).to_contain_text(
            "planned for 8 x A100-40GB: the estimate only; runs start where they run"
        )
        expect(panel).not_to_contain_text("A100-40GB or A100-80GB")
        labels = page.evaluate(LABELS_JS)
        assert [lab["text"] for lab in labels if lab["text"] in ("Plan for", "Hardware")] == [
            "Plan for",
            "Hardware",
        ]
        assert not [lab for lab in labels if lab["cut"]], labels
        # what sits under the fields lines up with them: the boxes' left and right edges
        edges = page.evaluate(EDGES_JS)
        left, right = edges["input"]
        assert all(abs(edges[k][0] - left) <= 1 for k in ("plan", "launch")), edges
        assert all(abs(edges[k][1] - right) <= 2 for k in ("plan", "buttons", "note")), edges
        box.blur()
        page.wait_for_timeout(300)
        start = panel.locator(".nbtrain-step").nth(4)
        start.screenshot(path=str(shots / "panel-plan-for.png"))
        panel.screenshot(path=str(shots / "panel-plan-for-whole.png"))
    assert not errors, errors
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "panel-plan-for.png", DOCS / "panel-plan-for.png")
