"""Planning for hardware the user names (``on=``), from a machine without it: the plan, estimate and fit
rule are those of that hardware, and the plan says what it was made for (issue 51)."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain
from bench import plan_table
from nbtrain.contract.errors import ConfigError
from nbtrain.hardware.named import parse
from tests.ui.test_cli import cli


@pytest.fixture
def job(tmp_path: Path) -> str:
    (tmp_path / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}\n' * 20
    )
    return plan_table.job("Meta-Llama-3-8B", "auto")


def test_a_7b_model_on_one_t4_is_qlora_in_fp16_without_bf16_or_flash_attention(job: str) -> None:
    report = nbtrain.estimate(job.replace("Meta-Llama-3-8B", "Llama-2-7b-hf"), on="1xT4")
    plan = report.prepared.plan
    assert (plan.method, plan.precision, plan.device, plan.attn_implementation) == (
        "qlora",
        "fp16",
        "cuda",
        None,
    )
    text = "\n".join(plan.reasons)
    assert text.startswith(
        "planned for named hardware: 1 x T4 (15 GiB each, no bf16 (fp16), no flash-attention"
    )
    assert "the GPU has no native bf16" in text and "flash-attention 2 needs compute capability 8.0" in text
    assert plan.fits and "named hardware" in report.text()


def test_llama_3_70b_lora_on_8_a100_40gb_is_the_plan_docs_plans_md_shows(job: str) -> None:
    seventy = job.replace("Meta-Llama-3-8B", "Meta-Llama-3-70B")
    plan = nbtrain.prepare(seventy, on="8xA100-40GB").plan
    with plan_table._workdir():
        shown = plan_table.plan_of(plan_table.MACHINES[2], 8, "Meta-Llama-3-70B", "auto")  # the doc's row
    assert (
        (plan.method, plan.precision, plan.strategy, plan.offload, plan.world_size)
        == (shown["method"], shown["precision"], shown["strategy"], shown["offload"], shown["world_size"])
        == ("lora", "bf16", "zero3", "none", 8)
    )
    assert plan.estimate is not None
    assert plan.estimate["per_device_bytes"] / 2**30 == pytest.approx(shown["est_gib"])


def test_several_nodes_are_named_too_and_no_core_count_of_this_machine_refuses_them(job: str) -> None:
    many = job + "distributed: {num_processes: 8}\n"  # 8 processes: more than this machine's cores
    plan = nbtrain.prepare(many, on="2x8xH100-80GB").plan
    assert (plan.nodes, plan.num_processes, plan.world_size, plan.device) == (2, 8, 16, "cuda")
    assert "2 nodes x 8 x H100-80GB" in plan.reasons[0]
    assert parse("2x8xH100-80GB").hardware().gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_hardware_it_does_not_know_is_one_config_problem_naming_what_it_knows(job: str) -> None:
    with pytest.raises(ConfigError, match=r"on='8xA100': 'A100' comes with more than one memory size"):
        nbtrain.prepare(job, on="8xA100")


@pytest.mark.slow
def test_the_command_line_estimates_for_named_hardware_and_refuses_to_start_on_it(
    job: str, tmp_path: Path
) -> None:
    (tmp_path / "c.yaml").write_text(job)
    out = cli("estimate", "c.yaml", "--on", "1xT4")
    assert out.returncode == 0, out.stderr
    assert "planned for named hardware: 1 x T4" in out.stdout and "qlora" in out.stdout
    refused = cli("run", "c.yaml", "--on", "1xT4")
    assert refused.returncode != 0 and "add --estimate or --dry-run" in refused.stderr
