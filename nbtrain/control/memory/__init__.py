"""Will it fit? Per-device memory of a fine-tuning run, estimated from the model's ``config.json`` alone.

Kernel-safe: no torch, transformers or bitsandbytes import. Everything is computed from the architecture's
hyperparameters (the parameter count is exact for Llama-style decoders) and from what nbtrain's worker
actually does (``nbtrain/worker/recipes/sft.py``):

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

The package, by job: ``costs`` (units and fixed costs), ``params`` (parameter counts from config.json),
``states`` (bytes per parameter: optimizer and ZeRO model states, activations), ``estimator`` (the
per-device total) and ``request`` (the model's config, a comparison's shape, advice).
"""

from __future__ import annotations

from nbtrain.control.memory.costs import (
    CUDA_CONTEXT_BYTES,
    DS_REDUCE_BUCKET,
    FRAGMENTATION,
    NCCL_BYTES,
    NVME_OPTIMIZER_BUFFERS,
    NVME_PARAM_BUFFERS,
    NVME_SUB_GROUP,
    PARTS,
    EstimateError,
    GiB,
    MiB,
)
from nbtrain.control.memory.estimator import (
    Estimate,
    estimate,
    gib,
    nvme_param_buffer,
)
from nbtrain.control.memory.params import (
    count_parameters,
    count_vision_parameters,
    is_vision_language,
    lora_parameters,
    resolve_lora_targets,
    tokens_per_image,
)
from nbtrain.control.memory.request import (
    Request,
    advice,
    load_model_config,
)
from nbtrain.control.memory.states import (
    activation_bytes,
    quantized_weight_bytes,
    zero_model_states,
)

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "DS_REDUCE_BUCKET",
    "FRAGMENTATION",
    "NCCL_BYTES",
    "NVME_OPTIMIZER_BUFFERS",
    "NVME_PARAM_BUFFERS",
    "NVME_SUB_GROUP",
    "PARTS",
    "Estimate",
    "EstimateError",
    "GiB",
    "MiB",
    "Request",
    "activation_bytes",
    "advice",
    "count_parameters",
    "count_vision_parameters",
    "estimate",
    "gib",
    "is_vision_language",
    "load_model_config",
    "lora_parameters",
    "nvme_param_buffer",
    "quantized_weight_bytes",
    "resolve_lora_targets",
    "tokens_per_image",
    "zero_model_states",
]
