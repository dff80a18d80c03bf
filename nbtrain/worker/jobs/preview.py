"""The first training examples exactly as the trainer tokenises them, and token-length statistics.

    python -m nbtrain.worker.jobs.preview RESOLVED_JSON --out OUT_JSON [-n 5] [--stats-rows 2000]

RESOLVED_JSON is a run's resolved.json (or what ``nbtrain.prepare(cfg).to_dict()`` gives). The data is
loaded as the recipe loads it (every source, columns, mixing, streaming) and tokenised by TRL's own
SFT dataset preparation with the run's SFTConfig (chat template, ``{% generation %}`` assistant masks,
``assistant_only_loss``, ``completion_only_loss``, EOS handling; rows' per-message loss flags as the SFT
recipe applies them, worker/masks.py), so the trained-on mask shown is the
labels the trainer will compute the loss on. No model is loaded. The kernel runs this in a subprocess
(transformers must not be imported there) and renders OUT_JSON (see nbtrain.control.jobs.preview).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nbtrain.worker import introspect
from nbtrain.worker.gguf import use_converted

IGNORE = -100  # the label of a token the loss is not computed on


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def segments(
    tok: Any, input_ids: list[int], labels: list[int], image_token: int | None = None
) -> list[tuple[str, bool]]:
    """The sequence as (text, trained) runs: consecutive tokens with the same mask decoded together; a
    run of a vision-language model's image tokens is one "[image: N tokens]" run."""

    def kind(i: int) -> tuple[bool, bool]:
        return labels[i] != IGNORE, input_ids[i] == image_token

    out: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(input_ids) + 1):
        if i == len(input_ids) or kind(i) != kind(start):
            if input_ids[start] == image_token:
                text = f"[image: {i - start} tokens]"
            else:
                text = tok.decode(
                    input_ids[start:i], skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            out.append((text, labels[start] != IGNORE))
            start = i
    return out


# Collating images is slower than tokenising text: a vision-language preview measures fewer rows.
VISION_STATS_ROWS = 200
THUMBNAIL = 96  # pixels, the longer side of an image shown beside its row


def vision_tokenised(
    resolved: dict[str, Any], processor: Any, rows: int, preprocess: Any = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The first ``rows`` examples of a vision-language run as TRL's vision collator prepares each batch
    (chat template, image tokens, ``assistant_only_loss`` masks), one row at a time, untruncated; each with
    its images as thumbnails (data: URIs)."""
    import base64
    import io

    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from nbtrain.worker.data import load_train

    cfg, args = resolved["config"], dict(resolved["train_args"])
    seed = int(introspect.value(args, "seed", cfg.get("objective", "sft")))
    train, fmt, described = load_train(cfg, resolved["data"], "sft", seed, limit=rows, preprocess=preprocess)
    collate = DataCollatorForVisionLanguageModeling(
        processor, max_length=None, assistant_only_loss=bool(args.get("assistant_only_loss"))
    )
    out = []
    for row in train:
        batch = collate([row if row["images"] else {**row, "images": None}])
        thumbs = []
        for image in row["images"]:
            small = image.convert("RGB")
            small.thumbnail((THUMBNAIL, THUMBNAIL))
            buf = io.BytesIO()
            small.save(buf, format="PNG")
            thumbs.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
        mask = batch["attention_mask"][0].bool()
        out.append({
            "input_ids": batch["input_ids"][0][mask].tolist(), "labels": batch["labels"][0][mask].tolist(),
            "images": thumbs,
        })  # fmt: skip
    facts = {
        "format": fmt, "sources": described, "streaming": bool(cfg["data"].get("streaming")),
        "assistant_only_loss": bool(args.get("assistant_only_loss")), "completion_only_loss": False,
        "packing": False, "packing_strategy": None, "padding_free": False,
        "max_length": args.get("max_length"), "truncation_mode": "keep_start",
        "per_device_train_batch_size": introspect.value(args, "per_device_train_batch_size"),
        "chat_template": "the processor's", "vision": True,
    }  # fmt: skip
    return out, facts


def tokenised(
    resolved: dict[str, Any], tok: Any, rows: int, out_dir: str, preprocess: Any = None
) -> tuple[Any, dict[str, Any]]:
    """The first ``rows`` training examples tokenised by SFTTrainer's own preparation, untruncated
    (``preprocess``: the run's ``hooks: preprocess``, nbtrain.worker.hooks).

    Returns (dataset with input_ids and labels, facts about how it was prepared).
    """
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    from nbtrain.worker.data import first_row, load_train
    from nbtrain.worker.masks import own_masks as masks_why
    from nbtrain.worker.masks import with_assistant_masks

    cfg, args = resolved["config"], dict(resolved["train_args"])
    seed = int(introspect.value(args, "seed", cfg.get("objective", "sft")))
    # Tokenising needs no device: drop what would check for one (bf16 on a GPU run, ...).
    for key in ("bf16", "fp16", "tf32", "deepspeed", "fsdp", "fsdp_config", "torch_compile"):
        args.pop(key, None)
    args["use_cpu"] = True
    train, fmt, described = load_train(cfg, resolved["data"], "sft", seed, limit=rows, preprocess=preprocess)
    sft_args = SFTConfig(output_dir=out_dir, **args)
    template_file = sft_args.chat_template_path
    if template_file and os.path.isfile(template_file) and template_file.endswith((".jinja", ".j2")):
        with open(template_file, encoding="utf-8") as f:  # as SFTTrainer sets it (train: chat_template_path)
            tok.chat_template = f.read()
    # Untruncated, unpacked and in order: the lengths are the statistics, truncation is shown separately.
    prep_args = replace(sft_args, max_length=None, packing=False, shuffle_dataset=False)
    sample = first_row(train) or {}
    chat_template = None
    # As the training run does (worker/recipes/sft.py): a template TRL cannot mask, or rows with per-message
    # loss flags, get their masks from the template's rendering (only the turns marked to train).
    why = masks_why(sft_args.assistant_only_loss, cfg.get("train") or {}, tok, train)
    own_masks = why is not None
    flagged = own_masks and not sft_args.assistant_only_loss
    if own_masks:
        train = with_assistant_masks(train, tok)
        prep_args = replace(prep_args, assistant_only_loss=False)
    elif sft_args.assistant_only_loss and not has_generation_markers(tok.chat_template):
        chat_template = get_training_chat_template(tok)
    completion_only = sft_args.completion_only_loss
    if completion_only is None:
        completion_only = "prompt" in sample and "completion" in sample
    # The trainer's preparation reads these three attributes of the trainer; no model is needed for it.
    trainer_facts = SimpleNamespace(
        _tokenizer=tok, completion_only_loss=completion_only, chat_template=chat_template
    )
    ds = SFTTrainer._prepare_dataset(trainer_facts, train, tok, prep_args, False, None, "preview")  # type: ignore[arg-type]
    facts = {
        "format": fmt,
        "sources": described,
        "streaming": bool(cfg["data"].get("streaming")),
        "assistant_only_loss": bool(sft_args.assistant_only_loss or own_masks),
        "completion_only_loss": bool(completion_only),
        "packing": bool(sft_args.packing),
        "packing_strategy": sft_args.packing_strategy if sft_args.packing else None,
        # TRL turns padding-free on for bfd packing (sft_trainer: "BFD packing requires padding-free").
        "padding_free": bool(
            sft_args.padding_free or (sft_args.packing and sft_args.packing_strategy in ("bfd", "bfd_split"))
        ),
        "max_length": sft_args.max_length,
        "truncation_mode": sft_args.truncation_mode,
        "per_device_train_batch_size": sft_args.per_device_train_batch_size,
        "chat_template": _template_note(bool(chat_template), flagged, own_masks, tok),
    }
    return ds, facts


def _template_note(trls: bool, flagged: bool, own_masks: bool, tok: Any) -> str | None:
    """Which chat template the preview's tokens come from, and where its masks come from."""
    if trls:
        return "TRL's training template (the model's has no {% generation %} blocks)"
    if flagged:
        return (
            "the model's (the rows' loss / weight flags: the assistant turns marked to train, found from "
            "its rendering)"
        )
    if own_masks:
        return "the model's (no {% generation %} blocks: assistant turns found from its rendering)"
    return "the model's" if getattr(tok, "chat_template", None) else None


def preview(
    resolved: dict[str, Any], n: int = 5, stats_rows: int = 2000, preprocess: Any = None
) -> dict[str, Any]:
    from nbtrain.worker.model import is_vision, load_tokenizer

    cfg = resolved["config"]
    objective = cfg.get("objective", "sft")
    if objective != "sft":
        raise SystemExit(
            f"nbtrain preview: the token preview covers objective: sft; this run is objective: {objective}"
        )
    tok = load_tokenizer(cfg)  # a vision-language model's processor
    image_token = getattr(tok, "image_token_id", None) if is_vision(cfg) else None
    if is_vision(cfg):
        stats_rows = min(stats_rows, VISION_STATS_ROWS)
    with tempfile.TemporaryDirectory() as tmp:
        if is_vision(cfg):
            ds, facts = vision_tokenised(resolved, tok, max(n, stats_rows), preprocess)
        else:
            ds, facts = tokenised(resolved, tok, max(n, stats_rows), tmp, preprocess)
        max_length = facts["max_length"]
        examples, lengths, trained_total = [], [], 0
        for i, ex in enumerate(ds):
            ids, labels = list(ex["input_ids"]), list(ex["labels"])
            lengths.append(len(ids))
            trained_total += sum(1 for x in labels if x != IGNORE)
            if i < n:
                keep = len(ids) if max_length is None else min(len(ids), max_length)
                if facts["truncation_mode"] == "keep_end" and max_length is not None:
                    ids_seen, labels_seen = ids[-keep:], labels[-keep:]
                else:
                    ids_seen, labels_seen = ids[:keep], labels[:keep]
                examples.append(
                    {
                        "index": i + 1,
                        "tokens": len(ids),
                        "trained": sum(1 for x in labels_seen if x != IGNORE),
                        "cut": len(ids) - keep,
                        "segments": segments(tok, ids_seen, labels_seen, image_token),
                        **(
                            {"images": ex["images"], "image_tokens": ids.count(image_token)}
                            if image_token is not None
                            else {}
                        ),
                    }
                )
    ordered = sorted(lengths)
    stats = {
        "rows": len(lengths),
        "rows_limit": max(n, stats_rows),
        "min": ordered[0] if ordered else 0,
        "p50": _percentile(ordered, 50),
        "p95": _percentile(ordered, 95),
        "max": ordered[-1] if ordered else 0,
        "mean": sum(lengths) / len(lengths) if lengths else 0.0,
        "tokens": sum(lengths),
        "trained_tokens": trained_total,
        "over_max_length": sum(1 for x in lengths if max_length is not None and x > max_length),
    }
    return {**facts, "examples": examples, "stats": stats, "lengths": lengths}


def main(argv: list[str] | None = None) -> int:
    from nbtrain.contract.jobs import result_argument

    ap = argparse.ArgumentParser(prog="python -m nbtrain.worker.jobs.preview", description=__doc__)
    ap.add_argument("resolved", help="a run's resolved.json (with its hooks.pkl beside it, if it has hooks:)")
    result_argument(ap)
    ap.add_argument("-n", type=int, default=5, help="examples to show")
    ap.add_argument("--stats-rows", type=int, default=2000, help="rows measured for the length statistics")
    a = ap.parse_args(argv)
    resolved = json.loads(Path(a.resolved).read_text(encoding="utf-8"))
    from nbtrain.contract.rundir import RunPaths, atomic_write_json
    from nbtrain.worker.hooks import load_run_preprocess
    from nbtrain.worker.lean import hide_unused_packages

    hide_unused_packages(resolved)  # as the training process does: the preview starts as fast
    preprocess = load_run_preprocess(RunPaths(Path(a.resolved).resolve().parent), resolved["config"])
    use_converted(resolved)  # a GGUF model: its converted folder (converted now if it is not yet)
    result = preview(resolved, a.n, a.stats_rows, preprocess)
    atomic_write_json(Path(a.result), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
