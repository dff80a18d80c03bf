"""Instructor mode: each rule of nbtrain.lab.yaml refuses a config outside it, one rule at a time, with
the rule, the preset file, the value and the allowed values in the error; fixed values fill a config
that leaves them out; nothing is written for a refused config."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.preset import PRESET_FILE, find_preset, load_preset
from tests.conftest import lora_yaml
from tests.slurmcluster import fake_scontrol


def write_preset(folder: Path, text: str) -> Path:
    p = folder / PRESET_FILE
    p.write_text(text, encoding="utf-8")
    return p


def refused(config: str) -> str:
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(config)
    return str(e.value)


def assert_names(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in:\n{message}"


def test_models_rule_refuses_a_model_outside_the_list_and_accepts_a_glob_match(workdir: Path) -> None:
    preset = write_preset(workdir, "models: [./other-model, 'Qwen/*']\n")
    msg = refused(lora_yaml(3))
    assert_names(msg, "model", "'./tiny-llama' is not allowed", f"the lab preset {preset}",
                 "rule 'models'", "allowed: ./other-model, Qwen/*", "line 1")  # fmt: skip
    write_preset(workdir, "models: ['./tiny-*']\n")
    assert nbtrain.prepare(lora_yaml(3)).resolved.config.model == str((workdir / "tiny-llama").resolve())


def test_models_rule_matches_the_path_a_model_names_not_only_its_spelling(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    course = workdir / "course"
    course.mkdir()
    preset = write_preset(course, "models: [../tiny-llama]\n")  # relative to the preset file
    monkeypatch.chdir(course)
    data = str(workdir / "data" / "add.jsonl")
    for spelling in (str(workdir / "tiny-llama"), "../tiny-llama"):
        prep = nbtrain.prepare(lora_yaml(3).replace("./tiny-llama", spelling).replace("data/add.jsonl", data))
        assert f"lab preset: {preset}" in prep.resolved.notes
    other = course / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    msg = refused(lora_yaml(3).replace("./tiny-llama", "./other").replace("data/add.jsonl", data))
    assert_names(msg, "'./other' is not allowed", "rule 'models'", "allowed: ../tiny-llama")


def test_methods_rule_refuses_a_method_and_one_that_auto_chose(workdir: Path) -> None:
    preset = write_preset(workdir, "methods: [qlora]\n")
    msg = refused(lora_yaml(3, method="full"))
    assert_names(msg, "method", "'full' is not allowed", str(preset), "rule 'methods'", "allowed: qlora")
    # method: auto is decided by the planner (lora on a CPU): checked against the rule after planning
    msg = refused(lora_yaml(3, method="auto"))
    assert_names(msg, "method (chosen by method: auto) 'lora' is not allowed", "rule 'methods'")


def test_objectives_rule_counts_a_missing_objective_as_sft(workdir: Path) -> None:
    preset = write_preset(workdir, "objectives: [dpo, orpo]\n")
    msg = refused(lora_yaml(3))
    assert_names(msg, "objective (sft when not given) 'sft' is not allowed", str(preset),
                 "rule 'objectives'", "allowed: dpo, orpo")  # fmt: skip
    msg = refused(lora_yaml(3, extra="objective: kto\n"))
    assert_names(msg, "objective 'kto' is not allowed")


def test_strategies_rule_refuses_a_strategy(workdir: Path) -> None:
    preset = write_preset(workdir, "strategies: [none]\n")
    msg = refused(lora_yaml(3, extra="distributed: {strategy: ddp}\n"))
    assert_names(msg, "distributed.strategy", "strategy 'ddp' is not allowed", str(preset),
                 "rule 'strategies'", "allowed: none")  # fmt: skip
    assert nbtrain.prepare(lora_yaml(3)).plan.strategy == "none"


def test_max_steps_rule_caps_fills_and_refuses_epoch_training(workdir: Path) -> None:
    preset = write_preset(workdir, "max_steps: 20\n")
    msg = refused(lora_yaml(50))
    assert_names(msg, "train.max_steps", "max_steps 50 is over the cap", str(preset),
                 "rule 'max_steps'", "allowed: 1 to 20")  # fmt: skip
    msg = refused(lora_yaml(-1))
    assert_names(msg, "max_steps -1 (train for num_train_epochs) is over the cap")
    no_steps = lora_yaml(5).replace("  max_steps: 5\n", "")
    assert nbtrain.prepare(no_steps).train_args["max_steps"] == 20
    assert nbtrain.prepare(lora_yaml(5)).train_args["max_steps"] == 5


def test_slurm_rule_sends_every_run_to_the_courses_partition_within_its_caps(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_scontrol(workdir / "bin", "gpu:h100:2")))  # the course's nodes
    preset = write_preset(
        workdir,
        "slurm: {partition: class, account: fin101, time: '00:30:00'}\nmax_gpus: 2\nmax_time: '1:00:00'\n",
    )
    prep = nbtrain.prepare(lora_yaml(5))  # a config that says nothing of SLURM is a run on the cluster
    slurm = prep.resolved.config.distributed.slurm
    assert slurm is not None and (slurm.partition, slurm.account, slurm.time) == (
        "class",
        "fin101",
        "00:30:00",
    )
    own_time = lora_yaml(5) + "distributed:\n  slurm: {time: '00:45:00', gpus_per_node: 2}\n"
    slurm = nbtrain.prepare(own_time).resolved.config.distributed.slurm
    assert slurm is not None and (slurm.partition, slurm.time, slurm.gpus_per_node) == (
        "class",
        "00:45:00",
        2,
    )
    msg = refused(
        lora_yaml(5) + "distributed:\n  slurm: {partition: big, time: '2-00:00:00', gpus_per_node: 4}\n"
    )
    assert_names(msg, str(preset), "slurm partition 'big' differs", "allowed: 'class'", "rule 'max_time'")
    assert_names(
        msg, "time 2-00:00:00 is over the cap", "allowed: up to 1:00:00", "4 GPUs", "rule 'max_gpus'"
    )
    assert "runs go to SLURM: partition class" in "\n".join(load_preset(preset).rules())
    bad = write_preset(workdir, "max_time: soon\n")
    with pytest.raises(ConfigError, match="max_time 'soon' is not a SLURM time"):
        nbtrain.prepare(lora_yaml(5))
    bad.unlink()


def test_max_memory_rule_compares_the_estimate_per_device(workdir: Path) -> None:
    preset = write_preset(workdir, "max_memory_gb: 0.01\n")
    msg = refused(lora_yaml(3))
    assert_names(msg, "GiB per device (estimate), over the 0.01 GiB cap", str(preset),
                 "rule 'max_memory_gb'", "lower per_device_train_batch_size")  # fmt: skip
    # the estimate, which students use to find what fits, shows the rule instead of refusing
    report = nbtrain.estimate(lora_yaml(3))
    assert "warning:" in report.text() and "rule 'max_memory_gb'" in report.text()
    write_preset(workdir, "max_memory_gb: 4\n")
    est = nbtrain.prepare(lora_yaml(3)).plan.estimate
    assert est is not None and est["per_device_bytes"] < 4 * 2**30


def test_seed_rule_fixes_the_seed(workdir: Path) -> None:
    preset = write_preset(workdir, "seed: 1234\n")
    msg = refused(lora_yaml(3, extra="").replace("  logging_steps: 1\n", "  seed: 7\n"))
    assert_names(msg, "train.seed", "seed 7 differs", str(preset), "rule 'seed'", "allowed: 1234")
    assert nbtrain.prepare(lora_yaml(3)).train_args["seed"] == 1234


def test_data_rule_fixes_the_dataset_and_fills_a_config_without_data(workdir: Path) -> None:
    from nbtrain.examples import write_dataset

    write_dataset(workdir / "data" / "mine.jsonl", n=40)
    preset = write_preset(workdir, "data: {train: data/add.jsonl, eval_split: 0.1}\n")
    msg = refused(lora_yaml(3).replace("data/add.jsonl", "data/mine.jsonl"))
    assert_names(msg, "data.train", "'data/mine.jsonl' differs from the data", str(preset),
                 "rule 'data'", f"allowed: '{workdir / 'data' / 'add.jsonl'}'")  # fmt: skip
    # the same file, written another way, is the same data
    same = lora_yaml(3).replace("data/add.jsonl", str(workdir / "data" / "add.jsonl"))
    assert nbtrain.prepare(same).resolved.config.data.eval_split == 0.1
    no_data = "model: ./tiny-llama\ntrain: {max_steps: 3}\n"
    prep = nbtrain.prepare(no_data)
    assert prep.resolved.train_data.location == str(workdir / "data" / "add.jsonl")
    assert prep.train_args["eval_strategy"] == "steps"


def test_every_violation_is_reported_at_once_and_nothing_is_written(workdir: Path) -> None:
    write_preset(workdir, "methods: [lora]\nmax_steps: 10\nseed: 1\n")
    cfg = lora_yaml(99, method="full").replace("  logging_steps: 1\n", "  seed: 2\n")
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(cfg)
    assert {p.path for p in e.value.problems} >= {"method", "train.max_steps", "train.seed"}
    assert not (workdir / "runs").exists() and nbtrain.runs() == []


def test_preset_is_found_in_a_folder_above_or_through_the_environment(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_preset(workdir, "max_steps: 5\n")
    (workdir / "week1").mkdir()
    monkeypatch.chdir(workdir / "week1")
    found = find_preset()
    assert found is not None and found.source == workdir / PRESET_FILE and found.max_steps == 5
    other = workdir / "elsewhere.yaml"
    other.write_text("max_steps: 7\n")
    monkeypatch.setenv("NBTRAIN_PRESET", str(other))
    found = find_preset()
    assert found is not None and found.max_steps == 7
    monkeypatch.setenv("NBTRAIN_PRESET", str(workdir / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"missing\.yaml: file not found \(set by \$NBTRAIN_PRESET\)"):
        find_preset()


def test_a_bad_preset_file_names_the_file_and_the_rule(workdir: Path) -> None:
    p = write_preset(workdir, "max_step: 5\nmethods: [lora, lorra]\n")
    with pytest.raises(ConfigError) as e:
        load_preset(p)
    msg = str(e.value)
    assert_names(msg, str(p), "max_step: unknown rule; the rules are course, models", "methods.1")
    write_preset(workdir, "data: {train: data/add.jsonl, streaming: true}\n")
    with pytest.raises(ConfigError, match="data: may fix train, eval, format"):
        nbtrain.prepare(lora_yaml(3))


def test_without_a_preset_nothing_changes(workdir: Path) -> None:
    assert find_preset() is None
    prep = nbtrain.prepare(lora_yaml(3, method="full"))
    assert prep.train_args["max_steps"] == 3 and "seed" not in prep.train_args


def test_hooks_rule_refuses_notebook_code_in_training_unless_the_preset_lists_it(workdir: Path) -> None:
    """A callback that rewrites the logged loss would fake the grade: under a preset no hook runs unless
    the instructor lists its key."""

    def cheat(args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "loss" in logs:
            logs["loss"] = 0.0

    preset = write_preset(workdir, "max_steps: 20\n")
    cfg = lora_yaml(5, extra="hooks:\n  callbacks: [cheat]\n")
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(cfg, namespace={"cheat": cheat})
    assert [p.path for p in e.value.problems] == ["hooks.callbacks"]
    assert_names(
        str(e.value), "rule 'hooks'", str(preset), "allowed: none", "hooks: [callbacks] in the preset"
    )
    write_preset(workdir, "max_steps: 20\nhooks: [compute_metrics]\n")
    with pytest.raises(ConfigError, match="allowed: compute_metrics"):
        nbtrain.prepare(cfg, namespace={"cheat": cheat})
    write_preset(workdir, "max_steps: 20\nhooks: [callbacks]\n")
    assert nbtrain.prepare(cfg, namespace={"cheat": cheat}).hooks is not None
    assert "hooks: callbacks allowed" in find_preset().rules()  # type: ignore[union-attr]
    write_preset(workdir, "hooks: [callbacks, sneaky]\n")
    with pytest.raises(ConfigError, match="not sneaky"):
        nbtrain.prepare(lora_yaml(5))
