"""Jupyter server extension: a REST API over the run registry for the JupyterLab sidebar.

Enabled on install by ``jupyter-config/jupyter_server_config.d/nbtrain.json`` (shipped as wheel
shared-data). It lives in ``nbtrain.ui.server`` rather than the top-level package so the server imports only
what the handlers need, and kernels that ``import nbtrain`` never import jupyter_server.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbtrain.ui.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from nbtrain.ui.server.handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("nbtrain: REST API at %snbtrain/", serverapp.web_app.settings.get("base_url", "/"))
