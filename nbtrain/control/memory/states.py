"""The bytes a parameter costs in training: optimizer states per optimizer, the model states under
DDP and ZeRO-1/2/3 (Rajbhandari et al. 2020, section 5; DeepSpeed's own accounting), and the
activations a micro-batch keeps for its backward pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from nbtrain.contract.objectives import FUSED_HEAD_TILE_TOKENS, FUSED_HEAD_TILE_VOCAB
from nbtrain.control.config.choices import ZERO_STAGES
from nbtrain.control.memory.costs import DOUBLE_QUANT_BLOCK, NF4_BLOCK, OPTIM_8BIT_BLOCK, EstimateError
from nbtrain.control.memory.params import ParamCounts

# ====================================================================================== byte sizes


def quantized_weight_bytes(pc: ParamCounts, bits: int, double_quant: bool = True) -> float:
    """Bytes of the decoder's linear weights after bitsandbytes quantisation (biases excluded).

    * 4-bit (NF4/FP4): 0.5 byte per weight + one absmax per 64-weight block: an fp32 (4/64 byte per
      weight), or with double quantisation an 8-bit absmax (1/64) plus one fp32 second-level constant
      per 256 blocks (4/(64·256)) - Dettmers et al., "QLoRA" (2023), §3: 0.5 -> 0.127 bits per weight.
    * 8-bit (LLM.int8): 1 byte per weight + one fp32 scale per output row.

    Per-tensor constants (a 16-value code book, an offset) are a few bytes and left out.
    """
    weights = pc.quantized_linears
    if bits == 4:
        per_block = 1 + 4 / DOUBLE_QUANT_BLOCK if double_quant else 4
        return weights * 0.5 + weights / NF4_BLOCK * per_block
    if bits == 8:
        rows = pc.layers * sum(lin.out_features for lin in pc.linears)
        return float(weights + 4 * rows)
    raise EstimateError(f"quantization bits is 4 or 8, not {bits}")


@dataclass(frozen=True)
class OptimizerStates:
    states: int  # tensors kept per parameter
    bytes_per_state: float
    exact: bool = True  # False when the optimizer keeps low-rank or factored states (an upper bound here)

    @property
    def per_param(self) -> float:
        return self.states * self.bytes_per_state


_8BIT = 1 + 4 / OPTIM_8BIT_BLOCK  # one byte + a blockwise fp32 absmax per 256 elements

# ``optim`` name (TrainingArguments) -> states per parameter. 32-bit states live in the parameter's dtype,
# which is fp32 wherever nbtrain trains (fp32 full weights, fp32 adapters, DeepSpeed's fp32 master).
OPTIMIZERS: dict[str, OptimizerStates] = {
    **{
        name: OptimizerStates(2, 4)
        for name in (
            "adamw_torch",
            "adamw_torch_fused",
            "adamw_torch_npu_fused",
            "adamw_torch_xla",
            "adamw_anyprecision",
            "paged_adamw_32bit",
            "stable_adamw",
            "grokadamw",
            "schedule_free_adamw",
            "schedule_free_radam",
        )
    },
    **{name: OptimizerStates(2, _8BIT) for name in ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit")},
    "adamw_torch_8bit": OptimizerStates(2, 1),
    "adamw_torch_4bit": OptimizerStates(2, 0.5),
    "ademamix": OptimizerStates(3, 4),
    "paged_ademamix_32bit": OptimizerStates(3, 4),
    "ademamix_8bit": OptimizerStates(3, _8BIT),
    "paged_ademamix_8bit": OptimizerStates(3, _8BIT),
    "lion_32bit": OptimizerStates(1, 4),
    "paged_lion_32bit": OptimizerStates(1, 4),
    "lion_8bit": OptimizerStates(1, _8BIT),
    "paged_lion_8bit": OptimizerStates(1, _8BIT),
    "rmsprop": OptimizerStates(1, 4),
    "rmsprop_bnb": OptimizerStates(1, 4),
    "rmsprop_bnb_32bit": OptimizerStates(1, 4),
    "rmsprop_bnb_8bit": OptimizerStates(1, _8BIT),
    "adagrad": OptimizerStates(1, 4),
    "schedule_free_sgd": OptimizerStates(1, 4),
    "sgd": OptimizerStates(0, 0),  # the Trainer passes no momentum
    "adafactor": OptimizerStates(0, 0, exact=False),  # factored second moment: rows + columns only
    "lomo": OptimizerStates(0, 0),
    "adalomo": OptimizerStates(0, 0, exact=False),
}


def optimizer_states(optim: str) -> OptimizerStates:
    """States per parameter for a TrainingArguments ``optim``; unknown or low-rank ones count as AdamW."""
    return OPTIMIZERS.get(optim, OptimizerStates(2, 4, exact=False))


def dtype_width(precision: str) -> int:
    """Bytes of one value in the training precision (16-bit for bf16/fp16, 4 for fp32)."""
    if precision in ("bf16", "fp16", "auto"):
        return 2
    if precision == "fp32":
        return 4
    raise EstimateError(f"precision is fp32, fp16 or bf16, not {precision!r}")


# =================================================================================== model states


@dataclass(frozen=True)
class ModelStates:
    """Per-device bytes of the states of Ψ trainable parameters, split as the ZeRO paper counts them.

    ``paper_bytes`` is the paper's K = 12 accounting (16-bit weights and gradients, fp32 master + moments);
    ``fp32_grad_extra`` is what DeepSpeed's fp32 gradient adds; ``gathered_*`` the ZeRO-3 working set.
    Each field is on the device; the ``cpu_*`` fields are what offloading moved to this rank's host.
    ``paper_grads`` is the paper's gradient count where DeepSpeed's differs (ZeRO-1 in fp32).
    """

    weights: float
    grads: float
    fp32_grad_extra: float
    master: float
    moments: float
    gathered_weights: float = 0.0
    gathered_grads: float = 0.0
    cpu_weights: float = 0.0
    cpu_grads: float = 0.0
    cpu_optimizer: float = 0.0
    paper_grads: float | None = None

    @property
    def paper_bytes(self) -> float:
        grads = self.grads if self.paper_grads is None else self.paper_grads
        return self.weights + grads + self.master + self.moments

    @property
    def cpu_bytes(self) -> float:
        return self.cpu_weights + self.cpu_grads + self.cpu_optimizer


def zero_model_states(
    psi: float,
    strategy: str,
    world_size: int,
    *,
    offload: str = "none",
    width: int = 2,
    state_bytes: float = 8.0,
    largest_module: float = 0.0,
) -> ModelStates:
    """Model states of Ψ trainable parameters per device under DeepSpeed ZeRO (stage 1, 2 or 3).

    With w = 16-bit width (2), K = 4 (fp32 master) + ``state_bytes`` (Adam: 8) and N = ``world_size``:

    ======  ===============  ===============  ==============  =============
    stage   weights          gradients        fp32 gradient   master+moments
    ======  ===============  ===============  ==============  =============
    1       wΨ               wΨ               4Ψ/N            KΨ/N
    2       wΨ               wΨ/N             4Ψ/N            KΨ/N
    3       wΨ/N + wL        wΨ/N + wL        (4 - w)Ψ/N      KΨ/N
    ======  ===============  ===============  ==============  =============

    L = ``largest_module``, gathered whole (weights and gradients) for its forward and backward.
    The paper's totals are these rows without the fp32 column and the gathered module: 4Ψ + 12Ψ/N,
    2Ψ + 14Ψ/N, 16Ψ/N. The fp32 column is DeepSpeed's: ZeRO-1/2 copy the owned gradient partition to
    fp32 for the step (4Ψ/N beside the 16-bit one); ZeRO-3 steps one sub-group at a time and its
    estimator counts the gradient partition once, at fp32 width ((4 - w)Ψ/N more than the paper).

    Training in fp32 (w = 4), measured on DeepSpeed 0.19 by summing each rank's tensors:

    * the fp32 gradient is still a copy, 4Ψ/N at every stage: the step flattens the reduced partition
      into a new tensor (``flatten(averaged_gradients)``; ``.to(fp32)`` of it is then a no-op) while the
      partition buffer it reads from is alive - ZeRO-3 keeps that buffer for the whole run;
    * ZeRO-1 keeps only the owned gradient partition, like ZeRO-2: with ``contiguous_gradients`` (on by
      default) every bucket's reduced slice is copied into the partition buffer and ``p.grad`` freed.
      The full gradients exist only inside the reduce bucket, which ``overhead_bytes`` counts;
    * the fp32 master is a separate copy at every stage, even where the weights are fp32 already.

    Per rank, ZeRO-1/2 in fp32 vary around the 4Ψ/N + 4Ψ/N of gradients: the partition buffer holds
    the whole gradient of each parameter that straddles the rank's partition boundary, and a partition
    inside a single parameter is stepped on as a view, without the copy. With hundreds of tensors that
    is a few percent; the tiny model over 4 ranks (embeddings and lm_head a quarter of it each): ±11%.

    So in fp32 every stage holds 4Ψ weights (4Ψ/N at stage 3) + 4Ψ/N + 4Ψ/N gradients + 4Ψ/N master +
    ``state_bytes``·Ψ/N; ``paper_grads`` keeps the paper's ZeRO-1 count. At 16-bit widths the table
    stands as it is: DeepSpeed's estimator's for stages 2 and 3, which tests pin; the paper's for stage 1.

    Offloading the optimizer moves master, moments and the fp32 gradient partition to the host; from
    stage 2 on the 16-bit gradient partition leaves the device too (ZeRO-Offload copies each reduced
    partition straight into the host's fp32 one). Offloading parameters (ZeRO-3) moves the 16-bit weight
    partition as well. This is exactly what DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and
    ``estimate_zero3_model_states_mem_needs`` count (with ``additional_buffer_factor=1``).
    """
    stage = ZERO_STAGES[strategy]
    n = world_size
    fp32 = width == 4
    # The step's fp32 gradient partition is a new tensor (a flattened copy) even in fp32, where it was
    # measured; at 16 bits ZeRO-3 follows DeepSpeed's estimator, which counts the partition once at fp32.
    fp32_grad_extra = (4 - width) * psi / n if stage == 3 and not fp32 else 4 * psi / n
    weights = width * psi / n if stage == 3 else width * psi
    paper_grads = width * psi / n if stage >= 2 else width * psi
    # Measured in fp32: DeepSpeed's ZeRO-1 keeps only the owned partition of the reduced gradients.
    grads = width * psi / n if fp32 else paper_grads
    master, moments = 4 * psi / n, state_bytes * psi / n
    gathered = width * largest_module if stage == 3 else 0.0
    ms = ModelStates(
        weights, grads, fp32_grad_extra, master, moments, gathered, gathered,
        paper_grads=paper_grads if paper_grads != grads else None,
    )  # fmt: skip
    if offload == "none":
        return ms
    on_host_grads = width * psi / n if stage >= 2 else 0.0  # stage 1 keeps its full 16-bit gradients
    ms = ModelStates(
        weights=weights,
        grads=grads - on_host_grads,
        fp32_grad_extra=0.0,
        master=0.0,
        moments=0.0,
        gathered_weights=gathered,
        gathered_grads=gathered,
        cpu_grads=4 * psi / n,  # the fp32 gradient partition the CPU optimizer steps on
        cpu_optimizer=master + moments,
    )
    if offload in ("optimizer+params", "nvme"):  # nvme: the same partitions, swapped on to disk
        ms = ModelStates(**{**asdict(ms), "weights": 0.0, "cpu_weights": weights})
    return ms


# ===================================================================================== activations


def activation_bytes(
    pc: ParamCounts,
    micro_batch: int,
    seq_len: int,
    width: int,
    checkpointing: bool,
    *,
    trained: Iterable[str] | None = None,
    quantized: bool = False,
    head: str = "full",
    liger: bool = False,
) -> float:
    """Activation memory of one micro-batch at the end of the forward pass (its peak).

    Method of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
    §4: count what autograd keeps for backward. Their GPT layer keeps s·b·h·(34 + 5·a·s/h) bytes; for the
    Llama-style layer here (RMSNorm, rotary, GQA, gated MLP, a fused SDPA/flash kernel that keeps no s×s
    score matrix, no dropout) the kept tensors per token are, with w = the compute width (2, or 4 in
    fp32), a = the width of the layer's own tensors (w; 4 under QLoRA, below), q = heads·head_dim,
    kv = kv_heads·head_dim, i = intermediate_size:

        per layer   A = 2·(4h + a·h)      two RMSNorms: HF computes them in fp32, keeping input and output
                      + (a + w)·(q + 2kv) q, k, v as projected / as the attention kernel keeps them
                      + w·q (+ w·q)       attention output (+ its head-merged copy, o_proj's input, kept
                                          only when o_proj's weight trains)
                      + 3·a·i (+ a·i)     gate, up, SiLU(gate) (+ their product, down_proj's input, kept
                                          only when down_proj's weight trains)

    ``trained``: the linear modules whose weights train (LoRA's targets); None: all (a full fine-tune).
    A frozen linear needs only its weight for the input's gradient, so its input is not kept for it.
    ``quantized`` (QLoRA): peft's prepare_model_for_kbit_training upcasts the norms and embeddings to
    fp32 and bitsandbytes' linears return their input's dtype, so the residual stream, the norms' outputs
    and every projection's output are fp32 (a = 4); only what the attention kernel keeps stays in w.
    ``liger`` (use_liger_kernel): Liger's RMSNorm keeps its input and a per-row scale, not an fp32 copy
    (each norm 2·a·h instead of 4h + a·h), and its SwiGLU recomputes SiLU(gate) in backward (the MLP's
    3·a·i become 2·a·i).
    Measured on an H200 (bench/results/gpu.md, 1B Llama, 2048 tokens, LoRA on q/v): LoRA 36.6·h bytes a
    layer and token against 35.5·h here, with Liger 26.3·h against 26·h, QLoRA 53.6·h against 58.5·h.

    The loss (``head``): "full" builds the logits, V·(8 + w) a token: lm_head output (w) + its fp32
    upcast (4) + fp32 log-softmax kept for backward (4); in fp32 the upcast is a no-op: 8V. "fused":
    TRL's fused LM head (SFT's path for big batches, contract/objectives.sft_full_logits) never builds
    them: a copy of the scored hidden states (w·h a token) and one float32 tile of logits and of their
    gradient (FUSED_HEAD_TILE_TOKENS x FUSED_HEAD_TILE_VOCAB at most).

    Without gradient checkpointing: s·b·(L·A + logits + (4 + a)·h)  (the last term: final norm).
    With it (HF checkpoints every decoder layer): each layer keeps only its input (a·h) and one layer at a
    time is recomputed in backward: s·b·(L·a·h + A + logits + (4 + a)·h).
    s is the padded sequence length (TRL's ``max_length`` is the worst case), b the micro-batch.
    Small tensors are left out (rotary tables, attention log-sum-exp, LoRA's r-wide intermediates).
    """
    h, i, v = pc.hidden, pc.linear("gate_proj").out_features, pc.vocab
    q, kv = pc.linear("q_proj").out_features, pc.linear("k_proj").out_features
    w = width
    a = 4 if quantized else w
    names = None if trained is None else set(trained)
    o_kept = names is None or "o_proj" in names
    down_kept = names is None or "down_proj" in names
    per_layer = (
        2 * (2 * a * h if liger else 4 * h + a * h)
        + (a + w) * (q + 2 * kv)
        + w * q * (2 if o_kept else 1)
        + a * i * (2 if liger else 3)
        + (a * i if down_kept else 0)
    )
    tokens = micro_batch * seq_len
    if head == "fused":
        logits_per_token = w * h
        tile = 2 * 4 * min(tokens, FUSED_HEAD_TILE_TOKENS) * min(v, FUSED_HEAD_TILE_VOCAB)
    else:
        logits_per_token, tile = v * (8 + (w if w < 4 else 0)), 0
    final_norm = (4 + a) * h
    layers = pc.layers * a * h + per_layer if checkpointing else pc.layers * per_layer
    return float(tokens * (layers + logits_per_token + final_norm) + tile)
