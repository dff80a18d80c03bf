"""The chat widget in a real JupyterLab (headless chromium) against a real server of (a copy of) the shared
tuned run: Shift+Enter in its text box adds a line and does not run the cell, Enter sends, the reply grows
on the page as it streams, a server stopped elsewhere is said so, Restart brings it back and Send sends.

NBTRAIN_UPDATE_SCREENSHOTS=1 writes the picture to docs/screenshots/chat.png (otherwise it goes to the
test's artifacts folder only, so a test run never dirties the working tree)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from tests.browser.conftest import lab_page, write_notebook
from tests.browser.test_notebook_e2e import _kernel_idle
from tests.conftest import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # the shared tuned run is a real training process

DOCS = ROOT / "docs" / "screenshots"
# Every text the base model's reply showed on the page while it came (a MutationObserver, from before Enter).
WATCH_JS = """() => {
    window.__nbtrainShown = [];
    const log = document.querySelector('.nbtrain-chat-log');
    new MutationObserver(() => {
        const t = [...log.querySelectorAll('.nbtrain-chat-base .nbtrain-chat-text')].pop();
        if (t && t.textContent) window.__nbtrainShown.push(t.textContent);
    }).observe(log, {childList: true, subtree: true, characterData: true});
}"""


def test_chat_in_jupyterlab_enter_sends_shift_enter_adds_a_line_and_replies_stream(
    lab: tuple[str, str], tmp_path: Path, tuned_run: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    run = tmp_path / "runs" / "tuned"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("checkpoints", "serve.json", "logs"))
    write_notebook(
        tmp_path / "chat.ipynb",
        [
            nbformat.v4.new_code_cell(
                f"import nbtrain\nrun = nbtrain.get_run({str(run)!r})\nchat = run.chat(compare_base=True, "
                "max_tokens=40)\nchat"
            ),
            nbformat.v4.new_code_cell("run.stop_serving()"),
        ],
    )

    with lab_page(lab, "lab/tree/chat.ipynb", {"width": 1100, "height": 900}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(2, timeout=60_000)
        _kernel_idle(url, token)
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # runs the chat cell; the second cell becomes the active one
        box = page.locator(".nbtrain-chat textarea")
        expect(box).to_be_visible(timeout=60_000)
        status = cells.nth(0).locator(".widget-html-content").first
        try:
            expect(status).to_contain_text("served at", timeout=120_000)
        except AssertionError:
            page.screenshot(path=str(shots / "no-server.png"))
            raise
        # Which cell is active and what each cell's prompt says: running a cell would change them.
        cells_state = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(c =>
            [c.classList.contains('jp-mod-active'), c.querySelector('.jp-InputPrompt').textContent])"""

        # Shift+Enter in the box adds a line: it neither sends nor runs a cell.
        box.click()
        before = page.evaluate(cells_state)
        page.keyboard.type("What is 2 + 3?")
        page.keyboard.press("Shift+Enter")
        page.keyboard.type("Answer briefly.")
        expect(box).to_have_value("What is 2 + 3?\nAnswer briefly.")
        assert page.evaluate(cells_state) == before and cells.count() == 2
        assert page.locator(".nbtrain-chat-user").count() == 0

        # Enter sends: the box empties, the message shows, the reply grows as it streams.
        page.evaluate(WATCH_JS)
        page.keyboard.press("Enter")
        expect(box).to_have_value("", timeout=10_000)
        expect(page.locator(".nbtrain-chat-user")).to_have_count(1)
        expect(page.locator(".nbtrain-chat-user .nbtrain-chat-text")).to_have_text(
            "What is 2 + 3?\nAnswer briefly."
        )
        expect(page.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=120_000)
        shown = page.evaluate("() => window.__nbtrainShown")
        final = page.locator(".nbtrain-chat-base .nbtrain-chat-text").last.text_content() or ""
        assert final and len(set(shown)) > 1 and all(final.startswith(s) for s in shown), shown
        expect(page.locator(".nbtrain-chat-tuned .nbtrain-chat-text")).not_to_have_text("")
        assert page.evaluate(cells_state) == before and cells.count() == 2
        cells.nth(0).scroll_into_view_if_needed()
        chat_area = cells.nth(0).locator(".jp-OutputArea")
        chat_area.screenshot(path=str(shots / "chat.png"))

        # The server stopped from another cell: the widget says so; Restart serves again.
        cells.nth(1).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        expect(status).to_contain_text("The model server has stopped", timeout=30_000)
        restart = page.locator(".nbtrain-chat-restart, button", has_text="Restart server")
        expect(restart).to_be_visible()
        chat_area.screenshot(path=str(shots / "chat-server-gone.png"))
        restart.click()
        expect(status).to_contain_text("served at", timeout=120_000)
        expect(restart).to_be_hidden()
        expect(page.locator(".nbtrain-chat-user")).to_have_count(1)  # the conversation is kept
        box.fill("Say hello.")
        page.locator(".nbtrain-chat-send").click()  # the Send button, as Enter
        expect(page.locator(".nbtrain-chat-user")).to_have_count(2, timeout=10_000)
        expect(box).to_have_value("")
        expect(page.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=120_000)
    assert not errors, errors
    if os.environ.get("NBTRAIN_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "chat.png", DOCS / "chat.png")


def test_a_picture_attached_in_the_chat_goes_with_the_message_and_shows_in_the_transcript(
    lab: tuple[str, str], tmp_path: Path, tiny_vlm: Path, shots: Path
) -> None:
    """A vision-language run's chat in JupyterLab: Image opens the file chooser, the picture shows beside
    the box (x removes it), Enter sends it with the text, the transcript shows it, the model answers."""
    from playwright.sync_api import expect

    import nbtrain
    from nbtrain.examples_vision import QUESTION, write_image_dataset

    url, token = lab
    data = write_image_dataset(tmp_path / "data" / "colours.jsonl", n=96)
    run = nbtrain.finetune(
        f"""model: {tiny_vlm}
method: lora
data: {{train: {data}}}
lora: {{r: 8, alpha: 16, dropout: 0.0}}
train: {{max_steps: 80, learning_rate: 2.0e-2, per_device_train_batch_size: 4, assistant_only_loss: true,
         gradient_checkpointing: false}}
""",
        name="colours-chat",
    )
    assert run.wait(timeout=600).state == "completed", run.logs(40)
    picture = sorted((data.parent / "colours_img").glob("*-green.png"))[0]
    cell = f"import nbtrain\nchat = nbtrain.get_run({str(run.dir)!r}).chat(max_tokens=4)\nchat"
    write_notebook(tmp_path / "vision-chat.ipynb", [cell])
    with lab_page(lab, "lab/tree/vision-chat.ipynb", {"width": 1100, "height": 800}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(1, timeout=60_000)
        _kernel_idle(url, token)
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        status = cells.nth(0).locator(".widget-html-content").first
        expect(status).to_contain_text("served at", timeout=120_000)
        attach = page.locator(".nbtrain-chat-attach")
        expect(attach).to_be_visible()
        with page.expect_file_chooser() as chooser:
            attach.click()
        chooser.value.set_files(str(picture))
        chip = page.locator(".nbtrain-chat-chip img")
        expect(chip).to_be_visible(timeout=10_000)
        page.locator(".nbtrain-chat textarea").fill(QUESTION)
        page.locator(".nbtrain-chat textarea").press("Enter")
        expect(page.locator(".nbtrain-chat-user .nbtrain-chat-image")).to_have_count(1, timeout=10_000)
        expect(chip).to_be_hidden()  # the picture went with the message
        expect(page.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=120_000)
        expect(page.locator(".nbtrain-chat-tuned .nbtrain-chat-text")).to_have_text("green")
        cells.nth(0).locator(".jp-OutputArea").screenshot(path=str(shots / "chat-image.png"))
    run.stop_serving()
    assert not errors, errors
