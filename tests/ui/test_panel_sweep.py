"""A sweep from the panel: several values in a box, separated by commas, are values to try (a sweep: section
in the YAML, the Sweep group shown); a loaded sweep fills the boxes back and keeps what they cannot show;
Launch starts the sweep and shows its view under the form, and Stop stops it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from nbtrain.ui.panel import ConfigPanel
from nbtrain.ui.sweeps import SWEEP_VIEW_MIME
from tests.conftest import lora_yaml


def test_values_separated_by_commas_make_a_grid_sweep_and_show_its_settings(
    make_panel: type[ConfigPanel],
) -> None:
    p = make_panel()
    assert p.groups["Sweep"].layout.display == "none"  # one value a box: no sweep, no settings
    p.fields["model"].value = "./tiny-llama"
    p.fields["train.learning_rate"].value = "1e-4, 3e-4,1e-3"
    p.fields["lora.r"].value = "4, 8"
    p.fields["train.max_steps"].value = "20,"  # a stray comma: one value
    cfg = p.to_dict()
    assert cfg["sweep"] == {
        "space": {"train.learning_rate": [1e-4, 3e-4, 1e-3], "lora.r": [4, 8]},
        "method": "grid",
    }
    assert cfg["train"] == {"max_steps": 20} and "lora" not in cfg  # the swept keys leave their sections
    assert p.groups["Sweep"].layout.display == ""
    p.fields["sweep.method"].value = "random"
    p.fields["sweep.trials"].value = "4"
    p.fields["sweep.prune"].value = "median"
    assert yaml.safe_load(p.to_yaml())["sweep"] == {
        "space": {"train.learning_rate": [1e-4, 3e-4, 1e-3], "lora.r": [4, 8]},
        "method": "random", "trials": 4, "prune": "median",
    }  # fmt: skip
    p.fields["lora.r"].value = "8"
    p.fields["train.learning_rate"].value = "3e-4"
    assert "sweep" not in p.to_dict()  # settings alone sweep nothing
    assert p.groups["Sweep"].layout.display == "none"


def test_a_loaded_sweep_fills_the_boxes_and_keeps_what_they_cannot_show(
    make_panel: type[ConfigPanel],
) -> None:
    loaded = {
        "model": "./tiny-llama",
        "data": {"train": "data/add.jsonl"},
        "train": {"max_steps": 10},
        "sweep": {
            "space": {
                "train.learning_rate": [1.0e-4, 1.0e-3],
                "lora.alpha": {"int": [8, 32]},  # a range: only the YAML says it
                "data.train": [["data/add.jsonl"], ["data/add.jsonl", "data/add.jsonl"]],  # a data mix
            },
            "trials": 6,
        },
    }
    p = make_panel(loaded)
    assert p.fields["train.learning_rate"].value == "0.0001, 0.001"
    assert p.fields["lora.alpha"].value == ""
    assert p.fields["sweep.method"].value == "tpe"  # the schema's default, as the config meant it
    cfg = p.to_dict()
    assert cfg["sweep"]["space"] == {
        "lora.alpha": {"int": [8, 32]},
        "data.train": [["data/add.jsonl"], ["data/add.jsonl", "data/add.jsonl"]],
        "train.learning_rate": [1.0e-4, 1.0e-3],
    }
    assert cfg["sweep"]["method"] == "tpe" and cfg["sweep"]["trials"] == 6
    assert cfg["train"] == {"max_steps": 10}


def test_a_sweeps_problem_shows_in_the_form_before_launch(make_panel: type[ConfigPanel]) -> None:
    p = make_panel()
    p.fields["model"].value = "./tiny-llama"
    p.fields["data.train"].value = "data/add.jsonl"
    p.fields["train.learning_rate"].value = "1e-4, 3e-4"
    p.fields["sweep.method"].value = "tpe"  # TPE needs a number of trials
    assert p.settle(60)
    said = " ".join([*p.problems.values(), *p.general_errors])
    assert "trials" in said, (p.problems, p.general_errors)
    p.launch_button.click()
    assert p.run is None and p.run_area.sweep is None  # nothing started


@pytest.mark.slow
def test_launch_starts_the_sweep_shows_its_view_and_stop_stops_it(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(3000))
    p.fields["train.learning_rate"].value = "1e-3, 2e-3"
    p.fields["sweep.metric"].value = "loss"  # the config holds out no eval rows
    p.fields["sweep.at_once"].value = "1"
    p.launch_button.click()
    assert p.general_errors == [], p.general_errors
    s = p.run_area.sweep
    assert s is not None and p.run is None
    assert f"started sweep {s.id}" in p.status_message and "1 at once as asked" in p.status_message
    (out,) = p.live.children
    assert out.outputs[0]["data"][SWEEP_VIEW_MIME] == {"sweep_id": s.id, "name": s.name}
    assert not p.stop_button.disabled
    # once its first trial trains, Stop stops the sweep (each trial at a checkpoint) and says so
    deadline = time.monotonic() + 180
    while not any(t["state"] == "running" and (t.get("step") or 0) > 0 for t in s.status().trials):
        assert time.monotonic() < deadline, s.status().describe()
        time.sleep(0.2)
    p.stop_button.click()
    assert p.settle(240)
    assert s.status().state == "stopped", s.status().describe()
    assert f"sweep {s.id}: stopped" in p.status_message, p.status_message


@pytest.mark.slow
def test_a_sweep_that_ends_by_itself_disables_stop_and_says_how_it_ended(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(2))
    p.fields["train.learning_rate"].value = "1e-3, 2e-3"
    p.fields["sweep.metric"].value = "loss"
    p.launch_button.click()
    s = p.run_area.sweep
    assert s is not None and not p.stop_button.disabled, (p.general_errors, p.status_message)
    deadline = time.monotonic() + 180
    while not (p.stop_button.disabled and f"sweep {s.id}: completed" in p.status_message):
        assert time.monotonic() < deadline, (s.status().describe(), p.status_message)
        time.sleep(0.2)
    assert s.status().state == "completed"


def test_the_plan_before_launch_says_the_sweeps_trials_how_many_at_once_and_why(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel(lora_yaml(20))
    p.fields["train.learning_rate"].value = "1e-4, 1e-3"
    p.fields["lora.r"].value = "4, 8"
    p.fields["sweep.metric"].value = "loss"
    assert p.settle(60)
    sweep_line, each, batch = p.plan_text[:3]
    assert sweep_line.startswith(
        "Sweep: 4 trials (grid over train.learning_rate, lora.r; loss, lower is better), "
    ), p.plan_text
    assert " at once (limited by " in sweep_line and "GiB each" in sweep_line, sweep_line
    assert each.startswith("Each trial: lora sft on cpu"), p.plan_text
    assert batch.endswith("learning rate swept"), p.plan_text
    # the base config's planned learning rate is never trained: the warnings are the trials' (each end of the
    # space under-trains at 20 steps)
    (warning,) = [w for w in p.plan_text if w.startswith("Warning: ")]
    assert "0.0002 x 20" not in warning and "0.0001 x 20" in warning, warning
    assert warning.endswith("(at learning_rate=0.0001 r=4; the space's other ends warn so too)"), warning
    p.fields["train.max_steps"].value = "2000"  # at 1e-4 it trains enough, at 1e-3 too: no warning
    assert p.settle(60)
    assert not [w for w in p.plan_text if w.startswith("Warning: ")], p.plan_text
