"""Fixtures of the widget tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nbtrain.ui.panel import ConfigPanel


@pytest.fixture
def make_panel() -> Iterator[type[ConfigPanel]]:
    """ConfigPanel, with every panel made in the test closed afterwards (threads, live views)."""
    made: list[ConfigPanel] = []

    class Tracked(ConfigPanel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    yield Tracked
    for p in made:
        p.close()
