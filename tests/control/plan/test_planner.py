from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbtrain.control.config.load import load_config
from nbtrain.control.plan.planner import make_plan, train_args
from nbtrain.hardware import GPU, Hardware, probe
from tests.conftest import lora_yaml

T4 = GPU(0, "Tesla T4", 16 * 2**30, 15 * 2**30, (7, 5))
A100 = GPU(0, "NVIDIA A100-SXM4-80GB", 80 * 2**30, 79 * 2**30, (8, 0))


@pytest.mark.parametrize(
    ("gpus", "precision", "device", "want"),
    [
        ([], "auto", "cpu", "fp32"),
        ([T4], "auto", "cuda", "fp16"),  # no native bf16 before compute capability 8.0
        ([A100], "auto", "cuda", "bf16"),
        ([A100], "fp32", "cuda", "fp32"),
    ],
)
def test_device_and_precision_follow_the_hardware(
    workdir: Path, gpus: list[GPU], precision: str, device: str, want: str
) -> None:
    res = load_config(lora_yaml() + f"precision: {precision}\n")
    plan = make_plan(res, Hardware(gpus=gpus, cpu_count=2))
    assert (plan.device, plan.precision, plan.num_processes) == (device, want, 1)
    assert plan.reasons


def test_bf16_on_a_card_without_it_warns(workdir: Path) -> None:
    plan = make_plan(load_config(lora_yaml() + "precision: bf16\n"), Hardware(gpus=[T4]))
    assert plan.precision == "bf16" and "no native bf16" in plan.warnings[0]


def test_hf_style_bf16_flag_counts_as_a_precision_request(workdir: Path) -> None:
    plan = make_plan(load_config(lora_yaml(extra="  bf16: true\n")), Hardware(gpus=[A100]))
    assert plan.precision == "bf16"


def test_train_args_fill_notebook_defaults_but_user_keys_win(workdir: Path) -> None:
    res = load_config(lora_yaml(extra="  report_to: tensorboard\n"))
    args = train_args(res, make_plan(res, Hardware()))
    assert args["use_cpu"] is True and args["bf16"] is False
    assert args["report_to"] == "tensorboard" and args["logging_steps"] == 1
    assert args["include_num_input_tokens_seen"] == "non_padding"
    assert "eval_strategy" not in args


def test_probe_finds_no_gpu_here_without_touching_cuda() -> None:
    hw = probe()
    assert hw.cpu_count >= 1 and hw.ram_total > 0
    if not hw.gpus:
        assert hw.nvml_error


# ----------------------------------------------------------------- planner decisions from the estimate

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "model_configs"
RTX4090 = GPU(0, "NVIDIA GeForce RTX 4090", 24 * 2**30, 23 * 2**30, (8, 9))
T4_16 = GPU(0, "Tesla T4", 15 * 2**30, 15 * 2**30, (7, 5))
A100_40 = GPU(0, "NVIDIA A100-SXM4-40GB", 40 * 2**30, 39 * 2**30, (8, 0))
H100 = GPU(0, "NVIDIA H100 80GB HBM3", 80 * 2**30, 79 * 2**30, (9, 0))
SHARDED_LORA = {"method": "lora", "strategy": "zero3"}


def hw(*gpus: GPU, n: int = 1, ram_gib: int = 256) -> Hardware:
    cards = [
        GPU(i, g.name, g.memory_total, g.memory_free, g.compute_capability) for g in gpus for i in range(n)
    ]
    return Hardware(gpus=cards, cpu_count=16, ram_total=ram_gib * 2**30, ram_available=(ram_gib - 16) * 2**30)


def real_model(name: str, method: str, extra: str = "", train: str = "") -> str:
    return (
        f"model: {FIXTURES / name}\nmethod: {method}\ndata: {{train: data/add.jsonl}}\n"
        f"train: {{max_length: 1024{train}}}\n{extra}"
    )


@pytest.mark.parametrize(
    ("hardware", "model", "method", "extra", "want"),
    [
        # LoRA on the 16-bit weights where it fits one GPU as configured (torchtune runs 8B's on a 4090)
        (hw(RTX4090), "Meta-Llama-3-8B", "auto", "", {"method": "lora", "precision": "bf16"}),
        (hw(T4_16), "Meta-Llama-3-8B", "auto", "", {"method": "qlora", "precision": "fp16"}),
        (hw(RTX4090), "Llama-2-13b", "auto", "", {"method": "qlora"}),
        # several GPUs: LoRA with the 16-bit weights sharded by ZeRO-3 where that fits (torchtune's 70B LoRA)
        (hw(A100_40, n=8, ram_gib=680), "Meta-Llama-3-70B", "auto", "", SHARDED_LORA),
        (hw(H100, n=8, ram_gib=1872), "Meta-Llama-3-70B", "auto", "", SHARDED_LORA),
        # 8 x 24 GB: sharding alone does not fit, QLoRA's 4-bit copy does not fit each: sharded with offload
        (
            hw(RTX4090, n=8, ram_gib=512),
            "Meta-Llama-3-70B",
            "auto",
            "",
            {"method": "lora", "strategy": "zero3", "offload": "optimizer+params"},
        ),
        (hw(RTX4090, n=2), "Llama-2-13b", "auto", "", {"method": "lora", "strategy": "zero3"}),
        (hw(A100), "Meta-Llama-3-8B", "auto", "", {"method": "lora", "precision": "bf16"}),
        (hw(T4_16), "Qwen2.5-7B", "auto", "", {"method": "qlora", "precision": "fp16"}),
        (hw(A100), "Qwen2.5-0.5B", "auto", "", {"method": "lora"}),
        (hw(A100, n=8, ram_gib=1024), "Llama-2-13b", "full", "", {"strategy": "zero2", "num_processes": 8}),
        # ZeRO-2 would fit the GPUs, but 8 processes each loading the model in fp32 would not fit 256 GiB of
        # host RAM; ZeRO-3 loads it one module at a time
        (hw(A100, n=8), "Llama-2-13b", "full", "", {"strategy": "zero3", "num_processes": 8}),
        (hw(A100, n=4), "Llama-2-13b", "full", "", {"strategy": "zero3", "offload": "none"}),
        (hw(A100, n=2), "Llama-2-13b", "full", "", {"strategy": "zero3", "offload": "optimizer"}),
        (hw(A100, n=4), "Qwen2.5-0.5B", "full", "", {"strategy": "ddp"}),
    ],
)
def test_planner_decisions(
    workdir: Path, hardware: Hardware, model: str, method: str, extra: str, want: dict[str, object]
) -> None:
    import nbtrain

    prep = nbtrain.prepare(
        real_model(model, method, extra, ", per_device_train_batch_size: 2"), hardware=hardware
    )
    got = {k: getattr(prep.plan, k) for k in want}
    assert got == want, prep.plan.reasons
    assert prep.plan.fits and prep.plan.estimate is not None
    assert prep.resolved.config.method == prep.plan.method  # recorded concretely in resolved.json
    assert any(want.get("method", "") in r or want.get("strategy", "") in r for r in prep.plan.reasons)


def test_micro_batch_auto_keeps_the_effective_batch(workdir: Path) -> None:
    import nbtrain

    text = real_model("Meta-Llama-3-8B", "qlora", "batch_size: 32\n", ", per_device_train_batch_size: auto")
    prep = nbtrain.prepare(text, hardware=hw(RTX4090))
    micro, accum = (
        prep.train_args["per_device_train_batch_size"],
        prep.train_args["gradient_accumulation_steps"],
    )
    assert micro & (micro - 1) == 0 and micro >= 1  # a power of two
    assert micro * accum >= 32 and micro * (accum - 1) < 32
    bigger = nbtrain.prepare(text.replace("auto", str(micro * 2)), hardware=hw(RTX4090))
    assert not bigger.plan.fits  # the next power of two would not have fitted


@pytest.mark.parametrize(("batch", "gpus", "want"), [(8, 1, (8, 1)), (12, 1, (12, 1)), (8, 4, (2, 1))])
def test_micro_batch_auto_never_exceeds_the_batch_asked(
    workdir: Path, batch: int, gpus: int, want: tuple[int, int]
) -> None:
    import nbtrain

    text = real_model("Qwen2.5-0.5B", "lora", f"batch_size: {batch}\n", ", per_device_train_batch_size: auto")
    prep = nbtrain.prepare(text, hardware=hw(A100, n=gpus))  # room for far more than asked
    args = prep.train_args
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == want
    assert f"keeps the effective batch at {batch} (asked {batch})" in " ".join(prep.plan.reasons)


@pytest.mark.parametrize(
    ("hardware", "model", "method", "batch", "want"),
    [
        (hw(A100), "Qwen2.5-0.5B", "lora", 2, False),  # room to spare: the faster step
        (hw(RTX4090), "Meta-Llama-3-8B", "qlora", 4, True),  # 4 x 1024 tokens only fit recomputed
    ],
)
def test_gradient_checkpointing_left_out_is_on_only_when_the_run_needs_it(
    workdir: Path, hardware: Hardware, model: str, method: str, batch: int, want: bool
) -> None:
    import nbtrain

    for train in (f", per_device_train_batch_size: {batch}", f", per_device_train_batch_size: {batch}, "
                  "gradient_checkpointing: auto"):  # fmt: skip
        prep = nbtrain.prepare(real_model(model, method, train=train), hardware=hardware)
        assert prep.plan.fits, prep.plan.fit_advice
        assert prep.train_args["gradient_checkpointing"] is want
        assert prep.plan.estimate is not None
        assert prep.plan.estimate["inputs"]["gradient_checkpointing"] is want  # the estimate is of that run
        why = next(r for r in prep.plan.reasons if r.startswith("gradient_checkpointing"))
        assert ("would not fit" in why) is want and ("third more compute" in why) is not want


def test_gradient_checkpointing_given_is_kept_and_named_when_it_does_not_fit(workdir: Path) -> None:
    import nbtrain

    on = nbtrain.prepare(
        real_model("Qwen2.5-0.5B", "lora", train=", gradient_checkpointing: true"), hardware=hw(A100)
    )
    assert on.train_args["gradient_checkpointing"] is True and on.plan.gradient_checkpointing is None
    off = nbtrain.prepare(
        real_model("Meta-Llama-3-8B", "qlora", train=", per_device_train_batch_size: 4, "
                   "gradient_checkpointing: false"),
        hardware=hw(RTX4090),
    )  # fmt: skip
    assert off.train_args["gradient_checkpointing"] is False and not off.plan.fits
    assert "Smallest change that fits: gradient_checkpointing: true" in off.plan.fit_advice


def test_a_run_that_cannot_fit_is_refused_with_the_smallest_change(workdir: Path) -> None:
    import nbtrain
    from nbtrain.contract.errors import NbtrainError

    text = real_model("Meta-Llama-3-8B", "full")
    prep = nbtrain.prepare(text, hardware=hw(RTX4090))
    assert not prep.plan.fits
    assert (
        "Smallest change that fits: method: lora with per_device_train_batch_size: 1" in prep.plan.fit_advice
    )
    assert "DOES NOT FIT" in prep.summary()
    with pytest.raises(
        NbtrainError, match=r"not started: needs [\d.]+ GiB per GPU, 21.6 GiB usable of 24.0 GiB"
    ):
        nbtrain.start(prep)
    assert nbtrain.runs() == []


def test_estimate_report_lists_methods_and_strategies(workdir: Path) -> None:
    import nbtrain

    text = real_model("Meta-Llama-3-8B", "auto", "", ", per_device_train_batch_size: 2")
    report = nbtrain.estimate(text, hardware=hw(RTX4090, n=2))
    rows = {(r["method"], r["strategy"], r["offload"]): r for r in report.table}
    assert rows[("qlora", "none", "none")]["fits"] and not rows[("full", "none", "none")]["fits"]
    assert ("full", "zero3", "optimizer+params") in rows
    assert "method x strategy on this machine" in report.text()
    assert report.figure() is not None


H200 = GPU(0, "NVIDIA H200", 141 * 2**30, 140 * 2**30, (9, 0))
BOTH_FLASH = ("flash_attn", "flash_attn_interface")


@pytest.mark.parametrize(
    ("gpus", "kernels", "extra", "want", "says"),
    [
        ([H200], ("liger_kernel",), "", True, "Liger kernels on"),
        ([H200], (), "", None, "liger-kernel is not installed"),
        ([], ("liger_kernel",), "", None, None),  # never on a CPU
        ([H200], ("liger_kernel",), "  use_liger_kernel: false\n", None, None),  # the user's word wins
        ([T4], ("liger_kernel",), "", True, "Liger kernels on"),  # Triton runs on Turing too
    ],
)
def test_liger_kernels_are_planned_from_the_facts(
    workdir: Path, gpus: list[GPU], kernels: tuple[str, ...], extra: str, want: bool | None, says: str | None
) -> None:
    res = load_config(lora_yaml(extra=extra))
    plan = make_plan(res, Hardware(gpus=gpus, cpu_count=2, kernels=kernels))
    assert plan.liger is want
    assert train_args(res, plan).get("use_liger_kernel") is (want or (False if extra else None))
    liger_reasons = [r for r in plan.reasons if "Liger" in r or "liger" in r]
    assert (says is None and not liger_reasons) or any(says in r for r in liger_reasons), plan.reasons
    if want:  # and the estimate counts Liger's smaller activations
        assert plan.estimate is not None and plan.estimate["inputs"]["liger"] is True


def test_liger_is_left_to_sft(workdir: Path) -> None:
    row = {"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}
    (workdir / "data" / "pref.jsonl").write_text(json.dumps(row) + "\n")
    res = load_config(lora_yaml().replace("add.jsonl", "pref.jsonl") + "objective: dpo\n")
    plan = make_plan(res, Hardware(gpus=[H200], cpu_count=2, kernels=("liger_kernel",)))
    assert plan.liger is None and "use_liger_kernel" not in train_args(res, plan)


@pytest.mark.parametrize(
    ("gpus", "kernels", "extra", "want", "says"),
    [
        ([A100], ("flash_attn",), "", "flash_attention_2", "attention flash_attention_2"),
        ([T4], ("flash_attn",), "", None, "needs compute capability 8.0"),  # Turing has no FA2
        ([A100], (), "", None, None),  # not installed: transformers' default, nothing to say
        ([], ("flash_attn",), "", None, None),  # never on a CPU
        ([A100], ("flash_attn",), "precision: fp32\n", None, "not fp32"),
        ([A100], ("flash_attn",), "train:\n  model_init_kwargs: {attn_implementation: sdpa}\n", None, None),
        # flash-attention 3 on a Hopper; flash-attention 2 elsewhere, or said why not
        ([H200], BOTH_FLASH, "", "flash_attention_3", "attention flash_attention_3"),
        ([A100], BOTH_FLASH, "", "flash_attention_2", "attention flash_attention_2"),
        ([A100], ("flash_attn_interface",), "", None, "runs on Hopper (compute capability 9.0) alone"),
        ([T4], ("flash_attn_interface",), "", None, "runs on Hopper"),
        ([], ("flash_attn", "flash_attn_interface"), "", None, None),
    ],
)
def test_the_attention_kernel_is_planned_from_the_facts(
    workdir: Path, gpus: list[GPU], kernels: tuple[str, ...], extra: str, want: str | None, says: str | None
) -> None:
    text = lora_yaml() + extra if not extra.startswith("train:") else lora_yaml(extra=extra.split("\n", 1)[1])
    plan = make_plan(load_config(text), Hardware(gpus=gpus, cpu_count=2, kernels=kernels))
    assert plan.attn_implementation == want
    said = [r for r in plan.reasons if r.startswith("attention")]
    assert (says is None and not said) or any(says in r for r in said), plan.reasons


@pytest.mark.parametrize(
    ("extra", "objective", "want"),
    [
        ("", "", True),  # SFT on a llama decoder: batches flattened where cheaper
        ("  padding_free: false\n", "", None),  # the user's word wins
        ("  packing: true\n", "", None),  # packing decides the layout itself
    ],
)
def test_padding_free_batches_are_planned_for_sft_on_decoders_that_keep_rows_apart(
    workdir: Path, extra: str, objective: str, want: bool | None
) -> None:
    res = load_config(lora_yaml(extra=extra) + objective)
    plan = make_plan(res, Hardware(cpu_count=2))
    assert plan.padding_free is want
    said = [r for r in plan.reasons if r.startswith("padding-free")]
    assert bool(said) is bool(want), plan.reasons
    if want:
        assert "llama decoder" in said[0] and "padding_free: false" in said[0]
        assert "padding_free" not in train_args(res, plan)  # TRL's own flag stays off: nbtrain's collator


def test_padding_free_is_left_to_sft(workdir: Path) -> None:
    row = {"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}
    (workdir / "data" / "pref.jsonl").write_text(json.dumps(row) + "\n")
    res = load_config(lora_yaml().replace("add.jsonl", "pref.jsonl") + "objective: dpo\n")
    assert make_plan(res, Hardware(cpu_count=2)).padding_free is None


@pytest.mark.parametrize(
    ("gpus", "extra", "want"),
    [
        ([A100], "", "adamw_torch_fused"),  # a CUDA run: torch's fused AdamW, written into the run
        ([T4], "", "adamw_torch_fused"),
        ([A100], "  optim: paged_adamw_8bit\n", None),  # the user's word wins
        ([], "", None),  # never picked on a CPU
    ],
)
def test_the_fused_optimizer_is_planned_on_a_gpu_and_never_on_a_cpu(
    workdir: Path, gpus: list[GPU], extra: str, want: str | None
) -> None:
    res = load_config(lora_yaml(extra=extra))
    plan = make_plan(res, Hardware(gpus=gpus, cpu_count=2))
    assert plan.optim == want
    said = [r for r in plan.reasons if r.startswith("optim")]
    assert bool(said) is bool(want), plan.reasons
    if want:
        assert train_args(res, plan)["optim"] == want and plan.estimate is not None
        assert plan.estimate["inputs"]["optim"] == want
    elif extra:
        assert train_args(res, plan)["optim"] == "paged_adamw_8bit"


@pytest.mark.parametrize(
    ("gpus", "extra", "says"),
    [([H200], "", True), ([H200], "  torch_compile: true\n", False), ([], "", False)],
)
def test_torch_compile_is_left_off_and_said_on_a_gpu(
    workdir: Path, gpus: list[GPU], extra: str, says: bool
) -> None:
    res = load_config(lora_yaml(extra=extra))
    plan = make_plan(res, Hardware(gpus=gpus, cpu_count=2))
    said = [r for r in plan.reasons if r.startswith("torch_compile")]
    assert bool(said) is says, plan.reasons
    assert train_args(res, plan).get("torch_compile") is (True if extra else None)
