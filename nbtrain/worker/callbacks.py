"""Trainer callback: metrics and resource samples into the run directory, and stop between steps."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nbtrain.rundir import COMPLETE_MARKER, JsonlWriter, RunPaths, write_status
from nbtrain.worker.control import StopControl

# Keys renamed to the run-directory contract; everything else numeric is kept as logged.
_RENAME = {"learning_rate": "lr", "num_input_tokens_seen": "tokens"}


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def memory_sample() -> dict[str, Any]:
    rec: dict[str, Any] = {"t": time.time(), "rank": rank(), "rss": psutil.Process().memory_info().rss}
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rec["gpu_mem_alloc"] = torch.cuda.memory_allocated()
        rec["gpu_mem_reserved"] = torch.cuda.memory_reserved()
        rec["gpu_mem_peak"] = torch.cuda.max_memory_allocated()
    return rec


class RunDirCallback(TrainerCallback):
    """Writes metrics.jsonl (rank 0), system.jsonl (every rank) and status.json; honours stop requests."""

    def __init__(self, paths: RunPaths, stop: StopControl, *, status_interval: float = 1.0) -> None:
        self.paths = paths
        self.stop = stop
        self.is_rank0 = rank() == 0
        self.metrics = JsonlWriter(paths.metrics, "metrics") if self.is_rank0 else None
        self.system = JsonlWriter(paths.system, "system")
        self._status_interval = status_interval
        self._last_status = 0.0
        self._last_t: float | None = None
        self._last_tokens = 0
        self.summary: dict[str, Any] = {}
        self.last_eval_step: int | None = None

    def _status(self, state: str, state_obj: TrainerState, force: bool = False, **extra: Any) -> None:
        if not self.is_rank0:
            return
        now = time.monotonic()
        if force or now - self._last_status >= self._status_interval:
            self._last_status = now
            write_status(
                self.paths, state, step=state_obj.global_step, max_steps=state_obj.max_steps, **extra
            )

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._last_t = time.time()
        self._last_tokens = state.num_input_tokens_seen or 0
        self._status("running", state, force=True)
        self.system.write(memory_sample())

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = dict(logs or {})
        self.system.write(memory_sample())
        if self.metrics is None:
            return
        if "train_loss" in logs:  # the end-of-training summary, not a step
            self.summary.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
            return
        if "eval_loss" in logs:
            self.last_eval_step = state.global_step
        now = time.time()
        rec: dict[str, Any] = {"t": now, "step": state.global_step, "epoch": state.epoch}
        for k, v in logs.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rec[_RENAME.get(k, k)] = v
        if "loss" in rec and "tokens" in rec and self._last_t is not None:
            dt = now - self._last_t
            if dt > 0:
                rec["tokens_per_s"] = (rec["tokens"] - self._last_tokens) / dt
            self._last_t, self._last_tokens = now, rec["tokens"]
        self.metrics.write(rec)
        self._status("stopping" if self.stop.requested else "running", state)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        stop, checkpoint = self._requests_agreed(args)
        if stop and not control.should_training_stop:
            control.should_training_stop = True
            control.should_save = True  # a stopped run keeps its progress as a checkpoint
            self._status("stopping", state, force=True, stop_reason=self.stop.reason)
        else:
            self._status("stopping" if self.stop.requested else "running", state)
        if checkpoint:
            control.should_save = True
            print(f"nbtrain: checkpoint requested at step {state.global_step}", flush=True)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Called once the Trainer has written the whole checkpoint: only now does it count as complete
        # (resume ignores a checkpoint-N without this marker, e.g. one killed while being written).
        ckpt = self.paths.checkpoints / f"checkpoint-{state.global_step}"
        if self.is_rank0 and ckpt.is_dir():
            mark_complete(ckpt)

    def _requests_agreed(self, args: TrainingArguments) -> tuple[bool, bool]:
        """(stop, checkpoint now), agreed by every rank. Every rank must stop or save after the same
        step, or the others would wait forever in the next collective; one tiny all-reduce settles it."""
        import torch
        import torch.distributed as dist

        local = [self.stop.requested, self.stop.take_checkpoint_request()]
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return local[0], local[1]
        flags = torch.tensor([int(x) for x in local], device=args.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, ckpt = bool(flags[0].item()), bool(flags[1].item())
        if stop and not local[0]:
            self.stop.request("another rank")
        return stop, ckpt

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.system.close()


def state_report(trainer: Any) -> dict[str, Any]:
    """What this rank holds after training: parameter elements (local vs full, so ZeRO-3's partitioning
    shows), optimizer-state bytes, and a checksum of the trainable weights (equal on every rank)."""
    import hashlib

    import torch

    model = trainer.model_wrapped if getattr(trainer, "deepspeed", None) is not None else trainer.model
    module = getattr(model, "module", model)
    local = full = 0
    trainable = []
    for name, p in module.named_parameters():
        ds_full = getattr(p, "ds_numel", None)  # set on ZeRO-3 partitioned parameters
        full += int(ds_full) if ds_full is not None else p.numel()
        part = getattr(p, "ds_tensor", None)
        local += int(part.numel()) if part is not None else p.numel()
        if p.requires_grad:
            trainable.append((name, p))
    digest = hashlib.sha256()
    total = 0.0
    params = [p for _, p in trainable]
    if params and getattr(params[0], "ds_numel", None) is not None:
        import deepspeed

        ctx: Any = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    else:
        import contextlib

        ctx = contextlib.nullcontext()
    with ctx, torch.no_grad():
        for name, p in trainable:
            t = p.detach().float().cpu().contiguous()
            digest.update(name.encode())
            digest.update(t.numpy().tobytes())
            total += float(t.abs().sum())
    opt_bytes = 0
    opt = trainer.optimizer
    base = getattr(opt, "optimizer", opt)  # DeepSpeed and accelerate wrap the torch optimizer
    for st in getattr(base, "state", {}).values():
        for v in st.values():
            if torch.is_tensor(v):
                opt_bytes += v.numel() * v.element_size()
    return {
        "t": time.time(), "rank": rank(), "event": "train_end",
        "param_numel_local": local, "param_numel_full": full,
        "optimizer_state_bytes": opt_bytes,
        "trainable_sha256": digest.hexdigest(), "trainable_abs_sum": total,
    }  # fmt: skip


def mark_complete(ckpt: Path) -> None:
    marker = ckpt / COMPLETE_MARKER
    with open(marker, "w", encoding="utf-8") as f:
        f.write(str(time.time()))
        f.flush()
        os.fsync(f.fileno())
