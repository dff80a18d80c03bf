"""Trainer callback: metrics and resource samples into the run directory, and stop between steps."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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


SHM_DIR = Path("/dev/shm")


def release_deepspeed_shm(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Unlink the name of this rank's DeepSpeed CPU all-reduce buffer (``/dev/shm/deepspeed_allreduce_
    buffer_<uid>_<addr>_<port>_<rank>``, ~67 MB); returns what was removed.

    DeepSpeed never removes it, so every multi-rank CPU run used to leave 2 x 67 MB in /dev/shm (RAM)
    until reboot. Once every rank has mapped every buffer the names are no longer needed: the mappings
    stay valid and the memory is freed when the last rank exits, even one killed with SIGKILL. Called at
    train begin, after the engine's first collectives, which need every rank's buffers opened.
    """
    port = os.environ.get("MASTER_PORT")
    if not port:
        return []
    removed = []
    for path in shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_{rank()}"):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


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
        self.meter = ModelStateMeter()

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
        self.meter.watch(kwargs.get("model"), kwargs.get("optimizer"))
        release_deepspeed_shm()
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
        if "tokens" not in rec and "num_tokens" in rec:
            rec["tokens"] = rec["num_tokens"]  # GRPO counts its own tokens (the Trainer cannot)
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


# ===================================================================== model states actually held

# Where DeepSpeed's ZeRO optimizers (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, 0.19) keep
# the fp32 master partition, and the buffers gradients are reduced into and stepped from. Master
# tensors carry the fp32 gradient partition the torch optimizer steps on as their ``.grad``.
_DS_MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
_DS_GRADS = ("averaged_gradients", "all_grad_tensors", "grads_in_partition", "grad_partitions_flat_buffer")
_DS_BUCKETS = ("ipg_buckets",)  # communication buckets: a size from the config, not from the model


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    """The tensors in ``obj``: a tensor, or lists/tuples/dicts of them (DeepSpeed nests its groups), or an
    IPG bucket object, whose flat buffers are its ``buffer``."""
    import torch

    if torch.is_tensor(obj):
        return [obj]
    if obj is None or depth > 4:
        return []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item, depth + 1)]
    return _tensors(getattr(obj, "buffer", None), depth + 1)


class _Tally:
    """Bytes of tensor storages, each counted once: views of one flat buffer (DeepSpeed's parameters and
    gradient partitions are such views) share its storage, and the whole storage is what is allocated."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def add(self, tensors: Any) -> int:
        total = 0
        for t in _tensors(tensors):
            if t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0 or ptr in self.seen:  # empty (a released ZeRO-3 parameter's .data) or counted
                continue
            self.seen.add(ptr)
            total += storage.nbytes()
        return total


def _optimizer_layers(optimizer: Any) -> list[Any]:
    """``trainer.optimizer`` down to the torch optimizer that steps: accelerate's wrapper, DeepSpeed's
    ZeRO optimizer (when there is one), then torch's, each the ``.optimizer`` of the one above."""
    layers: list[Any] = []
    while optimizer is not None and len(layers) < 6 and all(optimizer is not o for o in layers):
        layers.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return layers


def _zero_optimizers(optimizer: Any) -> list[Any]:
    return [o for o in _optimizer_layers(optimizer) if any(hasattr(o, a) for a in _DS_MASTER)]


def _quant_tensors(p: Any) -> list[Any]:
    """bitsandbytes' constants kept beside a quantised weight: 4-bit absmax (and the nested absmax of
    double quantisation), 8-bit row scales."""
    out: list[Any] = []
    qs = getattr(p, "quant_state", None)
    while qs is not None:
        out += [t for t in (getattr(qs, "absmax", None), getattr(qs, "offset", None)) if t is not None]
        qs = getattr(qs, "state2", None)
    scb = getattr(p, "SCB", None)
    return out + ([scb] if scb is not None else [])


def model_state_bytes(module: Any, optimizer: Any, extra_grads: Any = None) -> dict[str, int]:
    """Bytes this rank holds now for the model's states, by summing the tensors that hold them.

    * parameters: every parameter's storage; under ZeRO-3 its local partition ``ds_tensor`` plus the
      whole tensor where one is gathered at the moment (none at the optimizer step);
    * master: DeepSpeed's fp32 copy of the owned partition (without DeepSpeed torch steps the
      parameters themselves, and a master sharing the parameters' storage counts as parameters);
    * gradients: ``p.grad``, DeepSpeed's reduced gradient partitions and the fp32 gradient its step
      uses, and ``extra_grads`` (a flat copy being made); DDP's buckets: see ``ddp_bucket_bytes``;
    * optimizer state: the tensors in the stepping torch optimizer's ``state`` (Adam's moments, steps).

    Storages are counted once, in that order. DeepSpeed's reduce buckets (a fixed number of elements
    from its config, whatever the model size) are apart, as ``bucket_bytes``.
    """
    tally = _Tally()
    params = list(module.parameters()) if module is not None else []
    param_bytes = 0
    for p in params:
        param_bytes += tally.add(getattr(p, "ds_tensor", None)) + tally.add(p) + tally.add(_quant_tensors(p))
    zero = _zero_optimizers(optimizer)
    masters = [t for o in zero for a in _DS_MASTER for t in _tensors(getattr(o, a, None))]
    master_bytes = tally.add(masters)
    grads: list[Any] = [p.grad for p in params if p.grad is not None]
    grads += [t.grad for t in masters if t.grad is not None]
    grads += [getattr(o, a, None) for o in zero for a in _DS_GRADS] + [extra_grads]
    grad_bytes = tally.add(grads)
    layers = _optimizer_layers(optimizer)
    base = layers[-1] if layers else None
    state_bytes = tally.add([v for st in getattr(base, "state", {}).values() for v in st.values()])
    return {
        "param_bytes": param_bytes, "grad_bytes": grad_bytes, "master_bytes": master_bytes,
        "optimizer_state_bytes": state_bytes,
        "model_state_bytes": param_bytes + grad_bytes + master_bytes + state_bytes,
        "bucket_bytes": tally.add([getattr(o, a, None) for o in zero for a in _DS_BUCKETS]),
    }  # fmt: skip


def gathered_param_bytes(module: Any) -> int:
    """Bytes of ZeRO-3 parameters gathered whole right now (their ``.data`` beside the partition)."""
    tally = _Tally()
    return tally.add([p for p in module.parameters() if getattr(p, "ds_tensor", None) is not None])


def ddp_bucket_bytes(ddp: Any) -> int:
    """Bytes of DDP's all-reduce buckets where they are separate storage (``gradient_as_bucket_view``
    off, as accelerate and the Trainer leave it): a flat copy of every gradient, owned by the C++
    reducer and invisible to Python. Its logging data reports their sizes (elements x element size).
    They are allocated with the wrapper and live as long as it does."""
    if getattr(ddp, "gradient_as_bucket_view", True):
        return 0  # the gradients are views of the buckets: counted once, as p.grad
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))  # a private API: callers guard it
    return sum(int(x) for x in sizes.split(",") if x.strip())


class ModelStateMeter:
    """Samples ``model_state_bytes`` during each optimizer step and keeps the largest sample.

    The step is when model states peak: every gradient is reduced and alive, the optimizer state of the
    earlier steps exists, nothing is freed yet. Samples are taken in a pre-hook of the torch optimizer
    that steps (inside DeepSpeed's step under ZeRO: the fp32 gradient partition is there) and, under
    DeepSpeed, right after its step flattens a reduced gradient partition into the fp32 one: the only
    moment both exist when there is a single parameter group. As DeepSpeed's step begins, the ZeRO-3
    parameters still gathered from forward and backward are measured too (``gathered_param_bytes``);
    the step then releases them. A sample walks Python objects only, no data: it costs milliseconds.
    """

    def __init__(self) -> None:
        self.peak: dict[str, int] | None = None
        self.gathered = 0
        self.samples = 0
        self.error: str | None = None  # a failed measurement stops measuring, never training
        self._module: Any = None
        self._optimizer: Any = None
        self._in_step = False

    def watch(self, module: Any, optimizer: Any) -> None:
        """Hook into ``optimizer`` (``trainer.optimizer``, wrapped as it is) of ``module``; once only."""
        import torch

        layers = _optimizer_layers(optimizer)
        if module is None or not layers or self._optimizer is not None:
            return
        self._module, self._optimizer = module, optimizer
        if isinstance(layers[-1], torch.optim.Optimizer):
            layers[-1].register_step_pre_hook(lambda *_: self.sample())
        for zero in _zero_optimizers(optimizer):
            # Instance attributes shadow the methods DeepSpeed calls as self.step() and self.flatten().
            zero.step = self._around_step(zero.step)
            if callable(getattr(zero, "flatten", None)):
                zero.flatten = self._after_flatten(zero.flatten)

    def _around_step(self, step: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._guarded(self._measure_gathered)
            self._in_step = True
            try:
                return step(*args, **kwargs)
            finally:
                self._in_step = False

        return wrapped

    def _after_flatten(self, flatten: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            flat = flatten(*args, **kwargs)
            if self._in_step:  # the step's fp32 gradient being made (flatten also serves set-up)
                self.sample(extra_grads=flat)
            return flat

        return wrapped

    def sample(self, extra_grads: Any = None) -> None:
        self._guarded(lambda: self._sample(extra_grads))

    def _measure_gathered(self) -> None:
        self.gathered = max(self.gathered, gathered_param_bytes(self._module))

    def _sample(self, extra_grads: Any) -> None:
        got = model_state_bytes(self._module, self._optimizer, extra_grads)
        self.samples += 1
        if self.peak is None or got["model_state_bytes"] >= self.peak["model_state_bytes"]:
            self.peak = got

    def _guarded(self, measure: Callable[[], None]) -> None:
        # The hooks run inside the optimizer step: an optimizer layout this code does not know must cost
        # the measurement (reported as state_error), not the run.
        if self.error is not None:
            return
        try:
            measure()
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"[:500]


def state_report(trainer: Any) -> dict[str, Any]:
    """What this rank holds after training: parameter elements (local vs full, so ZeRO-3's partitioning
    shows), a checksum of the trainable weights (equal on every rank), and the bytes of model states it
    held at the optimizer step (``ModelStateMeter``): ``param_bytes``, ``grad_bytes``, ``master_bytes``,
    ``optimizer_state_bytes`` and their sum ``model_state_bytes``; apart from them ``bucket_bytes``
    (DeepSpeed's reduce buckets) and ``gathered_param_bytes`` (ZeRO-3 parameters still gathered from
    forward and backward as the step began). Called after ``trainer.train()``, which frees nothing."""
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
    held = _held_bytes(trainer, module)
    return {
        "t": time.time(), "rank": rank(), "event": "train_end",
        "param_numel_local": local, "param_numel_full": full, **held,
        "trainable_sha256": digest.hexdigest(), "trainable_abs_sum": total,
    }  # fmt: skip


def _held_bytes(trainer: Any, module: Any) -> dict[str, Any]:
    """The model-state bytes of the largest optimizer-step sample (or of now, when no step ran: then
    without gradients, which the Trainer frees after each step)."""
    from torch.nn.parallel import DistributedDataParallel

    meter = next((c.meter for c in trainer.callback_handler.callbacks if isinstance(c, RunDirCallback)), None)
    peak = meter.peak if meter is not None else None
    held: dict[str, Any] = dict(peak if peak is not None else model_state_bytes(module, trainer.optimizer))
    held["gathered_param_bytes"] = meter.gathered if meter is not None else 0
    held["state_samples"] = meter.samples if meter is not None else 0
    if meter is not None and meter.error is not None:
        held["state_error"] = meter.error
    wrapped = getattr(trainer, "model_wrapped", None)
    if isinstance(wrapped, DistributedDataParallel):
        # DDP's buckets live as long as the wrapper: allocated once, so measured here at the end.
        try:
            buckets = ddp_bucket_bytes(wrapped)
        except Exception as e:  # noqa: BLE001 - a private torch API; the report must still be written
            held["state_error"] = f"DDP buckets: {type(e).__name__}: {e}"[:500]
            buckets = 0
        held["grad_bytes"] += buckets
        held["model_state_bytes"] += buckets
    return held


def mark_complete(ckpt: Path) -> None:
    marker = ckpt / COMPLETE_MARKER
    with open(marker, "w", encoding="utf-8") as f:
        f.write(str(time.time()))
        f.flush()
        os.fsync(f.fileno())
