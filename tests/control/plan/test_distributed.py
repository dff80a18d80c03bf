"""Planning multi-process runs: strategies, launchers, DeepSpeed JSON, hostfiles, SLURM (no processes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config
from nbtrain.control.plan.distributed import (
    accelerate_config,
    free_port,
    node_argv,
    read_hostfile,
    slurm_script,
)
from nbtrain.hardware import GPU, Hardware
from tests.conftest import lora_yaml
from tests.slurmcluster import fake_scontrol

A100 = GPU(0, "NVIDIA A100-SXM4-80GB", 80 * 2**30, 79 * 2**30, (8, 0))


def dist(extra: str, **kw: object) -> str:
    return lora_yaml(**kw) + "distributed:\n" + "".join(f"  {line}\n" for line in extra.strip().splitlines())


def plan_of(text: str, gpus: int = 0) -> nbtrain.Prepared:
    hw = Hardware(gpus=[GPU(i, A100.name, A100.memory_total, A100.memory_free, (8, 0)) for i in range(gpus)])
    return nbtrain.prepare(text, hardware=hw)


@pytest.mark.parametrize(
    ("extra", "gpus", "want"),
    [
        ("strategy: auto", 0, ("none", 1, "direct")),
        ("strategy: auto", 4, ("ddp", 4, "torchrun")),
        ("strategy: ddp", 0, ("ddp", 2, "torchrun")),
        ("strategy: zero2", 0, ("zero2", 2, "torchrun")),
        ("strategy: zero3\nnum_processes: 3", 8, ("zero3", 3, "torchrun")),
        ("strategy: auto\noffload: optimizer", 2, ("zero2", 2, "torchrun")),
        ("strategy: auto\noffload: optimizer+params", 2, ("zero3", 2, "torchrun")),
        ("strategy: zero2\nlauncher: accelerate", 0, ("zero2", 2, "accelerate")),
    ],
)
def test_strategy_processes_and_launcher(
    workdir: Path, extra: str, gpus: int, want: tuple[str, int, str]
) -> None:
    plan = plan_of(dist(extra), gpus).plan
    assert (plan.strategy, plan.num_processes, plan.launcher) == want


def test_cpu_ranks_use_gloo_and_lora_skips_unused_parameter_search(workdir: Path) -> None:
    prep = plan_of(dist("strategy: ddp"))
    assert prep.train_args["ddp_backend"] == "gloo"
    assert prep.train_args["ddp_find_unused_parameters"] is False


def test_deepspeed_json_has_auto_values_resolved(workdir: Path) -> None:
    text = dist("strategy: zero3\noffload: optimizer+params").replace(
        "  logging_steps: 1", "  logging_steps: 1\n  gradient_accumulation_steps: 3"
    )
    ds = plan_of(text).plan.deepspeed
    assert ds is not None
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 3
    assert ds["train_batch_size"] == 4 * 3 * 2
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu" and zero["stage3_gather_16bit_weights_on_model_save"]
    assert ds["optimizer"]["params"]["lr"] == pytest.approx(3e-3)
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}
    assert "auto" not in json.dumps(ds)


def test_user_deepspeed_config_is_validated(workdir: Path) -> None:
    (workdir / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2}, "train_batch_size": "auto"})
    )
    plan = plan_of(dist("deepspeed_config: ds.json")).plan
    assert plan.strategy == "zero2" and plan.deepspeed is not None
    (workdir / "bad.json").write_text(json.dumps({"zero_optimization": {"stage": 5}}))
    with pytest.raises(ConfigError, match="stage must be 0, 1, 2 or 3"):
        load_config(dist("deepspeed_config: bad.json"))
    (workdir / "mismatch.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 16})
    )
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu is 16"):
        plan_of(dist("deepspeed_config: mismatch.json"))
    with pytest.raises(ConfigError, match="has ZeRO stage 2"):
        load_config(dist("strategy: zero3\ndeepspeed_config: ds.json"))
    with pytest.raises(ConfigError, match="DeepSpeed config not found"):
        load_config(dist("deepspeed_config: nope.json"))


@pytest.mark.parametrize(
    ("extra", "method", "needle"),
    [
        ("strategy: zero3", "qlora", "qlora cannot combine with zero3"),
        ("strategy: ddp\noffload: optimizer", "lora", "offload needs a DeepSpeed ZeRO strategy"),
        ("strategy: zero2\noffload: optimizer+params", "lora", "needs strategy: zero3"),
        ("strategy: none\nnum_processes: 2", "lora", "need a strategy"),
        ("nodes: 2", "lora", "needs hostfile"),
        ("hostfile: nope.txt\nnodes: 2", "lora", "hostfile not found"),
        ("launcher: notebook\nnodes: 2\nhostfile: hosts", "lora", "launcher: notebook runs on this machine"),
        ("num_processes: 0", "lora", "positive integer"),
    ],
)
def test_combinations_that_cannot_work_are_rejected_before_launch(
    workdir: Path, extra: str, method: str, needle: str
) -> None:
    (workdir / "hosts").write_text("localhost slots=1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(dist(extra, method=method))
    assert needle in str(ei.value)
    assert nbtrain.runs() == []


def test_launcher_commands_use_sys_executable_and_loopback(workdir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    for launcher, must in (
        (
            "torchrun",
            # one node: torchrun's agent with its ranks forked from one process (nbtrain/worker/ranks.py)
            ["nbtrain.worker.ranks", "--nproc-per-node=2", "--master-addr=127.0.0.1", "--master-port=1234"],
        ),
        ("deepspeed", ["deepspeed.launcher.runner", "--num_gpus", "--no_local_rank", "--module"]),
        ("accelerate", ["accelerate.commands.launch", "--config_file", "--main_process_port"]),
    ):
        plan = plan_of(dist(f"strategy: zero2\nlauncher: {launcher}")).plan
        argv = node_argv(plan, run_dir, port=1234)
        assert argv[0] == sys.executable
        for m in must:
            assert m in argv, (launcher, argv)
        assert (
            argv[-3:] == ["-m", "nbtrain.worker", str(run_dir)]
            or argv[-2:]
            == [
                "nbtrain.worker",
                str(run_dir),
            ]
            or (argv[1:3] == ["-m", "nbtrain.worker.ranks"] and argv[-1] == str(run_dir))
        )


def test_accelerate_config_kinds(workdir: Path, tmp_path: Path) -> None:
    ddp = accelerate_config(plan_of(dist("strategy: ddp\nlauncher: accelerate")).plan, tmp_path)
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["use_cpu"] is True and ddp["num_processes"] == 2
    z = accelerate_config(plan_of(dist("strategy: zero3\nlauncher: accelerate")).plan, tmp_path)
    assert z["distributed_type"] == "DEEPSPEED" and z["deepspeed_config"]["zero3_init_flag"] is True
    assert "mixed_precision" not in z  # DeepSpeed's JSON owns it; accelerate refuses it twice


def test_hostfile_and_multi_node_plan(workdir: Path) -> None:
    (workdir / "hosts").write_text("# two nodes\nnode-a slots=4\nnode-b slots=4  # second\n")
    assert [(h.name, h.slots) for h in read_hostfile(workdir / "hosts")] == [("node-a", 4), ("node-b", 4)]
    prep = plan_of(dist("strategy: ddp\nnodes: 2\nnum_processes: 4\nhostfile: hosts"))
    assert prep.plan.world_size == 8
    argv = node_argv(prep.plan, workdir / "r", port=29500, master_addr="node-a", node_rank=1)
    assert "--nnodes=2" in argv and "--node-rank=1" in argv and "--master-addr=node-a" in argv


def test_slurm_script_is_written_and_shown_when_sbatch_is_missing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # no sbatch on this machine anyway; scontrol shows a partition of two-GPU nodes
    monkeypatch.setenv("PATH", str(fake_scontrol(workdir / "empty-bin", "gpu:h100:2")))
    text = dist("strategy: ddp\nnodes: 2\nnum_processes: 2\nslurm: {partition: gpu, gpus_per_node: 2}")
    run = nbtrain.finetune(text, name="slurm")
    script = (run.dir / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=gpu" in script
    assert "--nproc-per-node=2" in script and "srun " in script and "nbtrain.worker" in script
    assert "sbatch is not on PATH" in capsys.readouterr().out
    assert run.status().state == "queued"
    assert not run.paths.launch.exists()  # nothing was started here
    plan = plan_of(text).plan
    assert slurm_script(plan, run.dir, {"extra": ["--exclusive"]}).count("#SBATCH --exclusive") == 1


def test_free_ports_differ_and_are_bindable() -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1


def test_dry_run_shows_strategy_and_deepspeed_json(workdir: Path) -> None:
    text = plan_of(dist("strategy: zero3")).summary()
    assert "strategy zero3" in text and "launcher torchrun's agent" in text and "deepspeed.json:" in text


def test_fsdp_settings_travel_in_the_training_args_and_the_accelerate_config(workdir: Path) -> None:
    prep = plan_of(dist("strategy: fsdp"))
    assert (prep.plan.strategy, prep.plan.launcher) == ("fsdp", "torchrun")
    fsdp = prep.train_args["fsdp_config"]
    assert fsdp["version"] == 2 and fsdp["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["state_dict_type"] == "SHARDED_STATE_DICT" and fsdp["cpu_ram_efficient_loading"] is True
    assert "strategy fsdp: FSDP2" in prep.summary()
    acc = accelerate_config(plan_of(dist("strategy: fsdp\nlauncher: accelerate")).plan, workdir)
    assert acc["distributed_type"] == "FSDP" and acc["fsdp_config"]["fsdp_version"] == 2
    # accelerate wants it with the RAM-efficient load
    assert acc["fsdp_config"]["fsdp_sync_module_states"] is True


def test_qlora_with_fsdp_and_train_fsdp_keys_are_refused_with_the_way_out(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="qlora with strategy: fsdp is not offered") as e:
        load_config(dist("strategy: fsdp", method="qlora"))
    assert "strategy: ddp" in str(e.value)
    with pytest.raises(ConfigError, match="strategy: fsdp"):
        load_config(lora_yaml(extra="  fsdp: full_shard\n"))


def test_auto_shards_with_fsdp_when_deepspeed_is_not_installed(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from nbtrain.control.plan import planner

    assert planner.sharding_ladder()[0][-1] == ("zero3", "optimizer+params")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deepspeed" else real(n, *a))
    ladder, why = planner.sharding_ladder()
    assert ladder == [("ddp", "none"), ("fsdp", "none")] and "DeepSpeed is not installed" in why
