"""Loading what a run trained: the base model of resolved.json plus the run's adapter (LoRA / QLoRA) or its
fine-tuned weights (full). The one place that knows how a run's result is laid out; the chat server,
one-shot generation, export and evaluation all load through ``load_tuned``, and a GRPO / RLOO run loads
the reward runs its ``rewards:`` names through ``load_reward_model``.

The weights come from ``output/`` when the run completed, else from its newest checkpoint the worker
marked complete (a stopped or failed run can still be tried out). Runs in a separate process, never in
a kernel: it imports torch, transformers and peft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import RunPaths, latest_complete_checkpoint, read_json
from nbtrain.worker.gguf import use_converted

DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


class NoTrainedWeights(Exception):
    """The run has neither a final output nor a complete checkpoint."""


def trained_weights_dir(run_dir: str | Path) -> Path:
    """``output/`` of a completed run, else the newest complete checkpoint; raises
    NoTrainedWeights (with the fix) when there is neither."""
    paths = RunPaths(Path(run_dir))
    if (paths.output / "adapter_config.json").exists() or (paths.output / "config.json").exists():
        return paths.output
    best = latest_complete_checkpoint(paths)
    if best is None:
        raise NoTrainedWeights(
            f"run {paths.root.name} has no trained weights yet: no output/ and no complete checkpoint "
            f"in {paths.checkpoints}; wait for the run to finish, or ask it for a checkpoint "
            f"(%finetune checkpoint RUN) and try again"
        )
    return best


def torch_dtype(name: str | None, default: Any) -> Any:
    import torch

    if name is None or name == "auto":
        return default
    key = DTYPES.get(str(name).lower())
    if key is None:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(sorted(DTYPES))}")
    return getattr(torch, key)


def load_tuned(
    run_dir: str | Path, *, base: bool = False, dtype: str | None = None, device: str = "cpu"
) -> tuple[Any, Any]:
    """(model, tokenizer) of a run, in eval mode on ``device``.

    ``base=True`` gives the untouched base model. A reward run's model is a sequence classifier with one
    output (nbtrain.worker.model.auto_class). For LoRA/QLoRA runs the model is a ``PeftModel``
    (``model.disable_adapter()`` gives base answers from the same weights). QLoRA bases load quantised
    as in training unless ``dtype`` is given (then unquantised in that dtype, e.g. to merge or export).
    """
    from transformers import AutoTokenizer

    from nbtrain.worker.model import auto_class, compute_dtype, quantization_config

    paths = RunPaths(Path(run_dir).resolve())
    resolved = use_converted(read_json(paths.resolved))
    cfg: dict[str, Any] = resolved["config"]
    plan: dict[str, Any] = resolved.get("plan") or {"precision": "fp32", "device": "cpu"}
    method = cfg["method"]
    trust = bool(cfg.get("trust_remote_code", False))
    on_gpu = device.startswith("cuda")
    weights = None if base else trained_weights_dir(paths.root)

    tok_src = weights if weights is not None and (weights / "tokenizer_config.json").exists() else None
    revision = None if tok_src else cfg.get("revision")  # a Hub base at the run's revision
    tok = AutoTokenizer.from_pretrained(
        str(tok_src or cfg["model"]), trust_remote_code=trust, revision=revision
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    kwargs: dict[str, Any] = {"trust_remote_code": trust}
    # The model's own weights: the run's full fine-tune, or the base a LoRA adapter goes on.
    source = str(weights) if method == "full" and weights is not None else cfg["model"]
    if source == cfg["model"]:
        kwargs["revision"] = cfg.get("revision")
    quantised = method == "qlora" and dtype is None
    if quantised:
        kwargs["quantization_config"] = quantization_config(cfg, plan)  # as in training
        kwargs["dtype"] = compute_dtype(plan)  # fp32 on CPU
        kwargs["device_map"] = {"": device}
    else:
        import torch

        default = compute_dtype(plan) if on_gpu else torch.float32
        kwargs["dtype"] = torch_dtype(dtype, default)
    auto, head = auto_class(cfg)  # a reward run's: a sequence classifier (its score head from the weights)
    model: Any = auto.from_pretrained(source, **kwargs, **head)
    if not quantised:
        model = model.to(device)
    if weights is not None and method in ("lora", "qlora"):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(weights), is_trainable=False)
    generation = getattr(model, "generation_config", None)  # a reward model generates nothing
    if generation is not None and getattr(generation, "pad_token_id", None) is None:
        generation.pad_token_id = tok.pad_token_id
    model.eval()
    return model, tok


def load_reward_model(source: str) -> tuple[Any, Any]:
    """(model, tokenizer) of a reward model in ``rewards:`` (nbtrain.contract.rewards.RewardModel): an
    objective: reward run (a LoRA one merged into its base: TRL scores with a plain sequence classifier),
    or a model folder or Hub id loaded as a sequence classifier with one output. The model is named after
    the run or the folder, which names its ``rewards/<name>/mean`` metric."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(source)
    if (path / "resolved.json").is_file():
        model, tok = load_tuned(path, dtype="auto")  # a QLoRA run's base unquantised, to merge into
        if hasattr(model, "merge_and_unload"):  # a PeftModel: its adapter and score head into the base
            model = model.merge_and_unload()
        name = str(read_json(path / "resolved.json").get("name") or path.name)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
        tok = AutoTokenizer.from_pretrained(source)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        name = path.name if path.is_dir() else source.rsplit("/", 1)[-1]
    model.config.name_or_path = name
    model.eval()
    return model, tok


def load_processor(run_dir: str | Path, *, base: bool = False) -> Any:
    """A vision-language run's processor (image processor + tokenizer + chat template): the one saved
    with its result, else its base model's; None for a text model's run."""
    from transformers import AutoProcessor

    from nbtrain.worker.model import is_vision

    paths = RunPaths(Path(run_dir).resolve())
    cfg: dict[str, Any] = use_converted(read_json(paths.resolved))["config"]
    if not is_vision(cfg):
        return None
    weights = None if base else trained_weights_dir(paths.root)
    saved = weights is not None and (weights / "processor_config.json").exists()
    trust = bool(cfg.get("trust_remote_code", False))
    if saved:
        return AutoProcessor.from_pretrained(str(weights), trust_remote_code=trust)
    return AutoProcessor.from_pretrained(cfg["model"], trust_remote_code=trust, revision=cfg.get("revision"))
