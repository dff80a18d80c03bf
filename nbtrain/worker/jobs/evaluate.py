"""Evaluate what a run trained: held-out loss and perplexity, and lm-evaluation-harness tasks.

    python -m nbtrain.worker.jobs.evaluate RUN_DIR [--file DATA] [--compare-base] [--tasks T [T ...]]
                                      [--limit N] [--batch-size N] [--result FILE]

Loss is the mean next-token negative log-likelihood over every token that carries a label, on the rows
exactly as SFTTrainer prepares them for training (same chat template, truncation, packing and
completion-only masking), and perplexity is exp(loss). The rows are the run's eval split (the same
seeded split the training held out, or its ``data: eval:`` file), or ``--file`` (any SFT data file).
``--compare-base`` measures the base model on the same batches: for LoRA/QLoRA the same weights with
the adapter disabled, for a full fine-tune the base loaded again.

``--tasks`` runs lm-evaluation-harness (``lm_eval.simple_evaluate`` on an HFLM wrapping the model in
memory): task names it knows, or lm-eval task YAML files / directories of them (local data works
offline). Results go to ``RUN_DIR/eval/<time>.json`` and ``RUN_DIR/eval/latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_json
from nbtrain.worker.gguf import use_converted
from nbtrain.worker.lean import hide_for_run, unhide_packages
from nbtrain.worker.threads import settle

EVAL_DIR = "eval"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nbtrain.worker.jobs.evaluate", description=__doc__.split("\n")[0]
    )
    p.add_argument("run_dir")
    p.add_argument("--file", default=None, help="SFT data to measure on (default: the run's eval split)")
    p.add_argument("--compare-base", action="store_true", help="measure the base model too")
    p.add_argument("--tasks", nargs="*", default=None, help="lm-eval task names, task YAML files or dirs")
    p.add_argument("--limit", type=float, default=None, help="rows per task / of the data (N or fraction)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--result", default=None, help="write a JSON summary here")
    return p


# ------------------------------------------------------------------------------------------ data


def eval_rows(
    resolved: dict[str, Any], tok: Any, file: str | None, preprocess: Any = None
) -> tuple[Any, str]:
    """(rows in SFT form, where they came from): ``file``, else the run's own eval data as training saw it
    (``preprocess``: the run's ``hooks: preprocess``, nbtrain.worker.hooks.load_run_preprocess)."""
    from nbtrain.contract.formats import FILE_KINDS, SFT_FORMATS
    from nbtrain.worker.data import DataError, convert, load_raw, rename_columns
    from nbtrain.worker.recipes.common import load_run_data

    cfg = resolved["config"]
    d = cfg["data"]
    if file is not None:
        path = Path(file)
        kind = FILE_KINDS.get(path.suffix.lower(), "disk" if path.is_dir() else "")
        if not kind:
            raise DataError(f"{file}: give a {', '.join(FILE_KINDS)} file or a save_to_disk directory")
        fmt = d["format"] if d.get("format") in ("auto", *SFT_FORMATS) else "auto"
        raw = rename_columns(load_raw(str(path), kind), d.get("columns"))
        folder = str(path if kind == "disk" else path.parent)  # where its rows' image paths start
        rows, _ = convert(
            raw,
            fmt,
            "sft",
            vision=bool(cfg.get("vision")),
            base=folder,
            mask_history=bool(d.get("mask_history")),
        )
        return rows, f"file {path}"
    if cfg.get("objective", "sft") != "sft":
        raise DataError(
            f"the eval split of an objective: {cfg['objective']} run holds {cfg['objective']} rows, not SFT "
            f"text; give file= with SFT rows (messages, alpaca, sharegpt or text) to measure loss on"
        )
    # The recipes' own loader: the same files, column mapping and seeded split as in training.
    _, held_out = load_run_data(resolved, tok, preprocess=preprocess)
    if held_out is None:
        raise DataError(
            "the run has no eval data (its config has no data: eval_split or data: eval); give file= "
            "to measure on a data file"
        )
    source = "data: eval" if resolved.get("data", {}).get("eval") else f"eval_split {d.get('eval_split')}"
    return held_out, f"the run's {source}"


def eval_batches(model: Any, tok: Any, rows: Any, train_args: dict[str, Any], batch_size: int) -> Any:
    """A DataLoader of the rows tokenised and collated exactly as SFTTrainer does for this run."""
    from trl import SFTConfig, SFTTrainer

    keep = {"max_length", "packing", "eval_packing", "packing_strategy", "padding_free", "seed",
            "completion_only_loss", "assistant_only_loss", "dataset_text_field", "dataset_kwargs",
            "pad_to_multiple_of", "chat_template_path", "eos_token", "pad_token", "bf16", "fp16"}  # fmt: skip
    args = {k: v for k, v in train_args.items() if k in keep}
    with tempfile.TemporaryDirectory() as tmp:
        config = SFTConfig(output_dir=tmp, report_to="none", per_device_eval_batch_size=batch_size,
                           use_cpu=str(model.device) == "cpu", dataloader_pin_memory=False,
                           disable_tqdm=True, **args)  # fmt: skip
        # SFTTrainer insists on a train_dataset; one row keeps its preparation negligible.
        trainer = SFTTrainer(model=model, args=config, train_dataset=rows.select(range(1)),
                             eval_dataset=rows, processing_class=tok)  # fmt: skip
        return trainer.get_eval_dataloader()


# What a collated batch holds besides the model's inputs.
_NOT_INPUTS = {"labels", "completion_mask", "assistant_masks", "token_type_ids"}


def held_out_nll(model: Any, batches: Any) -> dict[str, float]:
    """Token-weighted mean NLL over every labelled next token; perplexity = exp(loss)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    device = model.device
    with torch.no_grad():
        for batch in batches:
            names = ("input_ids", "attention_mask", "position_ids")
            inputs = {k: batch[k].to(device) for k in names if k in batch}
            for k, v in batch.items():  # a vision-language model's pixel values, image sizes, ...
                if k not in inputs and k not in _NOT_INPUTS and hasattr(v, "to"):
                    floating = v.is_floating_point()
                    inputs[k] = v.to(device, dtype=model.dtype) if floating else v.to(device)
            labels = batch["labels"].to(device)
            logits = model(**inputs).logits.float()
            shift_logits, shift_labels = logits[:, :-1, :], labels[:, 1:]
            nll = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                                  ignore_index=-100, reduction="sum")  # fmt: skip
            total += float(nll)
            count += int((shift_labels != -100).sum())
    if count == 0:
        raise ValueError("no labelled tokens to measure (every row was masked or empty)")
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": count}


# ------------------------------------------------------------------------------------- lm-eval


def resolve_tasks(specs: list[str]) -> tuple[list[str], list[str]]:
    """(task names, include paths): a YAML file contributes its ``task:``, a directory every task in it."""
    import yaml

    names: list[str] = []
    include: list[str] = []

    class TaskLoader(yaml.SafeLoader):
        pass

    # lm-eval YAMLs may carry !function tags; only the task name is needed here.
    TaskLoader.add_multi_constructor("!", lambda loader, suffix, node: None)

    def from_yaml(path: Path) -> list[str]:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskLoader)  # noqa: S506 - SafeLoader subclass
        task = doc.get("task") if isinstance(doc, dict) else None
        return [task] if isinstance(task, str) else list(task or []) if isinstance(task, list) else []

    for spec in specs:
        p = Path(spec).expanduser()
        if p.suffix in (".yaml", ".yml") and p.is_file():
            found = from_yaml(p)
            if not found:
                raise ValueError(f"{p} names no task (no 'task:' key); is it an lm-eval task YAML?")
            names += found
            include.append(str(p.resolve().parent))
        elif p.is_dir():
            found = [t for f in sorted(p.rglob("*.y*ml")) for t in from_yaml(f)]
            if not found:
                raise ValueError(f"{p} holds no lm-eval task YAML (no file with a 'task:' key)")
            names += found
            include.append(str(p.resolve()))
        else:
            names.append(spec)  # a task lm-eval knows by name (its data may need the hub)
    return names, sorted(set(include))


def run_tasks(model: Any, tok: Any, specs: list[str], limit: float | None, batch_size: int) -> dict[str, Any]:
    """{task: {metric: value}} from lm-evaluation-harness, on the model as it is in memory."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise RuntimeError(
            "tasks need lm-evaluation-harness in the environment that runs nbtrain: pip install lm-eval"
        ) from None
    names, include = resolve_tasks(specs)
    only_local = len(include) > 0 and all(Path(s).expanduser().exists() for s in specs)
    manager = TaskManager(include_path=include or None, include_defaults=not only_local)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size)
    lim: float | int | None = None if limit is None else (int(limit) if limit >= 1 else limit)
    out = simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=lim, log_samples=False,
                          bootstrap_iters=0)  # fmt: skip
    results: dict[str, Any] = {}
    for task, metrics in (out or {}).get("results", {}).items():
        clean = {}
        for key, value in metrics.items():
            # Metrics are keyed "metric,filter" (acc,none); alias, sample_len and stderrs are not scores.
            name, _, _ = key.partition(",")
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if "," in key and numeric and not name.endswith("_stderr"):
                clean[name] = float(value)
        results[task] = clean
    return results


# ----------------------------------------------------------------------------------------- main


@contextlib.contextmanager
def as_base(model: Any) -> Iterator[None]:
    with model.disable_adapter():
        yield


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from nbtrain.worker.hooks import load_run_preprocess
    from nbtrain.worker.tuned import load_processor, load_tuned, trained_weights_dir

    paths = RunPaths(Path(args.run_dir).resolve())
    resolved = use_converted(read_json(paths.resolved))
    cfg = resolved["config"]
    method = cfg["method"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = trained_weights_dir(paths.root)
    model, tok = load_tuned(paths.root, device=device)
    processor = load_processor(paths.root)  # a vision-language run's: it collates the image rows
    preprocess = load_run_preprocess(paths, cfg) if args.file is None else None  # the run's own rows
    rows, source = eval_rows(resolved, tok, args.file, preprocess)
    if args.limit is not None:
        n = int(args.limit) if args.limit >= 1 else max(1, int(len(rows) * args.limit))
        rows = rows.select(range(min(n, len(rows))))
    batches = eval_batches(model, processor or tok, rows, resolved.get("train_args") or {}, args.batch_size)
    print(f"nbtrain eval: {len(rows)} rows from {source}, weights {weights}", flush=True)
    models: dict[str, Any] = {"tuned": held_out_nll(model, batches)}
    base_model = None
    if args.compare_base:
        if method in ("lora", "qlora"):
            with as_base(model):
                models["base"] = held_out_nll(model, batches)
        else:
            base_model, _ = load_tuned(paths.root, base=True, device=device)
            models["base"] = held_out_nll(base_model, batches)
    for who, m in models.items():
        print(f"nbtrain eval: {who}: loss {m['loss']:.4f}, perplexity {m['perplexity']:.2f}", flush=True)
    tasks: dict[str, Any] | None = None
    if args.tasks:
        tasks = {"tuned": run_tasks(model, tok, args.tasks, args.limit, args.batch_size)}
        if args.compare_base:
            if base_model is not None:
                tasks["base"] = run_tasks(base_model, tok, args.tasks, args.limit, args.batch_size)
            else:
                with as_base(model):
                    tasks["base"] = run_tasks(model, tok, args.tasks, args.limit, args.batch_size)
    step = int(weights.name.split("-", 1)[1]) if weights.name.startswith("checkpoint-") else None
    if step is None:
        step = (read_json(paths.status) if paths.status.exists() else {}).get("step")
    return {
        "created": time.time(),
        "run_id": resolved.get("id", paths.root.name),
        "weights": str(weights),
        "step": step,
        "data": {"source": source, "rows": len(rows), "file": args.file},
        "models": models,
        "tasks": tasks,
        "task_specs": args.tasks or None,
        "limit": args.limit,
        "device": device,
    }


def main(argv: list[str] | None = None, *, lean: bool = False) -> int:
    """``lean``: this process is the command (``python -m``), so it may leave unused packages out."""
    args = _parser().parse_args(argv)
    if lean:  # lm-eval's metrics may need scipy (through scikit-learn): only bitsandbytes stays out
        unhide_packages(("scipy",))  # started by the warm process, which holds it hidden
        hide_for_run(Path(args.run_dir).resolve(), keep=("scipy",), label="nbtrain eval")
    result: dict[str, Any] = {"ok": False}
    settle()  # torch's threads: the cores other processes leave free
    try:
        report = evaluate(args)
        out_dir = RunPaths(Path(args.run_dir).resolve()).root / EVAL_DIR
        out_dir.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(report["created"]))
        path = out_dir / f"{stamp}-{os.getpid()}.json"
        atomic_write_json(path, report)
        atomic_write_json(out_dir / "latest.json", report)
        result.update(ok=True, path=str(path))
        code = 0
    except BaseException as e:  # noqa: BLE001 - reported to the caller through the result file
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        code = 1
    if args.result:
        atomic_write_json(Path(args.result), result)
    print(f"nbtrain eval: {'wrote ' + result['path'] if result['ok'] else result['error']}",
          file=sys.stdout if result["ok"] else sys.stderr, flush=True)  # fmt: skip
    return code


if __name__ == "__main__":
    raise SystemExit(main(lean=True))
