"""LiveView (the panel's and a plain notebook's HTML view of a run): the one metrics reader and the one
follow loop underneath it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbtrain.ui.live import LiveView
from tests.control.runs.test_metrics import RunFiles

TIMEOUT = 10.0


class FakeHandle:
    def __init__(self, bundle: dict[str, str]) -> None:
        self.bundles = [bundle]

    def update(self, bundle: dict[str, str], raw: bool = False) -> None:
        assert raw
        self.bundles.append(bundle)


@pytest.fixture
def displayed(monkeypatch: pytest.MonkeyPatch) -> list[FakeHandle]:
    handles: list[FakeHandle] = []

    def display(bundle: dict[str, str], raw: bool = False, display_id: bool = False) -> FakeHandle:
        assert raw and display_id
        handles.append(FakeHandle(bundle))
        return handles[-1]

    monkeypatch.setattr("IPython.display.display", display)
    return handles


@pytest.fixture
def files(tmp_path: Path) -> Iterator[RunFiles]:
    f = RunFiles(tmp_path / "run1", name="live", max_steps=20)
    yield f
    f.close()


def test_view_shows_first_and_last_loss_and_the_latest_rows(files: RunFiles) -> None:
    written = files.steps(1, 11)
    view = LiveView(files.run, rows=3)
    html = view.render(view.poll())
    assert view.records == 10 and [r["step"] for r in view.recent] == [8, 9, 10]
    assert view.first_loss == written[0]["loss"] and view.last_loss == written[-1]["loss"]
    assert "(start 3)" in html and html.count("<tr>") == 4  # header + 3 rows


def test_a_null_loss_and_a_torn_line_leave_the_view_drawing(files: RunFiles) -> None:
    files.steps(1, 3)
    files.step(3, loss=float("nan"))  # written as null (and named in "nonfinite")
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write('{"t": 1.0, "step": 4, "loss": 0.')
    view = LiveView(files.run)
    view.render(view.poll())
    assert view.records == 3
    assert view.last_loss == pytest.approx(3.0 / 2**0.5)  # step 2's: a null is not a loss
    with open(files.paths.metrics, "a", encoding="utf-8") as f:
        f.write("25}\n")
    view.poll()
    assert view.last_loss == 0.25 and view.records == 4


def test_follow_updates_until_the_run_ends_with_every_step_in_its_last_frame(
    files: RunFiles, displayed: list[FakeHandle]
) -> None:
    view = LiveView(files.run, interval=0.02, rows=50)

    def worker() -> None:
        time.sleep(0.1)
        files.steps(1, 21)
        files.status("completed", step=20)

    t = threading.Thread(target=worker)
    t.start()
    st = view.follow(timeout=TIMEOUT)
    t.join()
    assert st.state == "completed" and view.records == 20
    last: dict[str, Any] = displayed[0].bundles[-1]
    assert "completed" in last["text/html"] and "<td>20</td>" in last["text/html"]


def test_follow_timeout_names_the_run_and_its_state(files: RunFiles, displayed: list[FakeHandle]) -> None:
    view = LiveView(files.run, interval=0.02)
    with pytest.raises(TimeoutError, match=r"still running \(step 0/20\) after 0.1 s"):
        view.follow(timeout=0.1)


def test_background_view_stops_when_the_run_ends_and_on_close(
    files: RunFiles, displayed: list[FakeHandle]
) -> None:
    view = LiveView(files.run, interval=0.02)
    view.show()
    assert view._thread is not None
    files.steps(1, 3)
    files.status("completed", step=2)
    view._thread.join(TIMEOUT)
    assert not view._thread.is_alive() and view.error is None
    assert "completed" in displayed[0].bundles[-1]["text/plain"]

    files.status("running", step=2)
    other = LiveView(files.run, interval=0.02)
    other.show()
    other.close()
    assert other._thread is not None and not other._thread.is_alive()
