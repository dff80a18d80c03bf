"""``estimate()``: the per-device memory of a run (model states, activations, overhead; the host RAM
and NVMe that offload uses) for a method, strategy, offload and world size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.objectives import sft_full_logits
from nbtrain.control.config.choices import METHODS, OFFLOADS, STRATEGIES, ZERO_STAGES
from nbtrain.control.memory.costs import (
    CUDA_CONTEXT_BYTES,
    DS_MAX_REUSE_DISTANCE,
    DS_PREFETCH_BUCKET,
    DS_REDUCE_BUCKET,
    FRAGMENTATION,
    KNOWN_MODEL_TYPES,
    NCCL_BYTES,
    NVME_OPTIMIZER_BUFFERS,
    NVME_PARAM_BUFFERS,
    NVME_SUB_GROUP,
    PARTS,
    EstimateError,
    GiB,
    MiB,
)
from nbtrain.control.memory.params import (
    ParamCounts,
    count_parameters,
    is_vision_language,
    largest_lora_module,
    lora_parameters,
    resolve_lora_targets,
)
from nbtrain.control.memory.states import (
    ModelStates,
    OptimizerStates,
    activation_bytes,
    dtype_width,
    optimizer_states,
    quantized_weight_bytes,
    zero_model_states,
)

# ========================================================================================= estimate


@dataclass
class Estimate:
    """Peak memory of one device of a run (every rank holds the same), and the host RAM a node needs."""

    parts: dict[str, int]  # part -> bytes per device, keys in PARTS order
    cpu_bytes: int  # host RAM per node: max(model loading, offloaded state)
    cpu_parts: dict[str, int]  # offloaded part -> bytes per node
    details: dict[str, str]  # part -> how it was computed
    inputs: dict[str, Any]
    params: ParamCounts
    trainable_params: int
    model_states: ModelStates | None = None  # set for DeepSpeed ZeRO strategies
    notes: list[str] = field(default_factory=list)
    # ZeRO-3 only: the largest modules gathered whole (weights + gradients), part of the model-state parts,
    # and every parameter ZeRO-3 keeps gathered from forward to backward (see ``resident_param_bytes``).
    gathered_bytes: int = 0
    resident_param_bytes: int = 0
    disk_parts: dict[str, int] = field(default_factory=dict)  # offload: nvme: part -> bytes per node on disk

    @property
    def disk_bytes(self) -> int:
        """Bytes per node in ZeRO-Infinity's swap files (offload: nvme), 0 otherwise."""
        return sum(self.disk_parts.values())

    @property
    def per_device_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def model_state_bytes(self) -> int:
        """Weights, adapters, gradients and optimizer state on the device: what ZeRO partitions."""
        return sum(self.parts[p] for p in ("weights", "adapters", "gradients", "optimizer"))

    @property
    def model_state_bytes_at_step(self) -> int:
        """The model states held as the optimizer steps: ZeRO-3 has released its gathered modules then."""
        return self.model_state_bytes - self.gathered_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_device_bytes": self.per_device_bytes,
            "parts": dict(self.parts),
            "cpu_bytes": self.cpu_bytes,
            "cpu_parts": dict(self.cpu_parts),
            "disk_bytes": self.disk_bytes,
            "disk_parts": dict(self.disk_parts),
            "total_params": self.params.total,
            "vision_params": {"encoder": self.params.vision, "projector": self.params.projector},
            "trainable_params": self.trainable_params,
            "inputs": dict(self.inputs),
            "details": dict(self.details),
            "notes": list(self.notes),
        }

    def explain(self) -> str:
        i = self.inputs
        method = i["method"]
        if method != "full":
            method += f" r={i['lora_r']} on {', '.join(i['lora_targets'])}"
        if i["method"] == "qlora":
            method += f", {i['quant_bits']}-bit base" + (" (double quant)" if i["double_quant"] else "")
        strategy = i["strategy"] + (f" + offload {i['offload']}" if i["offload"] != "none" else "")
        lines = [
            f"{self.params.model_type}: {self.params.total / 1e9:.2f}B parameters, "
            f"{self.trainable_params / 1e6:,.1f}M trainable ({method})",
            f"{i['precision']}, {strategy} on {i['world_size']} {i['device']} device(s), micro-batch "
            f"{i['micro_batch']} x {i['seq_len']} tokens, gradient checkpointing "
            f"{'on' if i['gradient_checkpointing'] else 'off'}, optim {i['optim']}",
            f"per device: {gib(self.per_device_bytes)}",
        ]
        width = max(len(p) for p in PARTS)
        for part in PARTS:
            lines.append(f"  {part:<{width}} {gib(self.parts[part]):>10}  {self.details.get(part, '')}")
        if self.cpu_bytes:
            lines.append(f"host RAM per node: {gib(self.cpu_bytes)}  {self.details.get('cpu', '')}")
        if self.disk_bytes:
            lines.append(f"disk per node: {gib(self.disk_bytes)}  {self.details.get('disk', '')}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def gib(n: float) -> str:
    """Bytes for people: GiB with one decimal, MiB below 1 GiB (a LoRA adapter is a few MiB)."""
    return f"{n / GiB:.1f} GiB" if n >= GiB or n == 0 else f"{n / MiB:.1f} MiB"


def overhead_bytes(
    tensor_bytes: float,
    *,
    device: str,
    world_size: int,
    strategy: str,
    width: int,
    resident_params: float = 0.0,
) -> float:
    """What is not a tensor of the model: fixed costs plus a fragmentation margin.

    * CUDA context, kernel images and library handles: ``CUDA_CONTEXT_BYTES`` (0.75 GiB) per GPU process;
    * NCCL buffers when world size > 1: ``NCCL_BYTES`` (0.5 GiB);
    * DeepSpeed's contiguous gradient bucket: ``reduce_bucket_size`` (5e8 elements, DeepSpeed's default,
      which nbtrain keeps) at the 16-bit width, allocated whole whatever the model size; ZeRO-3 adds its
      parameter prefetch bucket (5e7 elements);
    * ZeRO-3's ``resident_params``: bytes of gathered parameters it keeps beyond the largest module the
      model states already count (see ``resident_gathered_params``);
    * the caching allocator's fragmentation: ``FRAGMENTATION`` (10%) of the tensor bytes.
    """
    fixed = 0.0
    if device == "cuda":
        fixed += CUDA_CONTEXT_BYTES
        if world_size > 1:
            fixed += NCCL_BYTES
    if strategy in ZERO_STAGES:
        fixed += width * DS_REDUCE_BUCKET
        if strategy == "zero3":
            fixed += width * DS_PREFETCH_BUCKET + resident_params
    return fixed + FRAGMENTATION * tensor_bytes


def resident_gathered_params(params: int) -> int:
    """How many of a model's ``params`` ZeRO-3 keeps gathered (whole, on every rank) through training.

    DeepSpeed releases a gathered parameter after its module runs unless it is used again within the
    next ``stage3_max_reuse_distance`` parameters of the module trace (``__params_to_release`` in
    partitioned_param_coordinator.py). A forward parameter with d parameters after it comes back in
    backward about 2d later, so the last 5e8 parameters of the forward stay gathered until backward
    reaches them: all of a model under 5e8 parameters. Measured on the tiny model (every parameter stays
    until the step releases them all); for larger models this is that rule, not a measurement.
    """
    return min(params, DS_MAX_REUSE_DISTANCE // 2)


def _check_combination(method: str, strategy: str, offload: str, world_size: int, nodes: int) -> None:
    for what, value, allowed in (("method", method, METHODS), ("strategy", strategy, STRATEGIES),
                                 ("offload", offload, OFFLOADS)):  # fmt: skip
        if value not in allowed:
            raise EstimateError(f"{what} is {', '.join(allowed[:-1])} or {allowed[-1]}, not {value!r}")
    if offload != "none" and strategy not in ZERO_STAGES:
        raise EstimateError(f"offload needs a DeepSpeed ZeRO strategy (zero1/2/3), not strategy {strategy}")
    if offload in ("optimizer+params", "nvme") and strategy != "zero3":
        raise EstimateError(
            "offloading parameters needs zero3 (ZeRO-1/2 keep every parameter on each device)"
        )
    if method == "qlora" and strategy in ("zero3", "fsdp"):
        raise EstimateError(f"qlora cannot combine with {strategy}: 4-bit weights cannot be partitioned")
    if world_size < 1 or nodes < 1 or world_size % nodes:
        raise EstimateError(f"world_size ({world_size}) must be a positive multiple of nodes ({nodes})")


def _frozen_base(
    pc: ParamCounts, method: str, quant_bits: int, double_quant: bool, w: int, precision: str, upcast: bool
) -> tuple[float, str]:
    """Bytes of the frozen base of a LoRA/QLoRA run on one device (before ZeRO-3/FSDP shards it)."""
    if method == "lora":
        return float(w * pc.total), f"frozen base in {precision}"
    quantized = quantized_weight_bytes(pc, quant_bits, double_quant)
    rest = pc.total - pc.quantized_linears  # embeddings, lm_head, norms, biases
    # prepare_model_for_kbit_training upcasts what is not quantised to fp32; DeepSpeed casts it back.
    rest_width = 4 if upcast else w
    # bitsandbytes dequantises one weight at a time to the compute dtype for each matmul.
    dequantised = w * max(lin.in_features * lin.out_features for lin in pc.linears)
    how = (
        f"{quant_bits}-bit linears ({quantized / pc.quantized_linears:.3f} B/weight with constants) + "
        f"{rest / 1e6:,.0f}M unquantised (embeddings, lm_head, norms) in "
        f"{'fp32' if rest_width == 4 else precision} + one dequantised linear at a time"
    )
    return quantized + rest_width * rest + dequantised, how


@dataclass
class _Layout:
    """The bytes of a run as they are worked out: per device, offloaded per node, and how."""

    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    cpu_parts: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    disk_parts: dict[str, float] = field(default_factory=dict)  # offload: nvme, per node


@dataclass(frozen=True)
class _Trained:
    """What either layout is worked out from: the method, its trainable parameters and the frozen base
    (bytes, and how they are held), the model's counts, the strategy over ``n`` processes, the width
    ``w`` of the compute dtype and the optimizer."""

    method: str
    trainable: int
    base: float
    base_how: str
    pc: ParamCounts
    largest_trainable: int
    strategy: str
    n: int
    w: int
    optim: str


def _deepspeed_layout(
    lay: _Layout, r: _Trained, *, offload: str, per_node: int, state_bytes: float
) -> ModelStates:
    """ZeRO 1/2/3: the trained parameters' states from ``zero_model_states``; the frozen base replicated
    (ZeRO-1/2 shard only optimizer-managed tensors) or partitioned like everything else (ZeRO-3)."""
    st = zero_model_states(
        r.trainable, r.strategy, r.n, offload=offload, width=r.w, state_bytes=state_bytes,
        largest_module=r.largest_trainable,
    )  # fmt: skip
    stage3 = r.strategy == "zero3"
    off = {"none": "", "nvme": " - swapped to disk (nvme_path)"}.get(offload, " - offloaded to the host")
    trained = "weights" if r.method == "full" else "adapters"
    lay.parts[trained] = st.weights + (st.gathered_weights if r.method == "full" else 0.0)
    lay.parts["gradients"] = st.grads + st.fp32_grad_extra + st.gathered_grads
    lay.parts["optimizer"] = st.master + st.moments
    shards = {"zero1": "optimizer state", "zero2": "optimizer state and gradients", "zero3": "everything"}
    lay.details["optimizer"] = (
        f"fp32 master (4 B) + {state_bytes:g} B of {r.optim if offload == 'none' else 'CPU AdamW'} state "
        f"per trainable parameter, /{r.n}: ZeRO shards {shards[r.strategy]}{off}"
    )
    if stage3:
        grads = (
            f"fp32 gradients /{r.n} + their flat copy for the step (4 B/{r.n})"
            if r.w == 4
            else f"gradients /{r.n} at fp32 width (4 B)"
        ) + " + the largest module's, gathered"
    else:
        # DeepSpeed's ZeRO-1 keeps only the owned gradient partition (measured in fp32, see above).
        whole = r.strategy == "zero1" and r.w != 4
        grads = f"{r.w}-byte gradients{'' if whole else f' /{r.n}'} + their fp32 partition (4 B/{r.n})"
    lay.details["gradients"] = grads + off
    gathered = f" + the largest module gathered ({r.pc.largest_module / 1e6:,.0f}M)" if stage3 else ""
    params_off = {
        "optimizer+params": " (partition offloaded to the host)",
        "nvme": " (partition swapped to disk)",
    }.get(offload, "")
    if r.method == "full":
        lay.details["weights"] = f"{r.w}-byte weights (DeepSpeed casts them){f' /{r.n}' if stage3 else ''}"
        lay.details["weights"] += gathered + params_off
    else:
        frozen = r.base / r.n if stage3 else r.base
        if offload in ("optimizer+params", "nvme"):  # offload_param moves every partition, frozen ones too
            lay.cpu_parts["weights"] = frozen * per_node
            frozen = 0.0
        lay.parts["weights"] = frozen + (r.w * r.pc.largest_module if stage3 else 0.0)
        how = f" /{r.n}{gathered}{params_off}" if stage3 else " (replicated)"
        lay.details["weights"] = r.base_how + how
    if offload != "none":
        lay.cpu_parts["optimizer"] = st.cpu_optimizer * per_node
        lay.cpu_parts["gradients"] = st.cpu_grads * per_node
        if st.cpu_weights:
            lay.cpu_parts[trained] = lay.cpu_parts.get(trained, 0.0) + st.cpu_weights * per_node
    if offload == "nvme":
        # ZeRO-Infinity: what offloading would hold in RAM lives in files under nvme_path; RAM holds the
        # pinned buffers the swapping goes through: parameter partitions and fp32 optimizer sub-groups.
        lay.disk_parts = lay.cpu_parts
        sub_group = min(NVME_SUB_GROUP, -(-r.trainable // r.n))
        lay.cpu_parts = {
            "weights": NVME_PARAM_BUFFERS * nvme_param_buffer(r.pc, r.n) * r.w * per_node,
            "optimizer": NVME_OPTIMIZER_BUFFERS * sub_group * 4.0 * per_node,
        }
    return st


def nvme_param_buffer(pc: ParamCounts, world_size: int) -> int:
    """Elements of one ZeRO-Infinity parameter swap buffer: the largest parameter's partition per rank."""
    return -(-pc.largest_module // world_size)


def _torch_layout(lay: _Layout, r: _Trained, *, opt: OptimizerStates) -> None:
    """One process, DDP or FSDP. The trained parameters are fp32 here (full fine-tunes load in fp32,
    peft keeps adapters fp32): they are their own master copy, with fp32 gradients and optimizer states
    in the parameters' dtype. DDP adds a gradient-sized bucket copy; FSDP shards like ZeRO-3."""
    div = r.n if r.strategy == "fsdp" else 1
    trained = "weights" if r.method == "full" else "adapters"
    lay.parts[trained] = 4 * r.trainable / div
    lay.parts["gradients"] = 4 * r.trainable / div
    lay.parts["optimizer"] = opt.per_param * r.trainable / div
    lay.details["gradients"] = "fp32 gradients (4 B per trainable parameter)"
    lay.details["optimizer"] = f"{opt.per_param:g} B of {r.optim} state per trainable parameter"
    if r.strategy == "ddp":
        # DDP's reducer keeps a flat copy of every gradient in its buckets (gradient_as_bucket_view is
        # off in accelerate and the Trainer): a second gradient-sized buffer.
        lay.parts["gradients"] *= 2
        lay.details["gradients"] += " x2: DDP's all-reduce buckets hold a copy"
    if r.strategy == "fsdp":
        lay.parts[trained] += r.w * r.pc.largest_module if r.method == "full" else 0.0
        lay.parts["gradients"] += r.w * r.largest_trainable
        lay.details["optimizer"] += f" /{r.n} (FSDP full shard, estimated like ZeRO-3)"
    if r.method == "full":
        lay.details["weights"] = (
            "fp32 weights (the worker loads full fine-tunes in fp32; autocast does 16-bit)"
        )
    else:
        lay.parts["weights"] = r.base / div + (r.w * r.pc.largest_module if r.strategy == "fsdp" else 0.0)
        lay.details["weights"] = r.base_how + (f" /{r.n}" if r.strategy == "fsdp" else "")


def _host_ram(
    pc: ParamCounts,
    method: str,
    strategy: str,
    per_node: int,
    w: int,
    precision: str,
    offloaded: float,
    held: str = "offloaded state",
) -> tuple[float, str]:
    """Host RAM per node: the larger of loading the model and the offloaded state.

    Loading: without zero.Init every process materialises the whole model on the host before moving it
    (fp32 for a full fine-tune, the compute dtype for LoRA) - DeepSpeed's estimator counts the same
    4Ψ per GPU; ZeRO-3's zero.Init and QLoRA's device_map stream one module at a time (4 B x largest).
    """
    if strategy == "zero3" or method == "qlora":
        load = 4.0 * pc.largest_module * per_node
        load_how = "modules stream to the GPU one at a time as they load"
    else:
        width = 4 if method == "full" else w
        load = float(width * pc.total * per_node)
        load_how = f"{per_node} process(es) each load the model in {'fp32' if width == 4 else precision}"
    if offloaded >= load:
        return offloaded, f"{held} ({gib(offloaded)})"
    return load, f"loading: {load_how}"


def estimate(
    model_config: Mapping[str, Any],
    *,
    method: str = "lora",
    lora_r: int = 8,
    lora_targets: str | Sequence[str] = "auto",
    lora_dora: bool = False,
    quant_bits: int = 4,
    double_quant: bool = True,
    precision: str = "bf16",
    strategy: str = "none",
    offload: str = "none",
    world_size: int = 1,
    nodes: int = 1,
    micro_batch: int = 8,
    seq_len: int = 1024,
    gradient_checkpointing: bool = True,
    optim: str = "adamw_torch_fused",
    device: str = "cuda",
    objective: str = "sft",
    liger: bool = False,
    kbit_upcast: bool = True,
) -> Estimate:
    """Estimate the peak memory per device (and host RAM per node) of one nbtrain run.

    The defaults are TRL's SFTConfig defaults (micro-batch 8, max_length 1024, gradient checkpointing
    on, adamw_torch_fused) and nbtrain's (LoRA r=8 on the model's default targets, NF4 with double
    quantisation). ``objective`` decides the loss's logits (SFT's fused head for big batches; the
    others build them). ``world_size`` counts processes over all ``nodes``; ``device`` "cpu" drops the CUDA
    costs (the parts are then RAM per process), as "mps" (Apple's GPU, sharing the RAM) and "npu" do.
    ``kbit_upcast`` (QLoRA): peft's prepare_model_for_kbit_training, which nbtrain's worker applies, upcasts
    what is not quantised (embeddings, norms, lm_head) to fp32, so the layers' tensors are fp32 too;
    False describes QLoRA runs that keep them in the compute dtype (torchtune's, LitGPT's). DeepSpeed
    casts the weights back (not the layers' tensors).
    Raises ``EstimateError`` for combinations nbtrain rejects.
    """
    _check_combination(method, strategy, offload, world_size, nodes)
    pc = count_parameters(model_config)
    targets = resolve_lora_targets(model_config, lora_targets) if method != "full" else []
    w = 4 if device == "cpu" and precision == "auto" else dtype_width(precision)
    opt = optimizer_states(optim)
    per_node = world_size // nodes
    zero = strategy in ZERO_STAGES
    upcast = kbit_upcast and not zero
    notes: list[str] = []
    if pc.model_type not in KNOWN_MODEL_TYPES:
        notes.append(f"model type {pc.model_type!r} counted as a Llama-style decoder (gated MLP, RMSNorm)")
    if pc.vision_total:
        notes.append(
            f"vision-language: image encoder {pc.vision:,} + projector {pc.projector:,} parameters, held "
            f"beside the language model"
        )
    elif is_vision_language(model_config):
        notes.append(
            f"vision-language ({model_config.get('model_type')}): the image encoder and projector are not "
            f"counted (Qwen2-VL, LLaVA with a CLIP encoder and Idefics3 are, exactly); the estimate is low "
            f"by them"
        )
    if not opt.exact:
        notes.append(f"optim {optim}: counted as AdamW (2 fp32 states per parameter), an upper bound")

    if method == "full":
        trainable, base, base_how = pc.total, 0.0, ""
        largest_trainable = pc.largest_module
    else:
        trainable = lora_parameters(model_config, lora_r, targets, dora=lora_dora)
        base, base_how = _frozen_base(pc, method, quant_bits, double_quant, w, precision, upcast)
        largest_trainable = largest_lora_module(pc, lora_r, targets)

    lay = _Layout()
    trained = _Trained(
        method, trainable, base, base_how, pc, largest_trainable, strategy, world_size, w, optim
    )  # fmt: skip
    states = None
    if zero:
        # With offload nbtrain writes an AdamW section: DeepSpeed's CPU Adam, fp32 moments.
        state_bytes = 8.0 if offload != "none" else opt.per_param
        states = _deepspeed_layout(lay, trained, offload=offload, per_node=per_node, state_bytes=state_bytes)
    else:
        _torch_layout(lay, trained, opt=opt)
    lay.details["adapters"] = "none: a full fine-tune trains the weights themselves"
    if method != "full":
        lay.details["adapters"] = (
            f"{trainable / 1e6:,.2f}M LoRA parameters (r={lora_r} on {', '.join(targets)}) in "
            + (f"{w}-byte (DeepSpeed casts them)" if zero else "fp32 (peft keeps adapters in fp32)")
        )

    fused = objective == "sft" and not sft_full_logits(micro_batch * seq_len, pc.vocab, device)
    lay.parts["activations"] = activation_bytes(
        pc, micro_batch, seq_len, w, gradient_checkpointing, trained=targets if method != "full" else None,
        quantized=method == "qlora" and kbit_upcast, head="fused" if fused else "full", liger=liger,
    )  # fmt: skip
    lay.details["activations"] = (
        f"micro-batch {micro_batch} x {seq_len} tokens: "
        + (
            "checkpointed layer inputs + one layer recomputed"
            if gradient_checkpointing
            else "every layer kept"
        )
        + (" (fp32 under QLoRA)" if method == "qlora" else "")
        + (", Liger's RMSNorm and SwiGLU" if liger else "")
        + (
            " + TRL's fused LM head (no logits built)"
            if fused
            else f" + logits over {pc.vocab:,} tokens in fp32 for the loss"
        )
    )
    resident = gathered = 0.0
    if strategy == "zero3" and states is not None:
        # Every parameter (a LoRA run's frozen base too) is partitioned and gathered by ZeRO-3; the model
        # states hold the largest base module and the largest trained one gathered already.
        resident = w * resident_gathered_params(pc.total + (trainable if method != "full" else 0))
        gathered = w * pc.largest_module + states.gathered_grads
    tensors = sum(lay.parts.values())
    lay.parts["overhead"] = overhead_bytes(
        tensors, device=device, world_size=world_size, strategy=strategy, width=w,
        resident_params=max(0.0, resident - w * pc.largest_module),
    )  # fmt: skip
    lay.details["overhead"] = (
        ("CUDA context" if device == "cuda" else "no CUDA context")
        + (" + NCCL buffers" if device == "cuda" and world_size > 1 else "")
        + (" + DeepSpeed gradient bucket" if zero else "")
        + (" + ZeRO-3 gathered parameters kept from forward to backward" if resident else "")
        + f" + {FRAGMENTATION:.0%} allocator fragmentation"
    )
    cpu, lay.details["cpu"] = _host_ram(
        pc, method, strategy, per_node, w, precision, sum(lay.cpu_parts.values()),
        held="pinned NVMe swap buffers" if offload == "nvme" else "offloaded state",
    )  # fmt: skip
    if lay.disk_parts:
        lay.details["disk"] = (
            "offloaded parameters, fp32 gradients and optimizer state, in files under nvme_path"
        )
    if device == "cpu":
        notes.append("CPU run: the per-device parts are RAM per process")
    elif device == "mps":
        notes.append("Apple MPS run: the GPU shares the machine's RAM, so the per-device parts are RAM")
    elif device == "npu":
        notes.append("Ascend NPU run: CANN's runtime memory is not counted (never measured by nbtrain)")
    inputs = {
        "method": method, "lora_r": lora_r, "lora_targets": targets, "quant_bits": quant_bits,
        "double_quant": double_quant, "precision": precision, "strategy": strategy, "offload": offload,
        "world_size": world_size, "nodes": nodes, "micro_batch": micro_batch, "seq_len": seq_len,
        "gradient_checkpointing": gradient_checkpointing, "optim": optim, "device": device,
        "objective": objective, "liger": liger, "kbit_upcast": kbit_upcast,
    }  # fmt: skip
    return Estimate(
        parts={k: round(v) for k, v in lay.parts.items()},
        cpu_bytes=round(cpu),
        cpu_parts={k: round(v) for k, v in lay.cpu_parts.items()},
        disk_parts={k: round(v) for k, v in lay.disk_parts.items()},
        details=lay.details,
        inputs=inputs,
        params=pc,
        trainable_params=trainable,
        model_states=states,
        notes=notes,
        gathered_bytes=round(gathered),
        resident_param_bytes=round(resident),
    )
