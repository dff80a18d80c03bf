"""The config panel's objective dropdown: it writes objective:, offers the data formats that objective
trains on, shows the rows it expects, asks for rewards only for GRPO and RLOO, and previews preference
rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.examples import write_dataset
from nbtrain.ui.panel import ConfigPanel, data_preview, preview_html


def formats(p: ConfigPanel) -> list[Any]:
    return [v for _, v in p.fields["data.format"].options]


def test_objective_choice_narrows_formats_and_shows_the_expected_rows(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel()
    assert [v for _, v in p.fields["objective"].options] == list(OBJECTIVES)
    assert p.fields["objective"].value == "sft" and "objective" not in p.to_dict()
    assert formats(p) == ["auto", "messages", "alpaca", "sharegpt", "text"]
    assert p.rows["rewards"].layout.display == "none"
    p.fields["objective"].value = "kto"
    assert formats(p) == ["auto", *OBJECTIVES["kto"].formats]
    assert "label" in p.data_help.value and "objective: kto trains on" in p.data_help.value
    assert p.to_dict()["objective"] == "kto"
    p.fields["objective"].value = "grpo"
    assert formats(p) == ["auto", "prompt"] and p.rows["rewards"].layout.display == ""
    p.fields["rewards"].value = "format_reward, length_reward"
    assert p.to_dict()["rewards"] == ["format_reward", "length_reward"]
    p.fields["objective"].value = "dpo"
    assert "rewards" in p.to_dict()  # kept as typed: the validator says it applies to grpo only


def test_a_format_the_objective_does_not_take_stays_and_gets_the_validators_error(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel("model: ./tiny-llama\ndata: {train: data/add.jsonl, format: messages}\n")
    p.fields["objective"].value = "dpo"
    assert p.fields["data.format"].value == "messages" and "messages" in formats(p)
    assert p.settle(60)
    assert "objective: dpo does not train on" in p.errors["data.format"]
    p.fields["data.format"].value = "auto"
    assert formats(p) == ["auto", *OBJECTIVES["dpo"].formats]


def test_panel_round_trips_objective_and_rewards_through_yaml(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    text = (
        "model: ./tiny-llama\nobjective: grpo\nrewards: [format_reward]\n"
        "data: {train: data/prompt.jsonl, format: prompt}\n"
    )
    p = make_panel(text)
    assert p.fields["rewards"].value == "format_reward" and p.fields["objective"].value == "grpo"
    assert yaml.safe_load(p.to_yaml()) == yaml.safe_load(text)


def test_rloo_asks_for_rewards_and_a_reward_model_entry_round_trips(
    workdir: Path, make_panel: type[ConfigPanel]
) -> None:
    p = make_panel()
    p.fields["objective"].value = "reward"
    assert formats(p) == ["auto", "preference"] and p.rows["rewards"].layout.display == "none"
    p.fields["objective"].value = "rloo"
    assert formats(p) == ["auto", "prompt"] and p.rows["rewards"].layout.display == ""
    p.fields["rewards"].value = "my_check, {model: rm-run}"
    assert p.to_dict()["rewards"] == ["my_check", {"model": "rm-run"}]
    q = make_panel("model: ./tiny-llama\nobjective: rloo\nrewards: [{model: ./runs/rm}, format_reward]\n")
    assert q.fields["rewards"].value == "{model: ./runs/rm}, format_reward"
    assert yaml.safe_load(q.to_yaml())["rewards"] == [{"model": "./runs/rm"}, "format_reward"]


def test_preview_shows_preference_rows_of_a_dpo_config(workdir: Path) -> None:
    write_dataset(workdir / "data" / "pref.jsonl", "preference", n=5)
    pv = data_preview(
        {"model": "./tiny-llama", "objective": "dpo", "data": {"train": [{"path": "data/pref.jsonl"}]}},
        workdir,
    )
    assert pv.note == "the first of 1 sources" and [r.format for r in pv.rows] == ["preference"] * 3
    out = preview_html(pv)
    for key in ("prompt", "chosen", "rejected"):
        assert f"<b>{key}</b>" in out
    assert "What is" in out


def test_a_runs_mixed_sources_come_back_to_the_form_without_unset_keys() -> None:
    from nbtrain.control.config.schema import DataSettings
    from nbtrain.ui.panel import config_from_run

    data = DataSettings.model_validate(
        {"train": [{"path": "/d/a.jsonl", "weight": 2.0}, {"path": "/d/b.jsonl", "weight": 1.0}]}
    )
    cfg = config_from_run({"model": "/m", "data": data.model_dump(mode="json")})
    assert cfg["data"] == {
        "train": [{"path": "/d/a.jsonl", "weight": 2.0}, {"path": "/d/b.jsonl", "weight": 1.0}]
    }
