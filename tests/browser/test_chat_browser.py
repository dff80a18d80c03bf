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
    from nbtrain.examples.vision import QUESTION, write_image_dataset

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


NOTEBOOK_TOOLS = '''\
import nbtrain

def get_weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name
    """
    return "sunny"

def broken(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name
    """
    raise ValueError(f"no weather station in {city}")
'''


def test_a_chat_with_a_notebook_function_asks_runs_it_and_shows_a_failing_ones_traceback(
    lab: tuple[str, str], tmp_path: Path, tool_chat_run: Path, shots: Path
) -> None:
    from playwright.sync_api import expect

    url, token = lab
    run = tmp_path / "runs" / "tools"
    shutil.copytree(tool_chat_run, run, ignore=shutil.ignore_patterns("checkpoints", "serve.json", "logs"))
    write_notebook(
        tmp_path / "tools.ipynb",
        [
            NOTEBOOK_TOOLS,
            f"%load_ext nbtrain\n%finetune chat {run} --tools get_weather --max-tokens 40",
            "broken.__name__ = 'get_weather'  # the same tool, as the model knows it, that fails\n"
            f"w = nbtrain.get_run({str(run)!r}).chat(tools=[broken], confirm_tools=False, max_tokens=40)\n"
            "w.clear()  # a new conversation: the model was taught single requests\nw",
            'w.clear()\nw.max_tokens.value = 6  # the call begins, cut off\nw.send("Weather in Paris?")',
        ],
    )
    with lab_page(lab, "lab/tree/tools.ipynb", {"width": 1000, "height": 1000}) as (_, page, errors):
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(4, timeout=60_000)
        _kernel_idle(url, token)
        page.add_style_tag(content=".Toastify { display: none !important }")
        for i in range(2):
            cells.nth(i).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
        chat = cells.nth(1)
        expect(chat.locator(".widget-html-content").first).to_contain_text("served at", timeout=120_000)
        expect(chat.locator(".nbtrain-chat-empty")).to_contain_text("It may call your functions: get_weather")
        chat.locator("textarea").fill("Weather in Paris?")
        chat.locator(".nbtrain-chat-send").click()
        call = chat.locator(".nbtrain-chat-call")
        expect(call.locator(".nbtrain-chat-call-sig")).to_have_text(
            "get_weather(city='Paris')", timeout=60_000
        )
        expect(call.locator(".nbtrain-chat-call-state")).to_have_text("run it?")
        page.wait_for_timeout(300)
        chat.locator(".jp-OutputArea").screenshot(path=str(shots / "tool-asking.png"))
        call.locator("button", has_text="Run").click()
        expect(call.locator(".nbtrain-chat-call-state")).to_have_text("returned", timeout=30_000)
        expect(call.locator(".nbtrain-chat-call-result")).to_have_text("sunny")
        expect(chat.locator(".nbtrain-chat-tuned .nbtrain-chat-text").last).to_have_text(
            "It is sunny in Paris.", timeout=60_000
        )
        expect(chat.locator(".nbtrain-chat-call-ask")).to_have_count(0)
        page.wait_for_timeout(300)
        chat.locator(".jp-OutputArea").screenshot(path=str(shots / "tool-answered.png"))

        # a function that raises, run without asking: its traceback in the chat, and the chat goes on
        cells.nth(2).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        other = cells.nth(2)
        expect(other.locator(".widget-html-content").first).to_contain_text("served at", timeout=120_000)
        other.locator("textarea").fill("Weather in Paris?")
        other.locator(".nbtrain-chat-send").click()
        failed = other.locator(".nbtrain-chat-call-error")
        expect(failed.locator(".nbtrain-chat-call-state")).to_have_text("failed", timeout=60_000)
        expect(failed.locator(".nbtrain-chat-call-result")).to_contain_text("ValueError: no weather station")
        expect(other.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=60_000)
        other.locator("textarea").fill("Thanks!")
        other.locator(".nbtrain-chat-send").click()
        expect(other.locator(".nbtrain-chat-user")).to_have_count(2, timeout=10_000)
        expect(other.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=60_000)
        page.wait_for_timeout(300)
        other.locator(".jp-OutputArea").screenshot(path=str(shots / "tool-failed.png"))

        # a call the server cannot read (cut off by max_tokens): shown as a malformed call, nothing run
        cells.nth(3).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        bad = other.locator(".nbtrain-chat-call-malformed")
        expect(bad.locator(".nbtrain-chat-call-state")).to_have_text("malformed call", timeout=60_000)
        expect(bad.locator(".nbtrain-chat-call-sig")).to_contain_text("<call>")
        expect(bad.locator(".nbtrain-chat-call-result")).to_contain_text("nothing was run")
        expect(other.locator(".nbtrain-chat-typing")).to_have_count(0, timeout=60_000)
        page.wait_for_timeout(300)
        other.locator(".jp-OutputArea").screenshot(path=str(shots / "tool-malformed.png"))
    assert not errors, errors
