"""FSDP2 on 2 CPU ranks (gloo): parameters sharded half per rank, the same losses as one process, the
result gathered into one model, and a stop + resume from the sharded checkpoint. Real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

import nbtrain
from nbtrain.contract.rundir import read_jsonl
from tests.conftest import lora_yaml, runs_in
from tests.control.test_resume import steps_logged, wait_step
from tests.worker.test_multiprocess import train_end

pytestmark = pytest.mark.slow

STEPS = 24
FSDP = "distributed:\n  strategy: fsdp\n"


def config(method: str = "lora", batch: int = 4, extra: str = "") -> str:
    body = lora_yaml(STEPS, method=method).replace("3.0e-3", "1.0e-3")
    body = body.replace("per_device_train_batch_size: 4", f"per_device_train_batch_size: {batch}")
    return body.replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000") + extra


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, nbtrain.Run]]:
    from nbtrain.examples import write_dataset

    work = tmp_path_factory.mktemp("fsdp")
    (work / "tiny-llama").symlink_to(tiny_model)
    write_dataset(work / "data" / "add.jsonl")
    with runs_in(work):
        started = {
            # one process with the 2 ranks' batch: the same rows per step as FSDP's 2 x 4
            "single": nbtrain.finetune(config(batch=8), name="single"),
            "fsdp": nbtrain.finetune(config(extra=FSDP), name="fsdp"),
            "fsdp-full": nbtrain.finetune(config("full", extra=FSDP), name="fsdp-full"),
        }
        for run in started.values():
            run.wait(timeout=600)
        yield started


def test_fsdp_shards_the_parameters_half_per_rank_for_full_and_lora(runs: dict[str, nbtrain.Run]) -> None:
    for name in ("fsdp", "fsdp-full"):
        ends = train_end(runs[name])
        assert [e["rank"] for e in ends] == [0, 1], name
        for e in ends:
            assert abs(e["param_numel_local"] / e["param_numel_full"] - 0.5) < 0.05, (name, e)
            assert abs(e["param_bytes"] / (4 * e["param_numel_full"]) - 0.5) < 0.05, (name, e)
        assert ends[0]["trainable_sha256"] == ends[1]["trainable_sha256"], name  # gathered alike
    single = train_end(runs["single"])[0]
    assert single["param_numel_local"] == single["param_numel_full"]
    # FSDP2's own settings travel in the training args, whatever launcher starts the ranks
    fsdp = runs["fsdp"].resolved["train_args"]["fsdp_config"]
    assert fsdp["version"] == 2 and fsdp["state_dict_type"] == "SHARDED_STATE_DICT"


def test_fsdp_losses_equal_the_one_process_run(runs: dict[str, nbtrain.Run]) -> None:
    one = runs["single"].metrics()["loss"].tolist()
    two = runs["fsdp"].metrics()["loss"].tolist()
    assert len(one) == len(two) == STEPS
    worst = max(abs(a - b) / a for a, b in zip(one, two, strict=True))
    assert worst < 0.01, (worst, one, two)


def test_fsdp_result_is_one_model_that_loads(runs: dict[str, nbtrain.Run]) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    AutoPeftModelForCausalLM.from_pretrained(runs["fsdp"].output_dir)
    full = AutoModelForCausalLM.from_pretrained(runs["fsdp-full"].output_dir)
    n = sum(p.numel() for p in full.parameters())
    assert n == train_end(runs["fsdp-full"])[0]["param_numel_full"]
    a = load_file(runs["fsdp"].output_dir / "adapter_model.safetensors")
    b = load_file(runs["single"].output_dir / "adapter_model.safetensors")
    assert a.keys() == b.keys()  # the same adapter, whole (its values: see the losses)


def test_fsdp_stop_and_resume_from_the_sharded_checkpoint_reaches_max_steps(
    runs: dict[str, nbtrain.Run],
) -> None:
    # Longer than the runs above: a 24-step run ends (at ~20 steps/s) before a stop asked at step 4 lands.
    # That a resume ends like an uninterrupted run is tests/control/test_resume's; here: from FSDP's shards.
    n = 80
    with runs_in(runs["fsdp"].dir.parent.parent):
        run = nbtrain.finetune(
            config(extra=FSDP).replace(f"max_steps: {STEPS}", f"max_steps: {n}"), name="fsdp-resume"
        )
        wait_step(run, 4, timeout=300)
        st = run.stop(timeout=120)
        assert st.state == "stopped" and 4 <= st.step < n, run.logs(40)
        ckpt = next(run.paths.checkpoints.glob("checkpoint-*"))
        assert any(p.name.startswith("pytorch_model_fsdp") for p in ckpt.iterdir())  # sharded, not gathered
        resumed = run.resume()
        final = resumed.wait(timeout=600)
    assert final.state == "completed" and final.step == n
    assert "resuming from" in resumed.logs(400)
    assert steps_logged(resumed) == list(range(1, n + 1))
    losses = resumed.metrics()["loss"].tolist()
    assert losses[-1] < losses[0]  # it trained on from the shards, not from a fresh adapter
    assert json.loads((resumed.dir / "resolved.json").read_text())["resume"]["step"] == st.step
    ends = [r for r in read_jsonl(resumed.paths.system) if r.get("event") == "train_end"]
    assert ends and all(abs(e["param_numel_local"] / e["param_numel_full"] - 0.5) < 0.05 for e in ends)
