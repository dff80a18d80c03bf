"""What an estimate starts from outside the estimator: the model's ``config.json`` (a local folder, a
GGUF file's header, or the Hub), the training shape a comparison holds fixed, and the advice an
estimate gives."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract.ggufcache import is_gguf
from nbtrain.control.config.choices import ZERO_STAGES
from nbtrain.control.memory.costs import PARTS
from nbtrain.control.memory.estimator import Estimate, gib

# ================================================================================== model facts


def load_model_config(
    model: str | Path, revision: str | None = None, gguf_file: str | None = None
) -> dict[str, Any] | None:
    """``config.json`` of a local model directory, or of a Hub id (at ``revision``): fetched into the HF
    cache, or read from it offline (nbtrain.control.models.hub).

    None when it cannot be had (the Hub unreachable and nothing cached, or the repo cannot be read: the
    estimate is then skipped; ``prepare`` reports why, from ``hub.model_config``).
    """
    path = Path(model).expanduser()
    if gguf_file is not None and not path.exists():  # a Hub repo's GGUF file: its header, once downloaded
        from nbtrain.control.models import hub

        hit = hub.cached_file(str(model), gguf_file, revision)
        if hit is None:
            return None
        path = Path(hit)
    if path.is_file() and is_gguf(path.name):
        from nbtrain.control.models import gguf  # the header (numpy); nothing dequantised

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
    from nbtrain.control.models import hub  # only for a Hub id: huggingface_hub is not imported otherwise

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
