"""Fault cases of the config, the lab preset and the run directory's pickles (issue 2/9, "Nothing lost,
nothing wedged, nobody in"): each is refused before anything starts or is unpickled, and the refusal
names the key as written, its YAML line, the rule and what is allowed. Fast: nothing here trains."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract import rewards
from nbtrain.contract.errors import ConfigError, NbtrainError, Problem
from nbtrain.contract.rundir import COMPLETE_MARKER, RunPaths, write_status
from nbtrain.control.config.preset import PRESET_FILE, find_preset, leave_course, load_preset
from nbtrain.control.prepare import prepare, validate
from nbtrain.control.runs.run import Run, create_run_dir
from tests.conftest import lora_yaml


def problem_at(config: str, path: str) -> Problem:
    """The one problem ``validate`` (what the panel and the server show) reports at ``path``."""
    problems = validate(config)
    found = [p for p in problems if p.path == path]
    assert found, f"no problem at {path}: {problems}"
    return found[0]


def line_of(config: str, text: str) -> int:
    return next(i for i, ln in enumerate(config.splitlines(), 1) if text in ln)


# ------------------------------------------------------------------------------ 1. bad numbers


def with_train(key: str, value: str) -> str:
    """lora_yaml(5) with ``train: key: value`` (replacing the key where lora_yaml sets it already)."""
    lines = lora_yaml(5).splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if ln.startswith(f"  {key}:")), None)
    if at is None:
        return "".join(lines) + f"  {key}: {value}\n"
    lines[at] = f"  {key}: {value}\n"
    return "".join(lines)


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("learning_rate", ".inf", "a finite number >= 0"),
        ("learning_rate", ".nan", "a finite number >= 0"),
        ("learning_rate", "-0.1", "a finite number >= 0"),
        ("learning_rate", "1.0e+400", "a finite number >= 0"),  # YAML reads it as .inf
        ("weight_decay", ".inf", "a finite number >= 0"),
        ("gradient_accumulation_steps", "0", "an integer >= 1"),
        ("gradient_accumulation_steps", "-3", "an integer >= 1"),
        ("max_length", "0", "an integer >= 1"),
        ("warmup_steps", "-2", "a finite number >= 0"),
        ("seed", "-1", "an integer >= 0"),
        ("seed", "4294967296", "below 2**32"),
        ("max_steps", "100000000000000000000", "below 2**63"),
        ("num_train_epochs", "-1", "a finite number > 0"),
        ("num_train_epochs", "0", "a finite number > 0"),
        ("adam_beta1", "1.5", "a number from 0 up to (not including) 1"),
    ],
)
def test_a_number_out_of_range_is_refused_before_start_naming_key_line_and_range(
    workdir: Path, key: str, value: str, allowed: str
) -> None:
    config = with_train(key, value)
    p = problem_at(config, f"train.{key}")
    assert p.line == line_of(config, f"{key}:"), p
    assert allowed in p.message and key in p.message, p.message
    with pytest.raises(ConfigError):
        nbtrain.finetune(config)
    assert nbtrain.runs() == []


@pytest.mark.parametrize("steps", [0, -5])
def test_max_steps_zero_or_below_minus_one_is_refused_and_minus_one_trains_by_epochs(
    workdir: Path, steps: int
) -> None:
    config = lora_yaml(steps)
    p = problem_at(config, "train.max_steps")
    assert p.line == line_of(config, "max_steps:")
    assert "-1 (train for num_train_epochs) or an integer >= 1" in p.message, p.message
    assert validate(lora_yaml(-1)) == []  # transformers' own default: train by epochs


@pytest.mark.parametrize("value", [0, -1])
def test_batch_sizes_below_one_are_refused(workdir: Path, value: int) -> None:
    config = lora_yaml(5).replace("per_device_train_batch_size: 4", f"per_device_train_batch_size: {value}")
    assert "an integer >= 1" in problem_at(config, "train.per_device_train_batch_size").message
    # (the effective batch_size: has been refused below 1 by the schema all along)


def test_numbers_outside_train_are_bounded_too(workdir: Path) -> None:
    config = lora_yaml(5, extra="lora: {r: 8, alpha: .inf}\n")
    assert "finite" in problem_at(config, "lora.alpha").message
    # (lora r: has been an integer from 1 to 4096 all along)
    config = lora_yaml(5, extra="").replace(
        "  logging_steps: 1\n", "  logging_steps: 1\n  lr_scheduler_kwargs: {eta_min: .nan}\n"
    )
    assert "finite" in problem_at(config, "train.lr_scheduler_kwargs.eta_min").message


# ------------------------------------------------------------------------------ 2. config memory


def laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\nmodel: ./tiny-llama\ndata: {train: data/add.jsonl}\n"


def test_alias_expansion_is_bounded_without_expanding_it(workdir: Path) -> None:
    tracemalloc.start()
    t0 = time.monotonic()
    problems = validate(laughs())
    took = time.monotonic() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50 * 2**20 and took < 10, (peak, took)
    assert len(problems) == 1 and "aliases" in problems[0].message, problems
    assert "more than 100000 values" in problems[0].message and problems[0].line is not None


def test_a_recursive_alias_and_an_oversized_config_are_refused(workdir: Path) -> None:
    problems = validate("model: &m [*m]\ndata: {train: data/add.jsonl}\n")
    assert len(problems) == 1 and "refers to itself" in problems[0].message, problems
    big = lora_yaml(5) + "# " + "x" * (2**20) + "\n"
    problems = validate(big)
    assert len(problems) == 1 and "MiB" in problems[0].message, problems


def test_small_anchors_and_merge_keys_keep_their_yaml_meaning(workdir: Path) -> None:
    # (a python/object tag stays refused: tests/control/config/test_schema.py)
    config = lora_yaml(5, extra="lora: &l {r: 4, alpha: 8}\nname: anchored\n")
    lora = prepare(config).resolved.config.lora
    assert lora is not None and (lora.r, lora.alpha) == (4, 8)
    merged = lora_yaml(5, extra="lora:\n  <<: {r: 4, alpha: 8}\n  dropout: 0.1\n")
    lora = prepare(merged).resolved.config.lora
    assert lora is not None and (lora.r, lora.alpha, lora.dropout) == (4, 8, 0.1)


def test_a_preset_file_with_an_alias_bomb_is_refused(workdir: Path) -> None:
    (workdir / PRESET_FILE).write_text(
        laughs().replace("model: ./tiny-llama\ndata: {train: data/add.jsonl}\n", "")
    )
    with pytest.raises(ConfigError, match="alias"):
        load_preset(workdir / PRESET_FILE)


# ------------------------------------------------------------------------------------- 3. secrets


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("train_key", "train.hub_token"),
        ("nested", "train.model_init_kwargs.token"),
        ("top", "wandb_api_key"),
        ("value", "name"),  # no secret's key, but a Hugging Face token's shape (a valid run name, too)
    ],
)
def test_a_secret_in_the_config_is_refused_and_not_repeated(workdir: Path, where: str, path: str) -> None:
    secret = "hf_abcdefSECRET123" + ("x" * 20 if where == "value" else "")
    extra = {
        "train_key": f"  hub_token: {secret}\n",
        "nested": f"  model_init_kwargs: {{token: {secret}}}\n",
    }.get(where, "")
    config = lora_yaml(5).replace("  logging_steps: 1\n", "  logging_steps: 1\n" + extra)
    config += {"top": f"wandb_api_key: {secret}\n", "value": f"name: {secret}\n"}.get(where, "")
    p = problem_at(config, path)
    assert "HF_TOKEN" in p.message and "hf auth login" in p.message, p.message
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(config)
    assert secret not in str(e.value)
    assert not (workdir / "runs").exists() and nbtrain.runs() == []


def test_tokenizer_token_names_are_not_secrets(workdir: Path) -> None:
    config = lora_yaml(5).replace("  logging_steps: 1\n", "  logging_steps: 1\n  pad_token: <pad>\n")
    assert all(p.path != "train.pad_token" for p in validate(config))


# ---------------------------------------------------------------------------------------- 4. preset


def write_preset(folder: Path, text: str) -> Path:
    p = folder / PRESET_FILE
    p.write_text(text, encoding="utf-8")
    return p


def forbidden_model(where: Path, tiny: Path) -> Path:
    target = where / "forbidden-model"
    shutil.copytree(tiny, target)
    return target


def test_a_hub_id_with_dot_dot_is_refused_even_when_the_path_exists(
    workdir: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    course = workdir / "course"
    course.mkdir()
    forbidden_model(workdir, tiny_model)
    write_preset(course, "models: ['Qwen/Qwen2.5-*']\n")
    monkeypatch.chdir(course)
    data = workdir / "data" / "add.jsonl"
    config = lora_yaml(3).replace("./tiny-llama", "Qwen/Qwen2.5-0.5B/../../../forbidden-model")
    config = config.replace("data/add.jsonl", str(data))
    p = problem_at(config, "model")
    assert "'..'" in p.message and p.line == 1, p.message
    monkeypatch.delenv("NBTRAIN_PRESET", raising=False)
    (course / PRESET_FILE).unlink()
    assert any(p.path == "model" and "'..'" in p.message for p in validate(config))  # outright


def test_a_local_path_is_normalised_before_the_models_rule(workdir: Path, tiny_model: Path) -> None:
    (workdir / "models").mkdir()
    shutil.copytree(tiny_model, workdir / "models" / "tiny")
    forbidden_model(workdir, tiny_model)
    write_preset(workdir, "models: ['./models/*']\n")
    config = lora_yaml(3).replace("./tiny-llama", "./models/../forbidden-model")
    assert "rule 'models'" in problem_at(config, "model").message
    assert validate(lora_yaml(3).replace("./tiny-llama", "./models/tiny")) == []


def test_trust_remote_code_is_refused_under_a_preset_unless_it_allows_it(workdir: Path) -> None:
    config = lora_yaml(3, extra="trust_remote_code: true\n")
    assert validate(config) == []  # no preset: the user's choice
    preset = write_preset(workdir, "max_steps: 20\n")
    p = problem_at(config, "trust_remote_code")
    assert "rule 'trust_remote_code'" in p.message and str(preset) in p.message
    nested = lora_yaml(3).replace(
        "  logging_steps: 1\n", "  logging_steps: 1\n  model_init_kwargs: {trust_remote_code: true}\n"
    )
    assert (
        "rule 'trust_remote_code'" in problem_at(nested, "train.model_init_kwargs.trust_remote_code").message
    )
    write_preset(workdir, "max_steps: 20\ntrust_remote_code: true\n")
    assert validate(config) == []


def test_more_nodes_than_the_hostfile_lists_are_refused_before_start(workdir: Path) -> None:
    (workdir / "hosts").write_text("# one machine\nlocalhost slots=1\n")
    config = lora_yaml(3, extra="distributed: {nodes: 2, hostfile: hosts, strategy: ddp}\n")
    assert "lists 1 host(s)" in problem_at(config, "distributed.nodes").message


def test_nodes_and_processes_rules(workdir: Path) -> None:
    (workdir / "hosts").write_text("localhost slots=1\nother slots=1\n")
    write_preset(workdir, "max_nodes: 1\nmax_processes: 1\n")
    two_nodes = lora_yaml(3, extra="distributed: {nodes: 2, hostfile: hosts, strategy: ddp}\n")
    assert "rule 'max_nodes'" in problem_at(two_nodes, "distributed.nodes").message
    two_procs = lora_yaml(3, extra="distributed: {strategy: ddp, num_processes: 2}\n")
    assert "rule 'max_processes'" in problem_at(two_procs, "distributed.num_processes").message
    chosen = lora_yaml(3, extra="distributed: {strategy: ddp}\n")  # the planner picks 2 on a CPU
    assert "chosen by num_processes: auto" in problem_at(chosen, "distributed.num_processes").message
    assert validate(lora_yaml(3)) == []


def test_compute_cap_counts_effective_batch_times_steps(workdir: Path) -> None:
    write_preset(workdir, "max_train_examples: 100\n")
    p = problem_at(lora_yaml(30), "train.max_steps")  # 4 per step x 30 steps = 120
    assert "rule 'max_train_examples'" in p.message and "120" in p.message, p.message
    assert validate(lora_yaml(25)) == []  # 100
    epochs = problem_at(lora_yaml(-1), "train.max_steps")
    assert "rule 'max_train_examples'" in epochs.message


def test_compute_cap_counts_every_evaluation_and_refuses_what_it_cannot_count(workdir: Path) -> None:
    """The rows a run reads are its steps' and its evaluations': 20 steps x 4 = 80, and eval_steps 0.2 of
    the run is an evaluation every 4 steps, 5 of 20 held-out rows each = 100 more. Packing and an eval set
    whose size is not known before the start cannot be counted, so they are refused under the cap."""
    write_preset(workdir, "max_train_examples: 150\n")
    assert validate(lora_yaml(20)) == []  # 80 rows
    with_eval = lora_yaml(20).replace("  format: auto\n", "  format: auto\n  eval_split: 20\n")
    p = problem_at(with_eval, "train.max_steps")
    assert "reads 180 rows" in p.message and "5 evaluation(s) x 20 rows" in p.message, p.message
    assert "set train: max_steps to at most 12" in p.message and "evaluate less often" in p.message  # 50 // 4
    # a fraction of the file's rows, counted: 10% of data/add.jsonl
    rows = sum(1 for line in (workdir / "data" / "add.jsonl").read_text().splitlines() if line.strip())
    frac = lora_yaml(20).replace("  format: auto\n", "  format: auto\n  eval_split: 0.5\n")
    held = -(-rows // 2)
    assert f"5 evaluation(s) x {held} rows" in problem_at(frac, "train.max_steps").message
    packed = problem_at(lora_yaml(5, extra="  packing: true\n"), "train.packing")
    assert "rule 'max_train_examples'" in packed.message and "leave packing out" in packed.message
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = json.loads((workdir / "data" / "add.jsonl").read_text().splitlines()[0])
    pq.write_table(pa.Table.from_pylist([first] * 3), workdir / "eval.parquet")
    unknown = lora_yaml(5).replace("  format: auto\n", "  format: auto\n  eval: eval.parquet\n")
    p = problem_at(unknown, "data.eval")
    assert "cannot count before it starts" in p.message and "eval_split as a number of rows" in p.message


def make_resumable(prep_config: str) -> Run:
    """A run directory as start writes it, whose attempt failed after a complete checkpoint at step 5."""
    prep = prepare(prep_config)
    run = create_run_dir(prep.name, prep.resolved.text, prep.to_dict())
    ckpt = run.dir / "checkpoints" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / COMPLETE_MARKER).write_text("")
    write_status(RunPaths(run.dir), "failed", step=5)
    return run


def test_resume_rechecks_the_rules_against_the_train_args_that_will_run(workdir: Path) -> None:
    write_preset(workdir, "max_steps: 20\n")
    run = make_resumable(lora_yaml(20))
    resolved = json.loads(run.paths.resolved.read_text())
    resolved["train_args"]["max_steps"] = 400
    run.paths.resolved.write_text(json.dumps(resolved))
    with pytest.raises(ConfigError) as e:
        nbtrain.resume(run.id)
    assert "resolved.json" in str(e.value) and "rule 'max_steps'" in str(e.value), str(e.value)
    resolved["train_args"].update(max_steps=20, learning_rate=float("inf"))  # ranges too, preset or not
    run.paths.resolved.write_text(json.dumps(resolved))
    with pytest.raises(ConfigError, match=r"train_args\.learning_rate.*a finite number >= 0"):
        nbtrain.resume(run.id)
    assert run.status().state == "failed" and not run.paths.launch.exists()


def test_a_required_course_preset_holds_outside_its_folder_and_under_an_empty_env_preset(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    course = workdir / "course"
    course.mkdir()
    preset = write_preset(course, "course: ML 101\nrequired: true\nmax_steps: 20\n")
    data = str(workdir / "data" / "add.jsonl")
    model = str(workdir / "tiny-llama")
    config = lora_yaml(50).replace("./tiny-llama", model).replace("data/add.jsonl", data)
    monkeypatch.chdir(course)
    assert "rule 'max_steps'" in problem_at(config, "train.max_steps").message  # seen once: remembered
    monkeypatch.chdir(workdir)  # left the course folder
    assert str(preset) in problem_at(config, "train.max_steps").message
    empty = workdir / "empty.yaml"
    empty.write_text("")
    monkeypatch.setenv("NBTRAIN_PRESET", str(empty))
    assert str(preset) in problem_at(config, "train.max_steps").message
    found = find_preset()
    assert found is not None and preset in [p.source for p in found.chain()]
    assert f"also, the required course preset {preset}:" in found.rules()  # what the panel lists
    # the course's file gone: refused, saying how to leave the course on purpose
    preset.rename(course / "hidden.yaml")
    problems = validate(config)
    assert len(problems) == 1 and "required" in problems[0].message and "leave" in problems[0].message
    # the instructor lifting required: the course stops following the user
    (course / "hidden.yaml").rename(preset)
    preset.write_text("course: ML 101\nmax_steps: 20\n")
    monkeypatch.delenv("NBTRAIN_PRESET")
    assert validate(config) == []


def test_leaving_a_required_course_on_purpose(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    course = workdir / "course"
    course.mkdir()
    preset = write_preset(course, "required: true\nmax_steps: 20\n")
    monkeypatch.chdir(course)
    assert find_preset() is not None
    monkeypatch.chdir(workdir)
    found = find_preset()  # remembered outside its folder
    assert found is not None and [p.source for p in found.chain()] == [preset]
    assert leave_course(preset) == [preset]
    assert find_preset() is None


def test_a_preset_without_required_applies_only_where_it_is_found(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    course = workdir / "course"
    course.mkdir()
    write_preset(course, "max_steps: 20\n")
    monkeypatch.chdir(course)
    assert find_preset() is not None
    monkeypatch.chdir(workdir)
    assert find_preset() is None


# ------------------------------------------------------------------------------------ 5. pickles


def pickled_rewards(folder: Path) -> Path:
    payload, problems = rewards.capture(["format_reward"], {})
    assert payload is not None and not problems
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / rewards.REWARDS_FILE
    path.write_bytes(payload)
    path.chmod(0o644)
    folder.chmod(0o755)
    return path


def test_rewards_pickle_loads_only_when_the_user_owns_it_and_nobody_else_can_write(tmp_path: Path) -> None:
    path = pickled_rewards(tmp_path / "run")
    assert rewards.load(path) == [rewards.format_reward]
    path.chmod(0o666)
    with pytest.raises(NbtrainError, match="writable by others"):
        rewards.load(path)
    path.chmod(0o644)
    path.parent.chmod(0o777)
    with pytest.raises(NbtrainError, match="writable by others"):
        rewards.load(path)
    path.parent.chmod(0o755)
    link = path.with_name("linked.pkl")
    link.symlink_to(path)
    with pytest.raises(NbtrainError, match="symbolic link"):
        rewards.load(link)
    if os.getuid() == 0:  # only root can give a file away
        os.chown(path, 4242, 4242)
        with pytest.raises(NbtrainError, match="owned by uid 4242"):
            rewards.load(path)


def test_function_pickle_goes_through_the_same_check(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paths = RunPaths(run_dir)
    paths.make()
    marker = tmp_path / "ran"
    payload = pickle.dumps((os.system, (f"touch {marker}",)))  # what a planted pickle would run
    (run_dir / "function.pkl").write_bytes(payload)
    (run_dir / "function.pkl").chmod(0o646)
    run_dir.chmod(0o755)
    worker = [sys.executable, "-m", "nbtrain.worker.function", str(run_dir)]
    assert subprocess.run(worker, capture_output=True, timeout=120, check=False).returncode == 1
    status = json.loads(paths.status.read_text())
    assert "writable by others" in status["error"]["message"], status
    assert not marker.exists()


def test_resume_refuses_a_run_whose_pickle_others_can_write(workdir: Path) -> None:
    run = make_resumable(lora_yaml(5))
    path = pickled_rewards(run.dir)
    path.chmod(0o666)
    with pytest.raises(NbtrainError, match="writable by others"):
        nbtrain.resume(run.id)
    assert not run.paths.launch.exists()


def test_lora_targets_the_model_lacks_are_refused_before_the_run_directory_exists(workdir: Path) -> None:
    config = lora_yaml(extra="lora: {target_modules: [q_proj, qproj, mlp_up]}\n")
    problem = problem_at(config, "lora.target_modules")
    assert "no module named 'qproj' (did you mean 'q_proj'?), 'mlp_up'" in problem.message
    assert "up_proj" in problem.message and "target_modules: auto | all-linear" in problem.message
    with pytest.raises(ConfigError):
        nbtrain.finetune(config, name="bad-targets")
    assert nbtrain.runs() == []  # nothing was written
    assert validate(lora_yaml(extra="lora: {target_modules: [q_proj, down_proj]}\n")) == []


def test_more_cpu_processes_than_cores_are_refused_at_prepare(workdir: Path) -> None:
    from nbtrain.hardware import Hardware

    two_cores = Hardware(cpu_count=2, ram_total=24 * 2**30, ram_available=20 * 2**30)
    text = lora_yaml(extra="distributed: {strategy: ddp, num_processes: 1000}\n")
    with pytest.raises(ConfigError) as e:
        prepare(text, hardware=two_cores)
    # the one error also says the plan of 1000 processes would not fit (the fit rule's verdict beside it)
    (problem,) = [p for p in e.value.problems if p.path == "distributed.num_processes"]
    assert "1000 processes on this machine's 2 CPU core(s)" in problem.message
    assert "use at most 2" in problem.message
    assert prepare(text.replace("1000", "2"), hardware=two_cores).plan.num_processes == 2


def test_mix_weights_whose_sum_would_overflow_are_refused(workdir: Path) -> None:
    config = lora_yaml().replace(
        "  train: data/add.jsonl\n",
        "  train: [{path: data/add.jsonl, weight: 1.0e+308}, {path: data/add.jsonl, weight: 1.0e+308}]\n",
    )
    problems = validate(config)
    assert {p.path for p in problems} == {"data.train.0.weight", "data.train.1.weight"}, problems
    assert all("less than or equal to 1000000000" in p.message or "1e+09" in p.message for p in problems)
