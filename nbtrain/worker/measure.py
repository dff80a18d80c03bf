"""What a training rank really holds: the bytes of its model states, and the report written at train end.

``state_report`` (every run) writes one ``{"event": "train_end", ...}`` record per rank to system.jsonl:
parameter elements (local vs full, so ZeRO-3's partitioning shows), a checksum of the trainable weights
(equal on every rank) and the model-state bytes. ``ModelStateMeter`` hooks the optimizer step to sample
those bytes while they peak; it patches DeepSpeed's ZeRO optimizer, so only runs that ask for it get one:
probe runs (``resolved.json`` has ``"probe": true``: ``nbtrain.probe``, ``%%finetune --probe``), which
the estimator's tests and benchmark use to check the estimate against what was allocated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nbtrain.worker.callbacks import rank

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
        return [_local(obj)]
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


def state_report(trainer: Any, meter: ModelStateMeter | None = None) -> dict[str, Any]:
    """What this rank holds after training: parameter elements (local vs full, so ZeRO-3's partitioning
    shows), a checksum of the trainable weights (equal on every rank), and the bytes of model states:
    ``param_bytes``, ``grad_bytes``, ``master_bytes``, ``optimizer_state_bytes`` and their sum
    ``model_state_bytes``; apart from them ``bucket_bytes`` (DeepSpeed's reduce buckets) and
    ``gathered_param_bytes`` (ZeRO-3 parameters still gathered from forward and backward as the step
    began). With ``meter`` the bytes are its largest optimizer-step sample, else those held now.
    Called after ``trainer.train()``, which frees nothing."""
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
        local += int(part.numel()) if part is not None else _local(p).numel()  # DTensor: global numel
        if p.requires_grad:
            trainable.append((name, p))
    digest = hashlib.sha256()
    total = 0.0
    with torch.no_grad():
        for name, p in trainable:
            # A ZeRO-3 parameter is gathered whole one at a time (every rank in the same order): all of
            # them at once would need the whole model on one device, which ZeRO-3 exists to avoid.
            with _gathered(p):  # read while gathered: the whole tensor may live in a reused buffer
                whole = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: all ranks gather
                t = whole.detach().float().cpu().contiguous()
                digest.update(name.encode())
                digest.update(t.numpy().tobytes())
                total += float(t.abs().sum())
    held = _held_bytes(trainer, module, meter)
    return {
        "t": time.time(), "rank": rank(), "event": "train_end",
        "param_numel_local": local, "param_numel_full": full, **held,
        "trainable_sha256": digest.hexdigest(), "trainable_abs_sum": total,
    }  # fmt: skip


def _local(t: Any) -> Any:
    """The part of ``t`` this rank holds: an FSDP2 parameter (a DTensor) is one shard of the whole."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _gathered(p: Any) -> Any:
    """A context in which ``p`` is whole: DeepSpeed's gather for a ZeRO-3 partitioned parameter."""
    if getattr(p, "ds_numel", None) is None:
        import contextlib

        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([p], modifier_rank=None)


def _held_bytes(trainer: Any, module: Any, meter: ModelStateMeter | None) -> dict[str, Any]:
    """The model-state bytes of the meter's largest optimizer-step sample, or of now (without a meter,
    or when no step ran: then without gradients, which the Trainer frees after each step)."""
    from torch.nn.parallel import DistributedDataParallel

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
