"""pytest-jupyter's server fixtures, for the tests in this folder only.

Imported here rather than named in ``pytest_plugins`` at the top level: the plugin brings autouse fixtures
(an asyncio loop per test) and collection hooks that the rest of the suite should not pay for.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 - fixtures and hooks, scoped to this folder
from traitlets.config import Config

from tests.conftest import ROOT


# Replaces the plugin's default on purpose (mypy sees a redefinition of the star-imported name).
@pytest.fixture  # type: ignore[no-redef]
def jp_server_config() -> Any:
    # The config file the wheel installs into etc/jupyter, so the tests enable the extension as users get it.
    shipped = ROOT / "jupyter-config" / "jupyter_server_config.d" / "nbtrain.json"
    return Config(json.loads(shipped.read_text(encoding="utf-8")))
