"""The estimator's units, parts and fixed costs: what a run pays whatever its model (the CUDA context, NCCL's
buffers, the allocator's reserve, DeepSpeed's buckets and NVMe buffers, bitsandbytes' block sizes), and
the error an estimate that cannot be made raises."""

from __future__ import annotations

from nbtrain.contract.errors import NbtrainError

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
