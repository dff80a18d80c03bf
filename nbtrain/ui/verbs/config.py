"""The verbs that help write a config: ``panel`` (the form that builds one, or fills it from a run's) and
``preview`` (the first examples as the model sees them, and token-length statistics). The table
(``nbtrain.ui.verbs``) names them, and the one-line ``help``, ``tiny-model`` and ``example-data``."""

from __future__ import annotations

from typing import Any

from nbtrain.ui.verb import Args


def panel(a: Args) -> Any:
    from nbtrain.ui.panel import ConfigPanel
    from nbtrain.ui.panel import panel as new_panel

    return ConfigPanel.from_run(a.run) if a.run else new_panel(None)


def preview(a: Args) -> Any:
    from nbtrain.ui.preview import preview as first_rows

    return first_rows(a.config, n=a.n, stats_rows=a.stats_rows)
