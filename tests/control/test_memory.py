"""The memory estimator: parameter counts, model states against DeepSpeed's estimator, the parts of a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbtrain.control.memory import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION,
    PARTS,
    EstimateError,
    activation_bytes,
    count_parameters,
    estimate,
    load_model_config,
    lora_parameters,
    quantized_weight_bytes,
    resolve_lora_targets,
    zero_model_states,
)

CONFIGS = Path(__file__).parents[1] / "fixtures" / "model_configs"
MODELS = ("Meta-Llama-3-8B", "Qwen2.5-7B", "Mistral-7B-v0.1", "Qwen2.5-0.5B")


def cfg(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name / "config.json").read_text())


LLAMA3 = cfg("Meta-Llama-3-8B")
QWEN_SMALL = cfg("Qwen2.5-0.5B")


# ------------------------------------------------------------------------------------ parameter counts


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("Meta-Llama-3-8B", 8.03e9),
        ("Qwen2.5-7B", 7.62e9),
        ("Mistral-7B-v0.1", 7.24e9),
        ("Qwen2.5-0.5B", 0.494e9),  # the model card rounds to "0.49B"; the Hub lists 494M
    ],
)
def test_parameter_count_matches_the_published_size(name: str, published: float) -> None:
    assert count_parameters(cfg(name)).total == pytest.approx(published, rel=0.005)


def test_parameter_counts_are_exact_for_known_checkpoints() -> None:
    # The sums of the tensors in the released safetensors files.
    assert count_parameters(LLAMA3).total == 8_030_261_248
    assert count_parameters(cfg("Qwen2.5-7B")).total == 7_615_616_512
    assert count_parameters(cfg("Mistral-7B-v0.1")).total == 7_241_732_096
    assert count_parameters(QWEN_SMALL).total == 494_032_768


def test_tied_embeddings_count_once() -> None:
    untied = count_parameters({**QWEN_SMALL, "tie_word_embeddings": False})
    tied = count_parameters(QWEN_SMALL)
    assert tied.lm_head == 0
    assert untied.total - tied.total == 151_936 * 896


def test_qwen2_has_qkv_biases_and_llama_attention_bias_adds_all_four() -> None:
    qwen = count_parameters(QWEN_SMALL)
    assert [lin.bias for lin in qwen.linears[:4]] == [True, True, True, False]
    plain = count_parameters(LLAMA3)
    biased = count_parameters({**LLAMA3, "attention_bias": True, "mlp_bias": True})
    per_layer = (4096 + 1024 + 1024 + 4096) + (14336 + 14336 + 4096)
    assert biased.total - plain.total == 32 * per_layer


def test_explicit_head_dim_overrides_hidden_over_heads() -> None:
    pc = count_parameters({**LLAMA3, "head_dim": 256})
    assert pc.linear("q_proj").out_features == 32 * 256
    assert pc.linear("k_proj").out_features == 8 * 256


def test_missing_hyperparameters_are_named() -> None:
    with pytest.raises(EstimateError, match="intermediate_size"):
        count_parameters({k: v for k, v in LLAMA3.items() if k != "intermediate_size"})


def test_counts_match_the_modules_transformers_builds() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    for name in MODELS:
        config = transformers.AutoConfig.from_pretrained(CONFIGS / name)
        with torch.device("meta"):  # shapes only: no memory, no weights
            model = transformers.AutoModelForCausalLM.from_config(config)
        pc = count_parameters(cfg(name))
        assert pc.total == sum(p.numel() for p in model.parameters()), name
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        assert pc.largest_module == largest, name
        lora = peft.get_peft_model(model, peft.LoraConfig(r=8, task_type="CAUSAL_LM"))
        assert lora_parameters(cfg(name), 8) == lora.get_nb_trainable_parameters()[0], name


# ----------------------------------------------------------------------------------------------- LoRA


def test_lora_auto_targets_are_pefts_defaults() -> None:
    assert resolve_lora_targets(LLAMA3) == ["q_proj", "v_proj"]
    assert resolve_lora_targets(QWEN_SMALL, "all-linear") == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip


def test_lora_adds_r_times_in_plus_out_per_wrapped_linear() -> None:
    # Llama-3-8B, r=8 on q (4096->4096) and v (4096->1024): peft prints 3,407,872 trainable.
    assert lora_parameters(LLAMA3, 8) == 32 * 8 * ((4096 + 4096) + (4096 + 1024)) == 3_407_872
    all_linear = 32 * 16 * (2 * 8192 + 2 * 5120 + 3 * (4096 + 14336))
    assert lora_parameters(LLAMA3, 16, "all-linear") == all_linear
    assert lora_parameters(LLAMA3, 8, ["model.layers.0.self_attn.q_proj"]) == 32 * 8 * 8192


def test_unknown_lora_target_is_rejected_with_the_choices() -> None:
    with pytest.raises(EstimateError, match=r"q_projj.*choose from q_proj"):
        lora_parameters(LLAMA3, 8, ["q_projj"])


# -------------------------------------------------------------------------------------- quantisation


def test_nf4_costs_half_a_byte_plus_block_constants() -> None:
    pc = count_parameters(LLAMA3)
    weights = pc.quantized_linears
    assert quantized_weight_bytes(pc, 4, double_quant=False) / weights == 0.5 + 4 / 64
    # QLoRA paper: double quantisation takes the constants from 0.5 to 0.127 bits per weight.
    dq_bits = (quantized_weight_bytes(pc, 4, double_quant=True) / weights - 0.5) * 8
    assert dq_bits == pytest.approx(0.127, abs=5e-4)


def test_nf4_bytes_match_bitsandbytes_own_quantisation() -> None:
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("bitsandbytes.functional")
    pc = count_parameters({**LLAMA3, "num_hidden_layers": 1})
    for double_quant in (False, True):
        got = 0
        for lin in pc.linears:
            w = torch.zeros(lin.out_features, lin.in_features, dtype=torch.bfloat16)
            q, st = functional.quantize_4bit(
                w, blocksize=64, compress_statistics=double_quant, quant_type="nf4"
            )
            got += q.numel() + st.absmax.numel() * st.absmax.element_size()
            if double_quant:
                got += st.state2.absmax.numel() * st.state2.absmax.element_size()
        assert quantized_weight_bytes(pc, 4, double_quant) == got


def test_int8_costs_a_byte_plus_a_scale_per_row() -> None:
    pc = count_parameters(QWEN_SMALL)
    rows = 24 * (896 + 128 + 128 + 896 + 4864 + 4864 + 896)
    assert quantized_weight_bytes(pc, 8) == pc.quantized_linears + 4 * rows


def test_qlora_keeps_embeddings_and_lm_head_unquantised_in_fp32() -> None:
    pc = count_parameters(LLAMA3)
    est = estimate(LLAMA3, method="qlora")
    unquantised = pc.total - pc.quantized_linears
    assert unquantised > pc.embeddings + pc.lm_head
    dequantised = 2 * 4096 * 14336  # one bf16 weight at a time
    assert est.parts["weights"] == round(quantized_weight_bytes(pc, 4) + 4 * unquantised + dequantised)
    assert est.parts["weights"] < estimate(LLAMA3, method="lora").parts["weights"] / 2


# ------------------------------------------------------------------------------------- model states


PSI = count_parameters(LLAMA3).total


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_zero_paper_totals_for_mixed_precision_adam(n: int) -> None:
    assert zero_model_states(PSI, "zero1", n).paper_bytes == pytest.approx(4 * PSI + 12 * PSI / n)
    assert zero_model_states(PSI, "zero2", n).paper_bytes == pytest.approx(2 * PSI + 14 * PSI / n)
    assert zero_model_states(PSI, "zero3", n).paper_bytes == pytest.approx(16 * PSI / n)


def test_full_fine_tune_without_deepspeed_holds_16_bytes_per_parameter() -> None:
    assert estimate(LLAMA3, method="full").model_state_bytes == 16 * PSI
    # DDP's all-reduce buckets copy every fp32 gradient: 4 bytes more.
    assert estimate(LLAMA3, method="full", strategy="ddp", world_size=8).model_state_bytes == 20 * PSI


def ds_zero2(psi: int, n: int, offload: bool, nodes: int = 1) -> tuple[int, int]:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cpu, gpu = estimate_zero2_model_states_mem_needs(
        psi, n // nodes, nodes, offload, additional_buffer_factor=1.0
    )
    return int(cpu), int(gpu)


def ds_zero3(psi: int, largest: int, n: int, offload: bool, params: bool, nodes: int = 1) -> tuple[int, int]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        psi, largest, n // nodes, nodes, offload, params, zero_init=True, additional_buffer_factor=1.0
    )
    return int(cpu), int(gpu)


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_zero2_model_states_equal_deepspeeds_estimator(n: int, offload: bool) -> None:
    pytest.importorskip("deepspeed")
    for name in MODELS:
        model = cfg(name)
        psi = count_parameters(model).total
        est = estimate(
            model, method="full", strategy="zero2", offload="optimizer" if offload else "none", world_size=n
        )
        cpu, gpu = ds_zero2(psi, n, offload)
        assert est.model_state_bytes == pytest.approx(gpu, abs=4), name
        # Host RAM: DeepSpeed counts loading (4 B per parameter per process) or the offloaded 16Ψ.
        assert est.cpu_bytes == pytest.approx(cpu, abs=4), name


@pytest.mark.parametrize(("offload", "params"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize(("n", "nodes"), [(1, 1), (4, 1), (8, 1), (16, 2)])
def test_zero3_model_states_equal_deepspeeds_estimator(
    n: int, nodes: int, offload: bool, params: bool
) -> None:
    pytest.importorskip("deepspeed")
    mode = "optimizer+params" if params else "optimizer" if offload else "none"
    for name in MODELS:
        model = cfg(name)
        pc = count_parameters(model)
        est = estimate(model, method="full", strategy="zero3", offload=mode, world_size=n, nodes=nodes)
        cpu, gpu = ds_zero3(pc.total, pc.largest_module, n, offload, params, nodes)
        assert est.model_state_bytes == pytest.approx(gpu, abs=4), name
        # DeepSpeed gives loading (zero.Init: 4 B x largest module per process) or the offloaded
        # state; a node needs the larger of the two, which is what nbtrain reports.
        loading, _ = ds_zero3(pc.total, pc.largest_module, n, False, False, nodes)
        assert est.cpu_bytes == pytest.approx(max(cpu, loading), abs=4), name


def test_lora_base_is_replicated_under_zero2_and_partitioned_under_zero3() -> None:
    pc = count_parameters(LLAMA3)
    z2 = estimate(LLAMA3, method="lora", strategy="zero2", world_size=8)
    z3 = estimate(LLAMA3, method="lora", strategy="zero3", world_size=8)
    assert z2.parts["weights"] == 2 * pc.total
    assert z3.parts["weights"] == 2 * pc.total // 8 + 2 * pc.largest_module
    # Only the adapters are optimizer-managed: their fp32 master and moments are sharded.
    assert z2.parts["optimizer"] == round(12 * lora_parameters(LLAMA3, 8) / 8)


def test_offload_moves_optimizer_state_to_the_host() -> None:
    on_gpu = estimate(LLAMA3, method="full", strategy="zero3", world_size=8)
    off = estimate(LLAMA3, method="full", strategy="zero3", offload="optimizer", world_size=8)
    assert off.parts["optimizer"] == 0
    assert off.cpu_parts["optimizer"] == pytest.approx(12 * PSI, abs=8)  # all 8 ranks on one node
    assert off.per_device_bytes < on_gpu.per_device_bytes
    params_off = estimate(LLAMA3, method="full", strategy="zero3", offload="optimizer+params", world_size=8)
    assert params_off.cpu_parts["weights"] == pytest.approx(2 * PSI, abs=8)
    assert params_off.cpu_bytes == pytest.approx(18 * PSI, abs=8)


def test_eight_bit_adam_quarters_the_optimizer_state() -> None:
    full = estimate(LLAMA3, method="full", optim="adamw_torch_fused").parts["optimizer"]
    eight = estimate(LLAMA3, method="full", optim="paged_adamw_8bit").parts["optimizer"]
    assert eight / full == pytest.approx((1 + 4 / 256) / 4)


def test_unknown_optimizer_counts_as_adamw_with_a_note() -> None:
    est = estimate(LLAMA3, method="full", optim="galore_adamw")
    assert est.parts["optimizer"] == 8 * PSI
    assert any("galore_adamw" in n for n in est.notes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "ddp", "offload": "optimizer"}, "offload needs a DeepSpeed ZeRO"),
        ({"strategy": "zero2", "offload": "optimizer+params"}, "needs zero3"),
        ({"method": "qlora", "strategy": "zero3"}, "cannot combine with zero3"),
        ({"world_size": 3, "nodes": 2, "strategy": "ddp"}, "multiple of nodes"),
        ({"precision": "fp8"}, "precision"),
    ],
)
def test_combinations_nbtrain_rejects_raise(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(EstimateError, match=match):
        estimate(LLAMA3, **kwargs)


# -------------------------------------------------------------------------------------- activations


def test_activations_grow_with_tokens_and_shrink_with_checkpointing() -> None:
    pc = count_parameters(LLAMA3)
    one = activation_bytes(pc, 1, 1024, 2, checkpointing=True)
    assert activation_bytes(pc, 4, 1024, 2, checkpointing=True) == 4 * one
    assert activation_bytes(pc, 1, 4096, 2, checkpointing=True) == 4 * one
    assert activation_bytes(pc, 1, 1024, 2, checkpointing=False) > 4 * one
    assert activation_bytes(pc, 1, 1024, 4, checkpointing=True) > one


def test_logits_for_the_loss_dominate_a_checkpointed_large_vocab_model() -> None:
    pc = count_parameters(LLAMA3)
    logits = 1024 * 128_256 * (2 + 4 + 4)  # bf16 logits, fp32 upcast, fp32 log-softmax
    total = activation_bytes(pc, 1, 1024, 2, checkpointing=True)
    assert logits / total > 0.5


def test_sft_big_batches_on_a_gpu_count_trls_fused_head_and_other_objectives_the_logits() -> None:
    pc = count_parameters(LLAMA3)
    sft = estimate(LLAMA3, micro_batch=8, seq_len=1024)  # 8192 x 128,256 fp32 logits: 4 GiB > 64 MiB
    dpo = estimate(LLAMA3, micro_batch=8, seq_len=1024, objective="dpo")
    logits = 8 * 1024 * pc.vocab * (8 + 2)
    assert dpo.parts["activations"] - sft.parts["activations"] > 0.8 * logits
    assert "fused LM head" in sft.details["activations"]
    # a CPU run scores batches up to 1 GiB of logits whole, as the worker does (sft_full_logits)
    small = estimate(QWEN_SMALL, micro_batch=1, seq_len=256, device="cpu")
    assert "logits over" in small.details["activations"]


def test_liger_and_frozen_projections_keep_less_and_qlora_keeps_more() -> None:
    pc = count_parameters(LLAMA3)
    base = activation_bytes(pc, 1, 1024, 2, checkpointing=False, trained=("q_proj", "v_proj"))
    assert (
        activation_bytes(pc, 1, 1024, 2, checkpointing=False, trained=("q_proj", "v_proj"), liger=True) < base
    )
    assert activation_bytes(pc, 1, 1024, 2, checkpointing=False) > base  # a full fine-tune keeps every input
    assert (
        activation_bytes(pc, 1, 1024, 2, checkpointing=False, trained=("q_proj", "v_proj"), quantized=True)
        > base
    )


PEAKS = json.loads((CONFIGS.parent / "gpu_peaks.json").read_text())


@pytest.mark.parametrize(
    "peak",
    PEAKS["peaks"],
    ids=lambda p: "{method}-{micro_batch}x{seq_len}-gc{gradient_checkpointing}-liger{liger}".format(**p),
)
def test_the_estimate_is_within_15_percent_of_each_peak_an_h200_measured(peak: dict[str, Any]) -> None:
    """max_memory_allocated counts live tensors: held to the estimate less its overhead part (CUDA context
    and allocator reserve), as tests/worker/test_memory_measured does on a GPU."""
    est = estimate(
        {**PEAKS["shape"], "vocab_size": peak["vocab"]}, method=peak["method"], precision="bf16",
        micro_batch=peak["micro_batch"], seq_len=peak["seq_len"],
        gradient_checkpointing=peak["gradient_checkpointing"], liger=peak["liger"],
    )  # fmt: skip
    tensors = est.per_device_bytes - est.parts["overhead"]
    err = peak["peak_bytes"] / tensors - 1
    assert abs(err) <= 0.15, (f"{err:+.1%}", peak["source"], est.parts)
    assert peak["peak_bytes"] <= est.per_device_bytes  # the whole estimate, overhead too, covers the peak


# --------------------------------------------------------------------------------------- the estimate


def test_per_device_bytes_is_the_sum_of_parts_plus_nothing_else() -> None:
    est = estimate(QWEN_SMALL, method="lora", strategy="ddp", world_size=2)
    assert list(est.parts) == list(PARTS)
    assert est.per_device_bytes == sum(est.parts.values())
    assert est.parts["overhead"] > CUDA_CONTEXT_BYTES
    tensors = sum(v for k, v in est.parts.items() if k != "overhead")
    assert est.parts["overhead"] >= CUDA_CONTEXT_BYTES + FRAGMENTATION * tensors - 1


def test_to_dict_is_json_and_explain_names_every_part() -> None:
    est = estimate(LLAMA3, method="qlora", strategy="zero2", offload="optimizer", world_size=2)
    data = json.loads(json.dumps(est.to_dict()))
    assert data["per_device_bytes"] == est.per_device_bytes
    assert data["trainable_params"] == lora_parameters(LLAMA3, 8)
    text = est.explain()
    for part in PARTS:
        assert part in text
    assert "host RAM per node" in text


def test_cpu_run_has_no_cuda_context() -> None:
    est = estimate(QWEN_SMALL, method="lora", precision="fp32", device="cpu")
    tensors = sum(v for k, v in est.parts.items() if k != "overhead")
    assert est.parts["overhead"] == pytest.approx(FRAGMENTATION * tensors, abs=1)


def test_load_model_config_reads_a_directory_or_the_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_model_config(CONFIGS / "Qwen2.5-0.5B") == QWEN_SMALL
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(QWEN_SMALL))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert load_model_config("Qwen/Qwen2.5-0.5B") == QWEN_SMALL
    assert load_model_config("nobody/not-cached") is None


# ------------------------------------------------------------------------------------- kernel safety


def test_importing_the_estimator_imports_no_training_stack() -> None:
    code = (
        "import sys, json, nbtrain.control.memory\n"
        "heavy = ('torch', 'transformers', 'bitsandbytes', 'deepspeed', 'peft', 'plotly')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_estimator_is_pure_it_imports_no_config_plan_or_hardware() -> None:
    # memory is model facts + training shape -> bytes; the planner (above it) brings configs and machines.
    code = (
        "import sys, json, nbtrain.control.memory\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('nbtrain.control.config.schema', "
        "'nbtrain.control.config.load', 'nbtrain.control.config.rules', "
        "'nbtrain.control.config.preset', 'nbtrain.control.plan', 'nbtrain.hardware', 'pydantic')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
