"""A SLURM job is planned for its partition's nodes, not for the login node the notebook sits on (issue 51):
the real test cluster's partition ``gpu`` (nodes with GRES ``gpu:a100:4``, tests/slurmcluster.py) planned
from this CPU machine; nothing here trains or runs a job that needs a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.launch.partition import gpu_gres
from nbtrain.control.plan.distributed import slurm_script
from tests.conftest import lora_yaml
from tests.slurmcluster import Cluster, fake_scontrol

QLORA = (
    lora_yaml(10, method="qlora")
    + "distributed:\n  nodes: 2\n  slurm: {partition: gpu, gpus_per_node: 4%s}\n"
)


def refused(config: str) -> str:
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(config)
    return str(e.value)


def test_gres_strings_as_slurm_writes_them() -> None:
    assert gpu_gres("gpu:a100:4") == (4, "a100")
    assert gpu_gres("gpu:a100:4(S:0-1)") == (4, "a100")
    assert gpu_gres("gpu:4") == (4, None)
    assert gpu_gres("gpu:h100:2(S:0),gpu:h100:2(S:1),shard:8") == (4, "h100")
    assert gpu_gres("") == (0, None) and gpu_gres("mps:100") == (0, None)


@pytest.mark.slow
def test_a_qlora_config_plans_two_nodes_of_four_a100s_from_this_cpu_machine(
    slurm_cluster: Cluster, workdir: Path
) -> None:
    prep = nbtrain.prepare(QLORA % ", gpu: A100-80GB")
    plan = prep.plan
    assert (plan.nodes, plan.num_processes, plan.world_size) == (2, 4, 8)
    assert (plan.device, plan.precision, plan.strategy, plan.launcher) == ("cuda", "bf16", "ddp", "torchrun")
    assert prep.train_args["ddp_backend"] == "nccl" and prep.train_args["bf16"] is True
    first = plan.reasons[0]
    assert first.startswith("planned for SLURM partition gpu: 2 nodes of 4 x A100-80GB (GRES gpu:a100:4; "
                            "the card's memory from slurm: gpu"), first  # fmt: skip
    assert any("NCCL backend" in r for r in plan.reasons)
    est = plan.estimate or {}
    assert est["device"] == "cuda" and est["capacity_bytes"] == 80 * 2**30  # per GPU, against the named card
    assert [g.name for g in prep.hardware.gpus] == ["NVIDIA A100-SXM4-80GB"] * 4
    assert prep.hardware.ram_total == 8000 * 2**20  # the node's RealMemory, not this machine's
    # the job's script asks SLURM for the GPUs the plan has, and starts one process on each
    slurm = prep.resolved.config.distributed.slurm
    assert slurm is not None
    script = slurm_script(plan, workdir / "runs" / "r-1", slurm.model_dump())
    gpus = re.findall(r"^#SBATCH --gpus-per-node=(\d+)$", script, re.M)
    procs = re.findall(r"--nproc-per-node=(\d+)", script)
    assert gpus == ["4"] and procs == ["4"] and "#SBATCH --nodes=2" in script
    (workdir / "job.sbatch").write_text(script)
    out = slurm_cluster.run("sbatch", "--test-only", str(workdir / "job.sbatch"), check=False)
    assert out.returncode == 0 and "in partition gpu" in out.stderr, out.stderr
    # gpus_per_node left out: every GPU of the node, asked for in the script
    auto = nbtrain.prepare((QLORA % ", gpu: A100-40GB").replace("gpus_per_node: 4, ", ""))
    assert auto.plan.num_processes == 4 and (auto.plan.estimate or {})["capacity_bytes"] == 40 * 2**30
    slurm = auto.resolved.config.distributed.slurm
    assert slurm is not None and slurm.gpus_per_node is None
    assert "#SBATCH --gpus-per-node=4\n" in slurm_script(auto.plan, workdir / "r-2", slurm.model_dump())


@pytest.mark.slow
def test_what_the_gres_leaves_open_or_slurm_cannot_say_is_one_config_problem_never_a_login_node_plan(
    slurm_cluster: Cluster, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    msg = refused(QLORA % "")  # gpu:a100: 40 or 80 GB?
    assert "1 problem" in msg and "distributed.slurm.gpu" in msg, msg
    assert "A100-40GB or A100-80GB" in msg and "name the card with slurm: gpu" in msg, msg
    monkeypatch.setenv("NBTRAIN_SLURM_GPU", "A100-40GB")  # a site's default says it once for every run
    assert (nbtrain.prepare(QLORA % "").plan.estimate or {})["capacity_bytes"] == 40 * 2**30
    msg = refused(QLORA.replace("partition: gpu", "partition: nope") % "")
    assert "distributed.slurm.partition" in msg and "SLURM has no partition 'nope'" in msg, msg
    assert "debug, urgent, gpu" in msg and "never plans a SLURM job for this machine" in msg, msg
    msg = refused(QLORA.replace("gpus_per_node: 4", "gpus_per_node: 8") % ", gpu: A100-80GB")
    assert "at most 4 GPU(s) a node" in msg, msg
    # a controller that does not answer: said, with scontrol's own words
    down = workdir / "down"
    down.mkdir()
    (down / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_load_partitions: Unable to contact slurm controller (connect failure)' >&2\n"
        "exit 1\n"
    )
    (down / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(down))
    msg = refused(QLORA % ", gpu: A100-80GB")
    assert "distributed.slurm.partition" in msg and "scontrol show partition gpu failed" in msg, msg
    assert "Unable to contact slurm controller" in msg, msg


def test_an_untyped_gres_asks_for_the_card_and_no_scontrol_is_said(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_ = fake_scontrol(workdir / "bin", "gpu:4", cpus=32, memory_mb=256000)
    monkeypatch.setenv("PATH", str(bin_))
    msg = refused(QLORA % "")
    assert "1 problem" in msg and "untyped GPU GRES (gpu:4)" in msg and "slurm: gpu" in msg, msg
    prep = nbtrain.prepare(QLORA % ", gpu: H100-80GB")
    assert prep.plan.reasons[0].startswith("planned for SLURM partition gpu: 2 nodes of 4 x H100-80GB")
    assert prep.hardware.cpu_count == 32
    monkeypatch.setenv("PATH", str(workdir / "empty"))
    msg = refused(QLORA % ", gpu: H100-80GB")
    assert "scontrol is not on PATH here" in msg and "distributed.slurm.partition" in msg, msg


def test_a_card_the_schema_refuses_is_said_once_not_again_by_the_partition(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the later stages plan with the refused key left out; their word on that key would only repeat it
    monkeypatch.setenv("PATH", str(fake_scontrol(workdir / "bin", "gpu:a100:4")))
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(QLORA % ", gpu: A100")
    on_gpu = [p for p in e.value.problems if p.path == "distributed.slurm.gpu"]
    assert len(on_gpu) == 1 and "A100-40GB or A100-80GB" in on_gpu[0].message, e.value


def test_a_course_gpu_cap_counts_the_gpus_the_plan_chose_when_gpus_per_node_is_left_out(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.control.config.preset import PRESET_FILE

    monkeypatch.setenv("PATH", str(fake_scontrol(workdir / "bin", "gpu:h100:4")))
    (workdir / PRESET_FILE).write_text("max_gpus: 2\n", encoding="utf-8")
    left_out = lora_yaml(10) + "distributed:\n  nodes: 1\n  slurm: {partition: gpu}\n"
    msg = refused(left_out)  # the plan takes the node's 4 GPUs: over the course's 2
    assert "4 GPUs (gpus_per_node left out" in msg and "rule 'max_gpus'" in msg, msg
    within = left_out.replace("{partition: gpu}", "{partition: gpu, gpus_per_node: 2}")
    assert nbtrain.prepare(within).plan.world_size == 2
