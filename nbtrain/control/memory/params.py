"""Parameter counts from a model's ``config.json``: the decoder's linear modules, embeddings and vision
tower, the LoRA adapters on the targets peft would pick, and the quantised weights' bytes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.control.memory.costs import LORA_AUTO_TARGETS, EstimateError

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


def largest_lora_module(pc: ParamCounts, r: int, targets: Iterable[str]) -> int:
    sizes = [
        r * (pc.vocab + pc.hidden)
        if t in ("lm_head", "embed_tokens")
        else r * (pc.linear(t).in_features + pc.linear(t).out_features)
        for t in targets
    ]
    return max(sizes, default=0)
