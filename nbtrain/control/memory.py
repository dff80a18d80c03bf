"""Will it fit? Per-device memory of a fine-tuning run, estimated from the model's ``config.json`` alone.

Kernel-safe: no torch, transformers or bitsandbytes import. Everything is computed from the architecture's
hyperparameters (the parameter count is exact for Llama-style decoders) and from what nbtrain's worker
actually does (``nbtrain/worker/sft.py``):

* full fine-tune: weights load in fp32 and autocast does the 16-bit math, so without DeepSpeed the
  parameters themselves are the fp32 "master" copy;
* LoRA: the frozen base loads in the compute dtype; peft keeps the adapters in fp32;
* QLoRA: bitsandbytes quantises the decoder's linear layers (not the embeddings, not ``lm_head``), then
  ``prepare_model_for_kbit_training`` upcasts every unquantised parameter to fp32;
* DeepSpeed casts all parameters to the 16-bit dtype and keeps fp32 master weights in the optimizer.

Model states under ZeRO follow Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (2020), §5, for mixed-precision Adam with Ψ trainable parameters on N devices:
DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/N, ZeRO-2 2Ψ + 14Ψ/N, ZeRO-3 16Ψ/N (2Ψ 16-bit weights, 2Ψ 16-bit gradients,
12Ψ fp32 master + two moments). DeepSpeed's implementation also materialises the fp32 gradient of the
owned partition (4Ψ/N) for the optimizer step; it is counted (as DeepSpeed's own estimator does) and
kept apart in ``ModelStates`` so both accountings stay visible.

In fp32 (every CPU run) the model states are checked against what each rank really allocates:
tests/worker/test_memory_measured.py sums the tensors of real 2-rank runs under DDP and ZeRO-1/2/3 and
holds this module to 5%. That is where the fp32 rules of ``zero_model_states`` and ZeRO-3's resident
gathered parameters (``resident_gathered_params``) come from; the 16-bit rules stay those of the paper
and of DeepSpeed's own estimator.

All sizes are bytes. ``estimate()`` is the entry point. This module is a pure estimator: model facts
and a training shape in, bytes out. It knows nothing of run configs, plans or hardware: the planner
(nbtrain.control.plan) turns a config and a plan into these arguments and decides what fits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.gguf import is_gguf
from nbtrain.contract.objectives import FUSED_HEAD_TILE_TOKENS, FUSED_HEAD_TILE_VOCAB, sft_full_logits
from nbtrain.control.config.choices import METHODS, OFFLOADS, STRATEGIES, ZERO_STAGES

GiB = 2**30
MiB = 2**20

PARTS = ("weights", "adapters", "gradients", "optimizer", "activations", "overhead")

# peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the architectures counted here.
LORA_AUTO_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
}
KNOWN_MODEL_TYPES = tuple(LORA_AUTO_TARGETS)

# --- fixed costs (documented guesses, see ``overhead_bytes``) -------------------------------------
CUDA_CONTEXT_BYTES = 768 * MiB  # CUDA context + kernel images + cuBLAS/cuDNN handles: 0.5-1 GiB measured
NCCL_BYTES = 512 * MiB  # NCCL communicator buffers, only when world size > 1
FRAGMENTATION = 0.10  # caching-allocator reserve beyond live tensors during training: 5-15%
DS_REDUCE_BUCKET = 500_000_000  # DeepSpeed's default reduce_bucket_size (elements); nbtrain does not set it
DS_PREFETCH_BUCKET = 50_000_000  # DeepSpeed's default stage3_prefetch_bucket_size (elements)
DS_MAX_REUSE_DISTANCE = 1_000_000_000  # DeepSpeed's default stage3_max_reuse_distance (elements)
# offload: nvme (ZeRO-Infinity): the pinned RAM buffers its swapping goes through. DeepSpeed's defaults for
# the buffer counts; nbtrain writes the parameter buffer's size (the largest partition) and a sub-group size
# of 1e8 (DeepSpeed's 1e9 would make each optimizer buffer up to 4 GB: it holds a whole fp32 sub-group).
NVME_PARAM_BUFFERS = 5  # offload_param.buffer_count
NVME_OPTIMIZER_BUFFERS = 4  # offload_optimizer.buffer_count
NVME_SUB_GROUP = 100_000_000  # zero_optimization.sub_group_size nbtrain writes with offload: nvme

# Quantisation constants (bitsandbytes defaults, as transformers' BitsAndBytesConfig uses them).
NF4_BLOCK = 64  # weights per absmax in 4-bit
DOUBLE_QUANT_BLOCK = 256  # absmax values per second-level constant with double quantisation
OPTIM_8BIT_BLOCK = 256  # elements per absmax in bitsandbytes' blockwise 8-bit optimizer states


class EstimateError(NbtrainError, ValueError):
    """The estimate cannot be made: an unsupported combination, or a config it cannot read."""


# ================================================================================== parameter counts


@dataclass(frozen=True)
class Linear:
    """One linear module of a decoder layer: ``in_features`` -> ``out_features`` (+ bias)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a decoder-only transformer by where they live. ``linears`` are those of ONE layer."""

    model_type: str
    layers: int
    hidden: int
    vocab: int
    embeddings: int
    attention: int  # all layers: q/k/v/o weights and biases
    mlp: int  # all layers: gate/up/down
    norms: int  # all RMSNorm weights (per layer, qk-norms, final)
    lm_head: int  # 0 when tied to the embeddings
    linears: tuple[Linear, ...]
    vision: int = 0  # a vision-language model's image encoder (count_vision_parameters)
    projector: int = 0  # and what maps its features into the language model

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.lm_head + self.vision_total

    @property
    def vision_total(self) -> int:
        return self.vision + self.projector

    @property
    def quantized_linears(self) -> int:
        """Weights bitsandbytes quantises: every decoder-layer linear (biases, embeddings, lm_head stay)."""
        return self.layers * sum(lin.in_features * lin.out_features for lin in self.linears)

    @property
    def largest_module(self) -> int:
        """DeepSpeed's ``largest_layer_params``: the biggest single module (ZeRO-3 gathers it whole)."""
        return max(self.embeddings, self.lm_head, *(lin.params for lin in self.linears))

    def linear(self, name: str) -> Linear:
        for lin in self.linears:
            if lin.name == name:
                return lin
        raise KeyError(name)


def _text_config(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
    # Multimodal checkpoints nest the language model's hyperparameters under text_config.
    if "hidden_size" not in model_config and isinstance(model_config.get("text_config"), Mapping):
        return model_config["text_config"]
    return model_config


def _need(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise EstimateError(
            f"config.json has no usable {key!r} ({value!r}); the estimator needs the hyperparameters of a "
            f"decoder-only transformer (hidden_size, num_hidden_layers, num_attention_heads, "
            f"intermediate_size, vocab_size)"
        )
    return value


def count_parameters(model_config: Mapping[str, Any]) -> ParamCounts:
    """Count parameters from ``config.json`` alone, for Llama-style decoders (llama, mistral, qwen2, qwen3).

    Per layer, with h = hidden_size, q = num_attention_heads·head_dim, kv = num_key_value_heads·head_dim,
    i = intermediate_size:

    * attention: q_proj h·q, k_proj h·kv, v_proj h·kv, o_proj q·h; biases on q/k/v (Qwen2, always) or on
      q/k/v/o when ``attention_bias`` is true (Llama, Qwen3);
    * gated MLP: gate_proj h·i, up_proj h·i, down_proj i·h (+ biases when ``mlp_bias``);
    * RMSNorm: 2h (input and post-attention), + 2·head_dim for Qwen3's q/k norms.

    Plus embeddings V·h, a final norm h, and lm_head V·h unless ``tie_word_embeddings``.
    """
    cfg = _text_config(model_config)
    model_type = str(cfg.get("model_type", "llama"))
    h = _need(cfg, "hidden_size")
    n_layers = _need(cfg, "num_hidden_layers")
    heads = _need(cfg, "num_attention_heads")
    inter = _need(cfg, "intermediate_size")
    vocab = _need(cfg, "vocab_size")
    kv_heads = cfg.get("num_key_value_heads") or heads  # absent or null means multi-head attention
    head_dim = cfg.get("head_dim") or h // heads  # Mistral-style configs may carry head_dim: null
    q, kv = heads * head_dim, kv_heads * head_dim

    qwen2 = model_type in _QWEN2_TEXT
    qkv_bias = qwen2 or bool(cfg.get("attention_bias", False))
    o_bias = not qwen2 and bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    linears = (
        Linear("q_proj", h, q, qkv_bias),
        Linear("k_proj", h, kv, qkv_bias),
        Linear("v_proj", h, kv, qkv_bias),
        Linear("o_proj", q, h, o_bias),
        Linear("gate_proj", h, inter, mlp_bias),
        Linear("up_proj", h, inter, mlp_bias),
        Linear("down_proj", inter, h, mlp_bias),
    )
    attention = sum(lin.params for lin in linears[:4])
    mlp = sum(lin.params for lin in linears[4:])
    norms = 2 * h + (2 * head_dim if model_type == "qwen3" else 0)
    # a multimodal checkpoint says whether its embeddings are tied at the top level
    tied = bool(cfg.get("tie_word_embeddings", model_config.get("tie_word_embeddings", False)))
    vision, projector = count_vision_parameters(model_config) or (0, 0)
    return ParamCounts(
        model_type=model_type,
        layers=n_layers,
        hidden=h,
        vocab=vocab,
        embeddings=vocab * h,
        attention=n_layers * attention,
        mlp=n_layers * mlp,
        norms=n_layers * norms + h,
        lm_head=0 if tied else vocab * h,
        linears=linears,
        vision=vision,
        projector=projector,
    )


# Text models whose attention has biases on q/k/v only (a Qwen2-VL's language model is a Qwen2).
_QWEN2_TEXT = ("qwen2", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text")
# transformers' defaults of the vision configs counted here (config.json leaves a default out).
_QWEN2_VL_VISION = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4, "in_channels": 3,
                    "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
_SIGLIP_VISION = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                  "image_size": 224, "patch_size": 32}  # fmt: skip
_CLIP_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                "image_size": 224, "patch_size": 32}  # fmt: skip


def is_vision_language(model_config: Mapping[str, Any]) -> bool:
    """Whether ``config.json`` is an image-text-to-text model's: it nests a vision encoder's config."""
    return isinstance(model_config.get("vision_config"), Mapping)


def tokens_per_image(model_config: Mapping[str, Any], model_dir: str | Path | None = None) -> int | None:
    """How many tokens one image becomes in the language model's sequence, at most: from the image
    processor's settings saved beside a local model (Qwen2-VL's max_pixels) or the model's config (a
    CLIP encoder's patches, or the count some configs state); None when neither says."""
    mtype = model_config.get("model_type")
    vc = model_config.get("vision_config")
    pre: dict[str, Any] = {}
    if model_dir is not None:  # the image processor's settings, and the processor's (image_seq_len)
        for name in ("processor_config.json", "preprocessor_config.json"):
            try:
                data = json.loads((Path(model_dir) / name).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                inner = data.get("image_processor")
                pre = {**pre, **data, **(inner if isinstance(inner, dict) else {})}
    if mtype == "qwen2_vl" and isinstance(vc, Mapping):
        v = {**_QWEN2_VL_VISION, **vc}
        size: dict[str, Any] = pre["size"] if isinstance(pre.get("size"), dict) else {}
        most = pre.get("max_pixels") or size.get("longest_edge") or 12_845_056  # Qwen2-VL's default
        return max(1, int(most) // (int(v["patch_size"]) * int(v["spatial_merge_size"])) ** 2)
    if mtype == "llava" and isinstance(vc, Mapping):
        v = {**_CLIP_VISION, **vc}
        patches = (int(v["image_size"]) // int(v["patch_size"])) ** 2
        return patches + (1 if model_config.get("vision_feature_select_strategy") == "full" else 0)
    for key in ("mm_tokens_per_image", "image_seq_len", "image_seq_length"):
        value = model_config.get(key, pre.get(key))
        if isinstance(value, int) and value > 0:
            return value
    if mtype == "idefics3" and isinstance(vc, Mapping):  # patches, merged scale_factor^2 at a time
        v = {**_SIGLIP_VISION, **vc}
        patches = (int(v["image_size"]) // int(v["patch_size"])) ** 2
        return max(1, patches // int(model_config.get("scale_factor", 2)) ** 2)
    return None


def count_vision_parameters(model_config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(vision encoder, projector) parameters of a vision-language model from its config alone, for the
    families counted exactly (Qwen2-VL; LLaVA with a CLIP encoder; Idefics3 / SmolVLM); None for a text
    model or another family (the estimate then says it left the vision part out)."""
    if not is_vision_language(model_config):
        return None
    mtype = model_config.get("model_type")
    vc = model_config["vision_config"]
    if mtype == "qwen2_vl":
        v = {**_QWEN2_VL_VISION, **vc}
        e, depth, m = int(v["embed_dim"]), int(v["depth"]), int(v["spatial_merge_size"])
        hidden = int(e * v["mlp_ratio"])
        patch = int(v["in_channels"]) * int(v["temporal_patch_size"]) * int(v["patch_size"]) ** 2 * e
        # per block: two LayerNorms, qkv and proj (with biases), fc1 and fc2 (with biases)
        block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + (e * hidden + hidden) + (hidden * e + e)
        merged, out = e * m * m, int(v["hidden_size"])
        merger = 2 * e + (merged * merged + merged) + (merged * out + out)
        return patch + depth * block, merger
    if mtype == "llava" and vc.get("model_type", "clip_vision_model") == "clip_vision_model":
        v = {**_CLIP_VISION, **vc}
        e, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
        positions = (int(v["image_size"]) // int(v["patch_size"])) ** 2 + 1
        embeddings = e + int(v["num_channels"]) * int(v["patch_size"]) ** 2 * e + positions * e
        layer = 4 * (e * e + e) + 4 * e + (e * inter + inter) + (inter * e + e)
        encoder = embeddings + 2 * e + layers * layer + 2 * e  # pre- and post-LayerNorm
        text_hidden = int(_text_config(model_config)["hidden_size"])
        feature_layers = model_config.get("vision_feature_layer", -2)
        n_features = len(feature_layers) if isinstance(feature_layers, list) else 1
        bias = bool(model_config.get("multimodal_projector_bias", True))
        projector = (e * n_features * text_hidden + text_hidden * bias) + (
            text_hidden**2 + text_hidden * bias
        )
        return encoder, projector
    if mtype == "idefics3":  # SigLIP-style: patch conv with bias, no class token, biases everywhere
        v = {**_SIGLIP_VISION, **vc}
        e, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
        patch, size = int(v["patch_size"]), int(v["image_size"])
        embeddings = int(v["num_channels"]) * patch * patch * e + e + (size // patch) ** 2 * e
        layer = 4 * (e * e + e) + 4 * e + (e * inter + inter) + (inter * e + e)
        encoder = embeddings + layers * layer + 2 * e  # post-LayerNorm
        text_hidden = int(_text_config(model_config)["hidden_size"])
        scale = int(model_config.get("scale_factor", 2))
        return encoder, e * scale * scale * text_hidden  # the connector's one linear, no bias
    return None


def resolve_lora_targets(
    model_config: Mapping[str, Any], target_modules: str | Sequence[str] = "auto"
) -> list[str]:
    """The module names LoRA wraps: "auto" (peft's default per model type), "all-linear", or a list.

    "all-linear" is peft's: every linear layer except the output layer (lm_head).
    """
    pc = count_parameters(model_config)
    known = [lin.name for lin in pc.linears]
    if target_modules == "auto":
        return list(LORA_AUTO_TARGETS.get(pc.model_type, ("q_proj", "v_proj")))
    if target_modules == "all-linear":
        return known
    if isinstance(target_modules, str):
        raise EstimateError(
            f"target_modules is 'auto', 'all-linear' or a list of names, not {target_modules!r}"
        )
    # peft matches a name against the end of the module path, so "self_attn.q_proj" means q_proj.
    names = [t.rsplit(".", 1)[-1] for t in target_modules]
    unknown = [t for t in names if t not in (*known, "lm_head", "embed_tokens")]
    if unknown:
        raise EstimateError(
            f"LoRA target(s) {', '.join(unknown)} are not modules of a {pc.model_type} model; "
            f"choose from {', '.join([*known, 'lm_head', 'embed_tokens'])}"
        )
    return list(dict.fromkeys(names))


def lora_parameters(
    model_config: Mapping[str, Any], r: int, target_modules: str | Sequence[str] = "auto", dora: bool = False
) -> int:
    """Parameters LoRA adds: r·(in + out) per wrapped linear (A is r×in, B is out×r), in every layer.

    An embedding target adds r·(V + h) (peft's lora_embedding_A/B); bias="none" adds no bias. DoRA adds a
    magnitude vector per wrapped linear, one value per output feature.
    """
    pc = count_parameters(model_config)
    total = 0
    for name in resolve_lora_targets(model_config, target_modules):
        if name in ("lm_head", "embed_tokens"):
            total += r * (pc.vocab + pc.hidden)
        else:
            lin = pc.linear(name)
            total += pc.layers * (
                r * (lin.in_features + lin.out_features) + (lin.out_features if dora else 0)
            )
    return total


def _largest_lora_module(pc: ParamCounts, r: int, targets: Iterable[str]) -> int:
    sizes = [
        r * (pc.vocab + pc.hidden)
        if t in ("lm_head", "embed_tokens")
        else r * (pc.linear(t).in_features + pc.linear(t).out_features)
        for t in targets
    ]
    return max(sizes, default=0)


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


def _width(precision: str) -> int:
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
    pc: ParamCounts, method: str, quant_bits: int, double_quant: bool, w: int, precision: str, zero: bool
) -> tuple[float, str]:
    """Bytes of the frozen base of a LoRA/QLoRA run on one device (before ZeRO-3/FSDP shards it)."""
    if method == "lora":
        return float(w * pc.total), f"frozen base in {precision}"
    quantized = quantized_weight_bytes(pc, quant_bits, double_quant)
    rest = pc.total - pc.quantized_linears  # embeddings, lm_head, norms, biases
    # prepare_model_for_kbit_training upcasts what is not quantised to fp32; DeepSpeed casts it back.
    rest_width = w if zero else 4
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
) -> Estimate:
    """Estimate the peak memory per device (and host RAM per node) of one nbtrain run.

    The defaults are TRL's SFTConfig defaults (micro-batch 8, max_length 1024, gradient checkpointing
    on, adamw_torch_fused) and nbtrain's (LoRA r=8 on the model's default targets, NF4 with double
    quantisation). ``objective`` decides the loss's logits (SFT's fused head for big batches; the
    others build them). ``world_size`` counts processes over all ``nodes``; ``device`` "cpu" drops the CUDA
    costs (the parts are then RAM per process), as "mps" (Apple's GPU, sharing the RAM) and "npu" do.
    Raises ``EstimateError`` for combinations nbtrain rejects.
    """
    _check_combination(method, strategy, offload, world_size, nodes)
    pc = count_parameters(model_config)
    targets = resolve_lora_targets(model_config, lora_targets) if method != "full" else []
    w = 4 if device == "cpu" and precision == "auto" else _width(precision)
    opt = optimizer_states(optim)
    per_node = world_size // nodes
    zero = strategy in ZERO_STAGES
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
        base, base_how = _frozen_base(pc, method, quant_bits, double_quant, w, precision, zero)
        largest_trainable = _largest_lora_module(pc, lora_r, targets)

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
        quantized=method == "qlora", head="fused" if fused else "full", liger=liger,
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
        "objective": objective, "liger": liger,
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


# ================================================================================== model facts


def load_model_config(
    model: str | Path, revision: str | None = None, gguf_file: str | None = None
) -> dict[str, Any] | None:
    """``config.json`` of a local model directory, or of a Hub id (at ``revision``): fetched into the HF
    cache, or read from it offline (nbtrain.control.hub).

    None when it cannot be had (the Hub unreachable and nothing cached, or the repo cannot be read: the
    estimate is then skipped; ``prepare`` reports why, from ``hub.model_config``).
    """
    path = Path(model).expanduser()
    if gguf_file is not None and not path.exists():  # a Hub repo's GGUF file: its header, once downloaded
        from nbtrain.control import hub

        hit = hub.cached_file(str(model), gguf_file, revision)
        if hit is None:
            return None
        path = Path(hit)
    if path.is_file() and is_gguf(path.name):
        from nbtrain.control import gguf  # the header (numpy); nothing dequantised

        try:
            return dict(gguf.read(path).config)
        except gguf.GgufProblem:
            return None
    if path.exists() or "/" not in str(model):
        try:
            data = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    from nbtrain.control import hub  # only for a Hub id: huggingface_hub is not imported otherwise

    try:
        return hub.model_config(str(model), revision)[0]
    except hub.HubProblem:
        return None


# ====================================================================================== the shape


@dataclass(frozen=True)
class Request:
    """The training shape a comparison holds fixed while method and strategy vary (TRL's defaults)."""

    precision: str = "bf16"
    micro_batch: int = 8
    seq_len: int = 1024
    gradient_checkpointing: bool | None = True  # None: nbtrain's rule (plan/estimates.checkpointing_rule)
    optim: str = "adamw_torch_fused"
    lora_r: int = 8
    lora_targets: str | tuple[str, ...] = "auto"
    lora_dora: bool = False
    quant_bits: int = 4
    double_quant: bool = True
    objective: str = "sft"
    liger: bool = False  # use_liger_kernel: Liger's RMSNorm and SwiGLU keep less (activation_bytes)
    nodes: int = 1

    def estimate_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "nodes"}


def advice(est: Estimate) -> str:
    """The largest part of a run that does not fit, and the setting that shrinks it."""
    biggest = max(PARTS, key=lambda p: est.parts[p])
    i = est.inputs
    if biggest == "activations":
        tip = "lower per_device_train_batch_size or max_length" + (
            "" if i["gradient_checkpointing"] else ", or turn on gradient_checkpointing"
        )
    elif i["device"] in ("mps", "npu"):  # no ZeRO, offload or QLoRA there (plan/accelerators.py)
        tip = "use lora" if i["method"] == "full" else "use a smaller model"
    elif biggest in ("optimizer", "gradients"):
        if i["strategy"] not in ZERO_STAGES:
            tip = "shard it with zero2/zero3 over several GPUs, or offload it to the host"
        elif i["offload"] == "none":
            tip = "offload it to the host (offload: optimizer), or add GPUs"
        else:
            tip = "add GPUs"
    elif biggest == "weights" and i["method"] == "full":
        tip = "use lora or qlora, or zero3 with offload: optimizer+params"
    elif biggest == "weights":
        tip = "use qlora, or zero3 over several GPUs" if i["method"] == "lora" else "use a smaller model"
    else:
        tip = "use a smaller model or more GPUs"
    return f"{biggest} is the largest part ({gib(est.parts[biggest])}): {tip}"
