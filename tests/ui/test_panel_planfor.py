"""The panel's "Plan for" (issue 51): the plan and estimate under the form made for this machine, a SLURM
partition's nodes (the config's ``distributed: slurm: partition:``) or hardware the user names ("1xT4", read
by ``nbtrain.hardware.named.parse``); named hardware is an estimate only, so Launch is off and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nbtrain.control.launch import partition
from nbtrain.hardware.named import parse
from nbtrain.ui.panel import ConfigPanel
from nbtrain.ui.panel.planfor import COMMON, HERE, NAMED, SLURM

CONFIG = "model: ./tiny-llama\ndata: {train: data/add.jsonl}\ntrain: {max_steps: 2}\n"


def _settled(p: ConfigPanel) -> ConfigPanel:
    assert p.settle(60), "the panel's background check did not finish"
    return p


def test_the_hardware_box_offers_specs_the_parser_reads() -> None:
    assert {"1xT4", "1xL4", "1x4090", "1xA100-80GB", "8xA100-40GB", "8xH100-80GB", "2x8xH100-80GB",
            "M3-MAX-64GB"} <= set(COMMON)  # fmt: skip
    for spec in COMMON:
        parse(spec)


def test_named_hardware_plans_for_it_and_launch_is_off_saying_why(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = _settled(make_panel(CONFIG))
    assert p.plan_text[0].startswith("Plan: lora sft on cpu") and not p.launch_button.disabled
    assert p.plan_for.widget.layout.display != "none" and p.plan_for.choice.value == HERE
    p.plan_for.choice.value = NAMED
    p.plan_for.hardware.value = "1xT4"
    _settled(p)
    first, plan = p.plan_text[0], p.plan_text[1]
    assert first.startswith("Planned for named hardware: 1 x T4 (15 GiB each, no bf16 (fp16)"), first
    assert plan.startswith("Plan: lora sft on cuda, 1 process, fp16"), plan
    assert (p.planned_plan["device"], p.planned_plan["precision"]) == ("cuda", "fp16")
    memory = next(line for line in p.plan_text if line.startswith("Memory:"))  # warnings may follow it
    assert "of 15.0 GiB" in memory and "per GPU" in memory
    assert "Planned for named hardware: 1 x T4" in p.plan_area.value
    why = "planned for 1 x T4: the estimate only; runs start where they run — use a SLURM partition or "
    assert p.launch_button.disabled and p.launch_button.tooltip.startswith(why)
    assert why in p.plan_for.note.value
    p.launch_button.click()  # from code a disabled button's handler still runs: it refuses
    assert p.run is None and any(why in e for e in p.general_errors), p.general_errors
    # To cell asks for the same estimate; the YAML (Save's) is the config, with no hardware in it
    assert p.plan_for.magic_line() == "%%finetune --estimate --on 1xT4"
    assert yaml.safe_load(p.to_yaml()) == yaml.safe_load(CONFIG)
    p.plan_for.choice.value = HERE  # back: this machine's plan, Launch on
    _settled(p)
    assert p.plan_text[0].startswith("Plan: lora sft on cpu") and not p.launch_button.disabled
    assert p.launch_button.button_style == "success" and p.plan_for.note.value == ""
    assert p.plan_for.magic_line() == "%%finetune" and p.general_errors == []


def test_a_bad_hardware_spec_shows_the_parsers_message_inline_and_no_plan(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = _settled(make_panel(CONFIG))
    p.plan_for.choice.value = NAMED
    p.plan_for.hardware.value = "1xA100"
    _settled(p)
    with pytest.raises(ValueError) as e:
        parse("1xA100")
    assert "A100-40GB or A100-80GB" in str(e.value)
    assert p.plan_for.error == str(e.value)
    assert "A100-40GB or A100-80GB" in p.plan_for.error_label.value
    assert "nbtrain-invalid" in p.plan_for.hardware._dom_classes
    assert p.plan_text == [] and p.launch_button.disabled and p.general_errors == []
    assert p.plan_for.magic_line() == "%%finetune"  # no spec nbtrain reads: a plain cell
    p.plan_for.hardware.value = "8xA100-40GB"
    _settled(p)
    assert p.plan_for.error == "" and "nbtrain-invalid" not in p.plan_for.hardware._dom_classes
    assert p.plan_text[0].startswith("Planned for named hardware: 8 x A100-40GB")
    assert "8 processes" in p.plan_text[1]


def test_a_slurm_partition_is_the_configs_and_plans_for_its_nodes(
    workdir: Path, make_panel: type[ConfigPanel], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = partition.Node("g1", 32, 256_000, "gpu:h100:4", 4, "h100")
    monkeypatch.setattr(partition, "read", lambda name: partition.Partition(name or "main", (node,)))
    p = _settled(make_panel(CONFIG + "distributed: {slurm: {partition: gpu, time: '01:00:00'}}\n"))
    assert p.plan_for.choice.value == SLURM and p.plan_for.partition.value == "gpu"  # from the config
    assert p.plan_text[0].startswith("Planned for SLURM partition gpu: 1 node of 4 x H100-80GB"), p.plan_text
    assert not p.launch_button.disabled and p.plan_for.note.value == ""
    p.plan_for.partition.value = "big"
    _settled(p)
    assert yaml.safe_load(p.to_yaml())["distributed"] == {"slurm": {"partition": "big", "time": "01:00:00"}}
    assert p.plan_text[0].startswith("Planned for SLURM partition big")
    p.plan_for.choice.value = HERE  # this machine: no slurm: in the config ...
    _settled(p)
    assert "distributed" not in yaml.safe_load(p.to_yaml()) and p.plan_text[0].startswith(
        "Plan: lora sft on cpu"
    )
    p.plan_for.choice.value = SLURM  # ... and the section comes back as it was
    _settled(p)
    assert yaml.safe_load(p.to_yaml())["distributed"]["slurm"] == {"partition": "big", "time": "01:00:00"}

    def unreadable(name: str | None) -> partition.Partition:
        raise partition.Unreadable("scontrol: error: Unable to contact slurm controller")

    monkeypatch.setattr(partition, "read", unreadable)
    p.plan_for.partition.value = "gpu"
    _settled(p)
    assert "Unable to contact slurm controller" in p.plan_for.error_label.value  # under its box
    assert p.general_errors == [] and p.plan_text == [] and p.launch_button.button_style == ""
