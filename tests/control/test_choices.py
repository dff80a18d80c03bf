"""The layering of the config: one place for the choices, and no import of the preset or the plan by
the schema (the cycle config <-> preset <-> plan <-> memory is gone)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import get_args

from nbtrain.contract.objectives import OBJECTIVE_NAMES, OBJECTIVES
from nbtrain.control.config.choices import METHODS, OFFLOADS, STRATEGIES, AvailableObjective, ObjectiveName
from nbtrain.control.config.preset import Preset
from nbtrain.control.config.schema import DistributedSettings, RunConfig


def test_the_schema_and_the_preset_take_the_choices_from_one_place() -> None:
    assert get_args(RunConfig.model_fields["method"].annotation) == ("auto", *METHODS)
    assert get_args(DistributedSettings.model_fields["strategy"].annotation) == ("auto", *STRATEGIES)
    assert get_args(DistributedSettings.model_fields["offload"].annotation) == OFFLOADS
    for rule, choices in (("methods", METHODS), ("strategies", STRATEGIES)):
        listed = get_args(Preset.model_fields[rule].annotation)[0]  # list[...] | None
        assert get_args(get_args(listed)[0]) == choices
    assert set(get_args(ObjectiveName)) == set(OBJECTIVE_NAMES)
    assert set(get_args(AvailableObjective)) == set(OBJECTIVES)


def test_the_config_loader_imports_neither_the_preset_the_planner_nor_runs_or_tracking() -> None:
    code = (
        "import sys, json, nbtrain.control.config.load\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('nbtrain.control.config.preset', "
        "'nbtrain.control.plan', 'nbtrain.control.memory', 'nbtrain.control.prepare', "
        "'nbtrain.control.launch.tracking', 'nbtrain.control.runs', 'nbtrain.control.launch.process')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
