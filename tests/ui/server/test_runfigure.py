"""The run page's figure and log through a real Jupyter server: the notebook dashboard's own figure of the
run directory (its panels, controls, traces), answered again only when it changed; the trainer's printed
metrics dicts in the log made readable."""

from __future__ import annotations

import json
import time
from typing import Any

from nbtrain.contract.rundir import JsonlWriter
from tests.ui.server.fakes import make_run

Fetch = Any  # pytest-jupyter's jp_fetch factory (untyped)


async def _figure(jp_fetch: Fetch, run_id: str, **params: str) -> Any:
    resp = await jp_fetch("nbtrain", "runs", run_id, "figure", params=params)
    assert resp.code == 200
    return json.loads(resp.body)


async def test_the_figure_is_the_dashboards_and_comes_again_only_when_the_run_moved(jp_fetch: Fetch) -> None:
    paths = make_run("fig-1", state="running", step=3, losses=(2.0, 1.5, 1.25))
    first = await _figure(jp_fetch, "fig-1")
    fig = first["figure"]
    keys = [tuple(t["meta"]) for t in fig["data"]]
    assert keys[:2] == [("metric", "loss"), ("smooth", "loss")]  # the loss controls act on traces 0 and 1
    assert {("metric", "lr"), ("metric", "grad_norm"), ("smooth", "tokens_per_s")} <= set(keys)
    assert [m["name"] for m in fig["layout"]["updatemenus"]] == ["loss-curve", "loss-scale"]
    panels = {a["name"] for a in fig["layout"]["annotations"]}
    assert {"panel:loss", "panel:lr", "panel:grad_norm", "panel:tokens_per_s", "panel:memory"} <= panels
    # the page says the header, the progress and the error itself, and gives the figure its width
    layout = fig["layout"]
    assert "width" not in layout and not layout.get("shapes") and not layout.get("title", {}).get("text")

    same = await _figure(jp_fetch, "fig-1", since=first["version"])
    assert same["figure"] is None and same["version"] == first["version"]

    w = JsonlWriter(paths.metrics, "metrics")
    w.write({"t": time.time(), "step": 4, "loss": 1.0, "eval_loss": 1.1})
    w.close()
    moved = await _figure(jp_fetch, "fig-1", since=first["version"])
    assert moved["version"] != first["version"] and moved["caught_up"]
    keys = [tuple(t["meta"]) for t in moved["figure"]["data"]]
    assert ("metric", "eval_loss") in keys


async def test_the_log_shows_the_trainers_metrics_dicts_as_readable_lines(jp_fetch: Fetch) -> None:
    paths = make_run("log-2", state="running")
    paths.rank_log(0).write_text(
        "loading the model\n{'loss': '3.086', 'grad_norm': 2.5, 'learning_rate': 0.0002167, 'epoch': 1}\n",
        encoding="utf-8",
    )
    resp = await jp_fetch("nbtrain", "runs", "log-2", "logs", params={"n": 5})
    text = json.loads(resp.body)["text"]
    assert text == "loading the model\nloss 3.086 · grad_norm 2.5 · learning_rate 0.0002167 · epoch 1"
