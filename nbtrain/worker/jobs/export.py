"""Export what a run trained as a standalone model directory.

    python -m nbtrain.worker.jobs.export RUN_DIR --to DIR [--no-merge] [--dtype auto|fp32|bf16|fp16]
                                    [--overwrite] [--push-to-hub REPO [--public]] [--result FILE]

With merging (the default) the result loads with ``AutoModelForCausalLM.from_pretrained(DIR)`` alone:
- lora:  the base loaded unquantised in the target dtype, the adapter merged in (``merge_and_unload``);
- qlora: the base loaded as in training (4/8-bit), de-quantised to the target dtype, then merged, so the
         merged weights are the ones the adapter was trained against (not the original full-precision ones);
- full:  the fine-tuned weights, in the target dtype.
Without merging a LoRA/QLoRA run exports its adapter (peft format; it names the base model). A reward
run (objective: reward) exports a sequence classifier: ``AutoModelForSequenceClassification`` loads it.

DIR gets safetensors weights, the tokenizer, the generation config and ``nbtrain_export.json`` (where it
came from). Everything is written into a temporary sibling directory that is renamed to DIR at the end,
so DIR is complete or untouched. ``--push-to-hub`` then uploads DIR with huggingface_hub; a failed push
keeps DIR and is reported as such. ``--result`` receives a JSON summary for the caller
(nbtrain.control.jobs.export).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from nbtrain.contract.exports import PROVENANCE, protected_dirs, target_problem, written_files
from nbtrain.contract.paths import home_dir
from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_json
from nbtrain.worker.gguf import use_converted
from nbtrain.worker.lean import hide_for_run
from nbtrain.worker.threads import settle

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nbtrain.worker.jobs.export", description=__doc__.split("\n")[0]
    )
    p.add_argument("run_dir")
    p.add_argument("--to", required=True, help="the directory to create")
    p.add_argument("--merge", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--dtype", default="auto", help="auto (the base model's), fp32, bf16 or fp16")
    p.add_argument("--format", default="hf", choices=["hf", "gguf"], help="hf (safetensors) or gguf")
    p.add_argument("--quant", default="f16", help="gguf: the types to write, comma-separated")
    p.add_argument("--prompts", default=None, help="gguf: a JSON list of prompts to check each file on")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --to directory")
    p.add_argument("--push-to-hub", default=None, metavar="REPO", help="upload the result to this repo")
    p.add_argument("--public", action="store_true", help="create the hub repo public (default private)")
    p.add_argument("--result", default=None, help="write a JSON summary here")
    return p


def export_dtype(cfg: dict[str, Any], name: str) -> Any:
    """The torch dtype for ``--dtype``; ``auto`` is the dtype the base model was saved in."""
    import torch
    from transformers import AutoConfig

    from nbtrain.worker.tuned import torch_dtype

    if name != "auto":
        return torch_dtype(name, torch.float32)
    saved = getattr(AutoConfig.from_pretrained(cfg["model"], trust_remote_code=cfg["trust_remote_code"]),
                    "dtype", None)  # fmt: skip
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved if isinstance(saved, torch.dtype) else torch.float32


def load_tokenizer_of(cfg: dict[str, Any], weights: Path) -> Any:
    """The tokenizer saved with the run's weights (training saves it to output/), else the base's."""
    from transformers import AutoTokenizer

    src = weights if (weights / "tokenizer_config.json").exists() else Path(cfg["model"])
    return AutoTokenizer.from_pretrained(str(src), trust_remote_code=cfg["trust_remote_code"])


def merged_model(run_dir: Path, cfg: dict[str, Any], weights: Path, dtype: Any) -> Any:
    """The run's model with its adapter merged in (or its full weights), in ``dtype``, on the CPU."""
    from nbtrain.worker.tuned import load_tuned

    dtype_name = str(dtype).removeprefix("torch.")
    method = cfg["method"]
    if method == "qlora":
        import torch
        from peft import PeftModel

        # Quantised exactly as in training (on the GPU when there is one: bitsandbytes' home ground).
        device = "cuda" if torch.cuda.is_available() else "cpu"
        base, _ = load_tuned(run_dir, base=True, device=device)
        base = base.dequantize()  # bitsandbytes weights -> plain Linear layers in the compute dtype
        base.is_loaded_in_4bit = base.is_loaded_in_8bit = False
        base = base.to("cpu", dtype)
        model = PeftModel.from_pretrained(base, str(weights), is_trainable=False)
        return model.merge_and_unload()
    model, _ = load_tuned(run_dir, dtype=dtype_name)
    if method == "lora":
        model = model.merge_and_unload()
    return model


def write_export(
    run_dir: Path,
    target: Path,
    *,
    merge: bool,
    dtype_name: str,
    fmt: str = "hf",
    quants: list[str] | None = None,
    final: Path | None = None,
    prompts: list[str] | None = None,
) -> dict[str, Any]:
    """Write the export into ``target`` (an empty, new directory); returns the provenance record."""
    import torch
    import transformers

    from nbtrain.contract import __version__
    from nbtrain.worker.tuned import load_processor, trained_weights_dir

    paths = RunPaths(run_dir)
    resolved = use_converted(read_json(paths.resolved))
    cfg: dict[str, Any] = resolved["config"]
    method = cfg["method"]
    weights = trained_weights_dir(run_dir)
    tok = load_tokenizer_of(cfg, weights)
    processor = load_processor(run_dir)  # a vision-language run's: saved beside the weights
    adapter_only = not merge and method in ("lora", "qlora")
    dtype: Any = None
    report = None
    if fmt == "gguf":
        from nbtrain.worker.jobs.export_gguf import GGUFExport, export_gguf

        dtype = export_dtype(cfg, dtype_name)

        def merged() -> Any:
            print(f"nbtrain export: merging the {method} run's weights ({weights}), {dtype}", flush=True)
            return merged_model(run_dir, cfg, weights, dtype).to(dtype)

        name = str(resolved.get("name") or resolved.get("id") or run_dir.name)
        lora_base = Path(cfg["model"]) if adapter_only else None  # --no-merge: the adapter as a GGUF LoRA
        job = GGUFExport(run_dir, target, final or target, merged, tok, resolved, weights, name, prompts)
        report = export_gguf(job, quants or ["f16"], lora_base)
        kind = "gguf-lora" if adapter_only else "gguf"
    elif adapter_only:
        # The adapter as trained; its adapter_config.json names the base model to load it onto.
        for name in ADAPTER_FILES:
            if (weights / name).exists():
                shutil.copy2(weights / name, target / name)
        kind = "adapter"
    else:
        dtype = export_dtype(cfg, dtype_name)
        print(f"nbtrain export: {method} run, weights from {weights}, dtype {dtype}", flush=True)
        model = merged_model(run_dir, cfg, weights, dtype)
        model = model.to(dtype)
        generation = getattr(model, "generation_config", None)  # None for a reward model (a scorer)
        if generation is not None and generation.pad_token_id is None and tok.pad_token_id is not None:
            generation.pad_token_id = tok.pad_token_id
        model.save_pretrained(str(target))  # safetensors
        if generation is not None:
            generation.save_pretrained(str(target))
        kind = "merged" if method in ("lora", "qlora") else "full"
    if fmt != "gguf":
        (processor or tok).save_pretrained(str(target))
    step = None
    if weights.name.startswith("checkpoint-"):
        step = int(weights.name.split("-", 1)[1])
    else:
        step = (read_json(paths.status) if paths.status.exists() else {}).get("step")
    merged_into = None
    if kind == "merged":
        merged_into = "the de-quantised training base" if method == "qlora" else "the unquantised base"
    record = {
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kind": kind,
        "run_id": resolved.get("id", run_dir.name),
        "run_name": resolved.get("name"),
        "run_dir": str(run_dir),
        "base_model": cfg["model"],
        "method": method,
        "objective": cfg.get("objective", "sft"),
        "quantization": cfg.get("quantization") if method == "qlora" else None,
        "merged_into": merged_into,
        "weights_from": str(weights),
        "step": step,
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "format": fmt,
        "quants": quants if fmt == "gguf" else None,
        "gguf": report,
        "versions": {
            "nbtrain": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    # What this export wrote: a later export with overwrite replaces this folder only while it holds no more.
    record["files"] = [*written_files(target), PROVENANCE]
    (target / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _leftovers(target: Path, kind: str) -> list[Path]:
    """``.<name>.<kind>-<pid>`` siblings of ``target`` left by exports whose process is gone (killed)."""
    import psutil

    found = []
    for d in target.parent.glob(f".{target.name}.{kind}-*"):
        pid = d.name.rsplit("-", 1)[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)) and not d.is_symlink():
            found.append(d)
    return found


def clear_leftovers(target: Path) -> list[str]:
    """Tidy after exports to ``target`` that were killed: their partial folders are deleted, and a target
    that one moved aside to replace it (killed between the two renames) is put back. Returns what was
    done, for the log."""
    done = []
    for old in _leftovers(target, "old"):
        if not target.exists():
            os.replace(old, target)
            done.append(f"put back {target} (an earlier export was killed while replacing it)")
        else:
            shutil.rmtree(old, ignore_errors=True)
            done.append(f"removed {old.name}")
    for partial in _leftovers(target, "partial"):
        shutil.rmtree(partial, ignore_errors=True)
        done.append(f"removed {partial.name} (left by a killed export)")
    return done


def publish(partial: Path, target: Path, run_dir: Path) -> None:
    """Rename the finished ``partial`` to ``target``; an existing ``target`` is replaced only now, after
    the target rule is checked once more (what is there may have changed while the export was written)."""
    problem = target_problem(target, True, protected_dirs(run_dir, home_dir()))
    if problem:
        raise RuntimeError(problem)
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
    os.replace(partial, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def push(target: Path, repo: str, *, private: bool, run_id: str) -> str:
    """Upload ``target`` to the hub repo ``repo`` (created if missing); returns the repo URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(folder_path=str(target), repo_id=repo, repo_type="model",
                      commit_message=f"nbtrain export of run {run_id}")  # fmt: skip
    return str(url)


def main(argv: list[str] | None = None, *, lean: bool = False) -> int:
    """``lean``: this process is the command (``python -m``), so it may leave unused packages out."""
    args = _parser().parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    if lean:
        hide_for_run(run_dir, label="nbtrain export")  # before torch/peft are imported
    target = Path(args.to).expanduser().resolve()
    result: dict[str, Any] = {"ok": False, "dir": str(target)}
    settle()  # the merge, the checks' generations and llama.cpp: the cores other processes leave free

    def finish(code: int) -> int:
        if args.result:
            atomic_write_json(Path(args.result), result)
        return code

    if target.parent.is_dir():
        for line in clear_leftovers(target):
            print(f"nbtrain export: {line}", flush=True)
    problem = target_problem(target, args.overwrite, protected_dirs(run_dir, home_dir()))
    if problem:
        result["error"] = problem
        print(f"nbtrain export: {problem}", file=sys.stderr, flush=True)
        return finish(2)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        quants = [q.strip() for q in args.quant.split(",") if q.strip()]
        prompts = json.loads(args.prompts) if args.prompts else None
        record = write_export(run_dir, partial, merge=args.merge, dtype_name=args.dtype, fmt=args.format,
                              quants=quants, final=target, prompts=prompts)  # fmt: skip
        publish(partial, target, run_dir)
    except BaseException as e:  # noqa: BLE001 - reported to the caller; the partial directory goes
        shutil.rmtree(partial, ignore_errors=True)
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        return finish(1)
    result.update(ok=True, record=record, files=sorted(p.name for p in target.iterdir()))
    print(f"nbtrain export: wrote {target} ({record['kind']})", flush=True)
    if args.push_to_hub:
        try:
            url = push(target, args.push_to_hub, private=not args.public, run_id=record["run_id"])
            result["pushed"] = url
            print(f"nbtrain export: pushed to {result['pushed']}", flush=True)
        except Exception as e:  # noqa: BLE001 - the export itself stands; the caller reports the push
            traceback.print_exc()
            result["push_error"] = f"{type(e).__name__}: {e}"
            return finish(3)
    return finish(0)


if __name__ == "__main__":
    raise SystemExit(main(lean=True))
