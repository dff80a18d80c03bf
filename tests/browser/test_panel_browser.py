"""The config panel in a real JupyterLab (headless chromium): the guided form as people see it (its
screenshot is the one in docs/screenshots/), "To cell" inserting the %%finetune cell below the panel at once
(through the lab extension's comm target, no other cell run first), and that cell running; after Kernel >
Restart mid-run, the panel's one line and the run's live view without a kernel.

NBTRAIN_UPDATE_SCREENSHOTS=1 writes panel.png to docs/screenshots/ (otherwise it goes to the test's
artifacts folder only, so a test run never dirties the working tree)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import yaml

import nbtrain
from tests.browser.conftest import lab_page, write_notebook
from tests.browser.test_notebook_e2e import _kernel_idle
from tests.conftest import ROOT, lora_yaml

pytestmark = pytest.mark.browser

DOCS = ROOT / "docs" / "screenshots"
CONFIG = (
    "model: ./tiny-llama\nobjective: sft\ndata: {train: data/add.jsonl, eval_split: 0.1}\n"
    "train: {max_steps: 40, learning_rate: 3.0e-3, per_device_train_batch_size: 4,\n"
    "        lr_scheduler_type: cosine}\n"
    "lora: {r: 16, alpha: 32}\nname: adder\n"
)
# Each label of the form: its text, whether it is cut off, and its tooltip.
LOST_STEPS = 60  # the run restarted under, each step at least STEADY's 0.3 s: it outlives the restart
# The notebook's first cell: the magics, and a callback that keeps the run's steps from going faster than
# 0.3 s (the tiny model's steps take from 20 ms on an idle machine to 1 s on a busy one).
STEADY = """%load_ext nbtrain
import time
from transformers import TrainerCallback

class Steady(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.3)
"""
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
            nbformat.v4.new_code_cell("nbtrain.panel()"),  # a newcomer's empty form, last
        ],
    )

    with lab_page(lab, "lab/tree/panel.ipynb", {"width": 1400, "height": 1900}) as (_, page, errors):
        # tall enough for the whole panel in one picture
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(3, timeout=60_000)
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
        assert {"example: tiny-adder", "example: smollm2-135m-instruct"} <= set(options)  # by name
        page.wait_for_timeout(300)
        output = cells.nth(0).locator(".jp-Cell-outputWrapper")
        output.screenshot(path=str(shots / "panel.png"))

        # To cell: the new cell is there at once, below the panel's cell, no other cell run first
        panel.locator("button", has_text="To cell").click()
        expect(cells).to_have_count(4, timeout=5_000)
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
        # the header line lies under plotly's tool bar (shown on hover), not under its buttons
        plot = new.locator(".js-plotly-plot >> visible=true")
        plot.hover(position={"x": 300, "y": 300})
        head, bar = plot.locator(".gtitle").bounding_box(), plot.locator(".modebar").bounding_box()
        assert head and bar and head["y"] >= bar["y"] + bar["height"] - 1, (head, bar)

        # a newcomer's empty form: the planned values from the first moment, not TRL's 2e-05 / -1 / 3.0
        cells.nth(3).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        empty = page.locator(".nbtrain-panel").nth(1)
        expect(empty).to_be_visible(timeout=60_000)
        for holder in ("0.0002 (planned)", "planned: 3 epochs over the data", "3 (planned)"):
            expect(empty.locator(f"input[placeholder='{holder}']")).to_have_count(1, timeout=10_000)
        empty.locator("input[placeholder='./model-dir or org/name']").fill("./tiny-llama")
        empty.locator("input[placeholder='data/train.jsonl']").fill("data/add.jsonl")
        fresh = empty.locator(".nbtrain-plan")  # 400 rows of 8, 3 epochs: 150 steps at 2e-4, warned
        expect(fresh).to_contain_text("150 steps (3 epochs), learning rate 0.0002", timeout=30_000)
        expect(fresh).to_contain_text("Warning: likely to under-train: learning rate x steps = 0.0002 x 150")
        expect(empty.locator("input[placeholder='150 (planned: 3 epochs over the data)']")).to_have_count(1)
        page.wait_for_timeout(300)
        empty.locator(".nbtrain-step").nth(3).screenshot(path=str(shots / "panel-newcomer-steps.png"))
        empty.locator(".nbtrain-step").nth(4).screenshot(path=str(shots / "panel-newcomer-plan.png"))

    assert not errors, errors
    (run,) = nbtrain.runs()
    assert run.name == "adder"
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "panel.png", DOCS / "panel.png")
        shutil.copyfile(shots / "panel-newcomer-plan.png", DOCS / "panel-newcomer-plan.png")


def test_a_kernel_restart_mid_run_leaves_live_views_and_the_panel_says_how_to_get_its_form_back(
    lab: tuple[str, str], workdir: Path, shots: Path, tmp_path: Path, stop_runs_after: None
) -> None:
    """Fields typed into ``nbtrain.panel()``, a run started below it, Kernel > Restart mid-run: the panel is
    one line saying how to get the form back (not its widgets, each greyed with a broken link), the run's
    cell shows the live view without a kernel within 10 s, which reads "completed" within 10 s of the run
    completing and re-attaches; the panel's cell run again gives the same form.
    NBTRAIN_UPDATE_SCREENSHOTS=1 writes panel-restarted.png and view-restarted.png to docs/screenshots/."""
    from playwright.sync_api import expect

    from tests.browser.test_notebook_e2e import restart_kernel, title_step

    url, token = lab
    run_cell_source = "%%finetune --name lost\n" + lora_yaml(LOST_STEPS) + "hooks:\n  callbacks: [Steady]\n"
    write_notebook(workdir / "keep.ipynb", [STEADY, "import nbtrain\nnbtrain.panel()", run_cell_source])
    with lab_page(lab, "lab/tree/keep.ipynb", {"width": 1400, "height": 1400}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(3, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")

        def run_cell(i: int) -> None:
            cells.nth(i).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")

        run_cell(0)
        run_cell(1)
        panel = page.locator(".nbtrain-panel")
        expect(panel).to_be_visible(timeout=60_000)
        panel.locator("input[placeholder='./model-dir or org/name']").fill("./tiny-llama")
        panel.locator("input[placeholder='data/train.jsonl']").fill("data/add.jsonl")
        expect(panel.locator(".nbtrain-plan")).to_contain_text("Plan: lora sft", timeout=30_000)  # checked
        run_cell(2)
        started = time.monotonic()
        title = cells.nth(2).locator(".js-plotly-plot >> visible=true").locator(".gtitle")
        expect(title).to_contain_text("running", timeout=90_000)
        deadline = time.monotonic() + 60
        while title_step(title) < 1:  # the widget drew a step
            assert time.monotonic() < deadline, title.text_content()
            page.wait_for_timeout(250)
        _kernel_idle(url, token)
        print(f"restarted at step {title_step(title)} of {LOST_STEPS}, {time.monotonic() - started:.0f} s in")
        restart_kernel(page)

        # the panel: one line, none of its widgets' broken links
        lost_line = cells.nth(1).locator(".nbtrain-panel-lost")
        expect(lost_line).to_have_text(
            "kernel restarted: run this cell to get the form back; your values are kept", timeout=10_000
        )
        broken = cells.nth(1).locator(".nbtrain-panel .jupyter-widgets-disconnected >> visible=true")
        assert broken.count() == 0
        assert lost_line.evaluate("l => getComputedStyle(l.parentElement, '::before').display") == "none"
        # the run's cell: the live view without a kernel, within 10 s, following the run
        view = cells.nth(2).locator(".nbtrain-run-view")
        state = view.locator(".nbtrain-state")
        try:
            expect(state).to_have_text("running", timeout=10_000)
        except AssertionError:
            page.screenshot(path=str(shots / "restart-no-view.png"))
            raise
        widget_out = cells.nth(2).locator(".jp-OutputArea-child", has=page.locator(".nbtrain-live"))
        expect(widget_out).to_be_hidden()
        lost = title_step(widget_out.locator(".gtitle"))
        expect(view.locator(".nbtrain-page-updated")).to_contain_text(
            f"live view lost at step {lost}: following the run directory"
        )
        page.wait_for_timeout(300)
        cells.nth(1).locator(".jp-Cell-outputWrapper").screenshot(path=str(shots / "panel-restarted.png"))
        view.screenshot(path=str(shots / "view-restarted.png"))
        # it reads "completed" within 10 s of the run completing
        status_file = next((workdir / "runs").iterdir()) / "status.json"
        deadline = time.monotonic() + 300
        while json.loads(status_file.read_text())["state"] != "completed":
            assert time.monotonic() < deadline, status_file.read_text()
            time.sleep(0.2)
        print(f"completed {time.monotonic() - started:.0f} s in")
        expect(view.locator(".nbtrain-state")).to_have_text("completed", timeout=10_000)
        assert view.get_attribute("data-step") == str(LOST_STEPS)
        _kernel_idle(url, token, runtime=tmp_path / "jupyter_runtime")

        # the panel's cell run again: the same form
        run_cell(1)
        expect(panel).to_be_visible(timeout=60_000)
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
        # said beside Load, where the user looks (the status line is at the form's end)
        expect(panel.locator(".nbtrain-load-done")).to_have_text(
            "loaded the form from keep.yaml", timeout=10_000
        )
        expect(panel.locator("input[placeholder='./model-dir or org/name']")).to_have_value("./tiny-llama")
        panel.screenshot(path=str(shots / "panel-loaded.png"))

        # Re-attach in the run's view: a new cell right below the run's cell shows it live (here: its final
        # figure)
        before = cells.count()
        view.locator(".nbtrain-view-attach").click()
        expect(cells).to_have_count(before + 1, timeout=20_000)
        attach = cells.nth(3)
        expect(attach.locator(".cm-content")).to_contain_text("%finetune attach ", timeout=10_000)
        expect(attach.locator(".js-plotly-plot >> visible=true")).to_have_count(1, timeout=60_000)
        expect(attach.locator(".js-plotly-plot .gtitle")).to_contain_text("completed")
        expect(view.locator(".nbtrain-view-attach-note")).to_have_text("attached in the cell below")
    assert not errors, errors
    saved = yaml.safe_load((workdir / "keep.yaml").read_text())
    assert saved["model"] == "./tiny-llama" and saved["data"]["train"] == "data/add.jsonl"
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        for name in ("panel-restarted.png", "view-restarted.png"):
            shutil.copyfile(shots / name, DOCS / name)


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
        # two learning rates: a sweep, its trials planned for the same hardware, one at a time on its GPUs
        lr = "//label[normalize-space()='Learning rate']/ancestor::div[contains(@class,'widget-hbox')][1]"
        lr += "//input"
        panel.locator(lr).fill("1e-4, 1e-3")
        panel.locator(lr).press("Tab")
        expect(plan).to_contain_text(
            "Sweep: 2 trials (grid over train.learning_rate; eval_loss, lower is better), 1 at once: each "
            "trial plans for 8 CUDA devices",
            timeout=30_000,
        )
        expect(plan).to_contain_text("Each trial: lora sft on cuda, 8 processes, bf16")
        expect(plan).to_contain_text("learning rate swept")
        page.wait_for_timeout(300)
        start.screenshot(path=str(shots / "panel-plan-sweep.png"))
    assert not errors, errors
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "panel-plan-for.png", DOCS / "panel-plan-for.png")
