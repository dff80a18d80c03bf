"""Trainer callback: metrics and resource samples into the run directory, and stop between steps."""

from __future__ import annotations

import gc
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

import psutil
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nbtrain.contract.rundir import JsonlWriter, RunPaths, mark_complete, rotate_checkpoints, write_status
from nbtrain.worker import writer
from nbtrain.worker.control import StopControl
from nbtrain.worker.threads import CpuThreads

# Keys renamed to the run-directory contract; everything else numeric is kept as logged.
_RENAME = {"learning_rate": "lr", "num_input_tokens_seen": "tokens"}


def _prefixed(names: set[str]) -> set[tuple[str, str]]:
    """(prefix, name) of each metric name as the Trainer logs it: ``eval_<name>`` (``test_`` for predict)."""
    return {(prefix, name) for prefix in ("eval", "test") for name in names}


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class Meter(Protocol):
    """A probe run's measurement of its model states (nbtrain.worker.measure.ModelStateMeter, which
    imports this module), told of the model and optimizer as training begins."""

    def watch(self, module: Any, optimizer: Any) -> None: ...


_SELF: dict[int, psutil.Process] = {}


def _self() -> psutil.Process:
    """One handle per process (a new one per step re-reads /proc/self/stat for nothing), keyed by pid: a run
    forked from the warm process must not ask after its parent, which may have exited."""
    pid = os.getpid()
    if pid not in _SELF:
        _SELF.clear()
        _SELF[pid] = psutil.Process(pid)
    return _SELF[pid]


def memory_sample() -> dict[str, Any]:
    rec: dict[str, Any] = {"t": time.time(), "rank": rank(), "rss": _self().memory_info().rss}
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
    """Writes metrics.jsonl (rank 0), system.jsonl (every rank) and status.json; honours stop requests.

    The files are opened when training begins, so where a recipe makes the callback does not matter and
    a run that fails before its first step leaves no empty metric files. ``meter`` (probe runs only)
    is hooked into the optimizer then too.
    """

    def __init__(
        self,
        paths: RunPaths,
        stop: StopControl,
        *,
        meter: Meter | None = None,
        save_total_limit: int | None = None,
        status_interval: float = 1.0,
        fail_on_nan: bool = True,
        notebook_metrics: set[str] | None = None,
        checkpoint_every: float = 0.0,
        hold_after_eval: float = 0.0,
        threads: CpuThreads | None = None,
    ) -> None:
        self.paths = paths
        # a one-process CPU run: torch's threads follow the cores other processes leave free (worker/threads)
        self.threads = threads
        # A sweep's trial under a pruner: after an evaluation (not the last step's) the run waits, up to this
        # many seconds, until its sweep's driver has read the evaluation and says go on (control/go-<step>)
        # or stop (control/stop, pruned): so a pruned trial stops at the evaluation that decided it.
        self.hold_after_eval = hold_after_eval
        # A checkpoint after the step that ends each ``checkpoint_every`` seconds of training (0: by steps
        # only), so a stop that cannot wait, a crash or running out of memory loses at most that much.
        self.checkpoint_every = checkpoint_every
        self._last_save = time.monotonic()
        self._step_began: float | None = None
        self._step_times: list[float] = []  # the last few steps' wall seconds
        self._steps_timed = 0  # steps of this attempt timed so far
        self._checkpoint_due = False
        self.save_total_limit = save_total_limit  # checkpoints kept; rotation is ours (on_save)
        self.stop = stop
        self.meter = meter
        self.is_rank0 = rank() == 0
        self.metrics: JsonlWriter | None = None  # rank 0 only
        self.system: JsonlWriter | None = None
        self._status_interval = status_interval
        self._last_status = 0.0
        self._last_t: float | None = None
        self._last_tokens = 0
        self.summary: dict[str, Any] = {}
        self.last_eval_step: int | None = None
        self.nonfinite: dict[str, Any] | None = None  # where loss or grad norm stopped being finite
        self.fail_on_nan = fail_on_nan  # config on_nan: fail (else the run goes on, the steps flagged)
        # the names hooks: compute_metrics returned (filled as it runs): a record's keys that are these,
        # logged with the evaluation's prefix (eval_<name>), are listed in its "notebook_metrics"
        self.notebook_metrics = notebook_metrics

    def _open(self) -> JsonlWriter:
        if self.system is None:
            self.system = JsonlWriter(self.paths.system, "system")
            if self.is_rank0:
                self.metrics = JsonlWriter(self.paths.metrics, "metrics")
        return self.system

    def write_system(self, record: dict[str, Any]) -> None:
        """Append a record of this rank to system.jsonl (the train-end report), on the writer thread."""
        writer.submit(self._open().write, record)

    def _status(self, state: str, state_obj: TrainerState, force: bool = False, **extra: Any) -> None:
        if not self.is_rank0:
            return
        now = time.monotonic()
        if force or now - self._last_status >= self._status_interval:
            self._last_status = now
            writer.submit(
                write_status, self.paths, state, step=state_obj.global_step, max_steps=state_obj.max_steps,
                **extra,
            )  # fmt: skip

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.meter is not None:
            self.meter.watch(kwargs.get("model"), kwargs.get("optimizer"))
        release_deepspeed_shm()
        # What exists now (the libraries, the model, the rows) lives until the end: out of the collector's
        # reach, a full collection no longer walks it, which was a stall of 100+ ms every so many steps.
        gc.freeze()
        self._last_t = time.time()
        self._last_tokens = state.num_input_tokens_seen or 0
        # the start's phases are over, and this attempt's step timing starts afresh (a resumed run's
        # status.json still holds the last attempt's)
        self._status("running", state, force=True, phase=None, download=None, step_seconds=None,
                     step_ended=None, steps_timed=0)  # fmt: skip
        self.write_system(memory_sample())
        self._follow_cores(state, force=True)

    def _follow_cores(self, state: TrainerState, force: bool = False) -> None:
        if self.threads is None:
            return
        n = self.threads.adjust(state.global_step, force=force)
        if n is not None:  # the change, in system.jsonl beside the memory samples
            rec = {
                "t": time.time(),
                "rank": rank(),
                "event": "threads",
                "step": state.global_step,
                "threads": n,
            }
            self.write_system({**rec, "others_busy": round(self.threads.others, 2)})

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = dict(logs or {})
        self.write_system(memory_sample())
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
        if self.notebook_metrics:
            ours = [k for k in rec if k.partition("_")[::2] in _prefixed(self.notebook_metrics)]
            if ours:
                rec["notebook_metrics"] = ours
        if "tokens" not in rec and "num_tokens" in rec:
            rec["tokens"] = rec["num_tokens"]  # GRPO counts its own tokens (the Trainer cannot)
        if "loss" in rec and "tokens" in rec and self._last_t is not None:
            dt = now - self._last_t
            if dt > 0:
                rec["tokens_per_s"] = (rec["tokens"] - self._last_tokens) / dt
            self._last_t, self._last_tokens = now, rec["tokens"]
        writer.submit(self.metrics.write, rec)
        if control.should_save:
            # The Trainer writes this step's checkpoint next. A kill after its last file (trainer_state.json)
            # and before on_save leaves it unmarked but whole, and resume takes such a checkpoint
            # (rundir.latest_complete_checkpoint), then logs from the next step on: this row must be on
            # disk before the checkpoint exists (a CI run lost step 14 of 200 so).
            writer.drain()
        self._status("stopping" if self.stop.requested else "running", state)
        self._check_finite(rec, state, control)

    def _check_finite(self, rec: dict[str, Any], state: TrainerState, control: TrainerControl) -> None:
        """A NaN or infinite training loss or gradient norm ends the run as failed at that step (no
        checkpoint of the broken weights is saved): training on would only report "completed"."""
        bad = [k for k in ("loss", "grad_norm") if k in rec and not math.isfinite(float(rec[k]))]
        if bad and self.nonfinite is None and not self.fail_on_nan:
            self.nonfinite = {"step": state.global_step, "values": {k: str(rec[k]) for k in bad}}
            print(f"nbtrain: {', '.join(bad)} not finite at step {state.global_step}; on_nan: continue "
                  "goes on", flush=True)  # fmt: skip
            return
        if bad and self.nonfinite is None:
            self.nonfinite = {"step": state.global_step, "values": {k: str(rec[k]) for k in bad}}
            control.should_training_stop = True
            control.should_save = False
            self._status("running", state, force=True)  # the failed status then names this step

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step_began = time.time()

    def _step_timing(self) -> dict[str, Any]:
        """``step_seconds`` (the median of the last five steps' wall time), ``step_ended`` and
        ``steps_timed``, for status.json: how long a stop waits for the step in progress (``Run.stop``) and
        what it says, and the views' time left (``control/runs/eta``) on steps that log nothing."""
        now = time.time()
        if self._step_began is not None:
            self._step_times = [*self._step_times[-4:], now - self._step_began]
            self._steps_timed += 1
        if not self._step_times:
            return {}
        return {
            "step_seconds": sorted(self._step_times)[len(self._step_times) // 2],
            "step_ended": now,
            "steps_timed": self._steps_timed,
        }

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.hold_after_eval <= 0 or not self.is_rank0 or state.global_step >= (state.max_steps or 0):
            return
        writer.drain(timeout=10.0)  # the evaluation's record on disk, where the driver reads it
        go = self.paths.control_file(f"go-{state.global_step}")
        deadline = time.monotonic() + self.hold_after_eval
        while time.monotonic() < deadline:
            if go.exists():
                go.unlink(missing_ok=True)
                return
            if self.stop.requested:
                control.should_training_stop = True
                control.should_save = True  # a pruned trial keeps its progress: it may be cloned
                self._status("stopping", state, force=True, stop_reason=self.stop.reason)
                return
            time.sleep(0.05)
        print(f"nbtrain: no word from the sweep after the evaluation at step {state.global_step} in "
              f"{self.hold_after_eval:g} s; going on", flush=True)  # fmt: skip

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        timing = self._step_timing()
        self._follow_cores(state)
        stop, checkpoint = self._requests_agreed(args)
        if stop and not control.should_training_stop:
            control.should_training_stop = True
            control.should_save = True  # a stopped run keeps its progress as a checkpoint
            self._status("stopping", state, force=True, stop_reason=self.stop.reason, **timing)
        else:
            # every step, logged or not (at most one write a status_interval); at once for the second
            # timed step, which makes the views' time left known (control/runs/eta.MIN_TIMED)
            first = self._steps_timed == 2
            self._status("stopping" if self.stop.requested else "running", state, force=first, **timing)
        if checkpoint and not control.should_save:
            control.should_save = True
            why = (
                f"after {self.checkpoint_every / 60:g} minutes of training without one (checkpoint_minutes)"
                if self._checkpoint_due
                else "requested"
            )
            print(f"nbtrain: checkpoint at step {state.global_step}, {why}", flush=True)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Called once the Trainer has written the whole checkpoint: only now does it count as complete
        # (resume ignores a checkpoint-N without this marker, e.g. one killed while being written). Old
        # checkpoints go only after that (``save_total_limit``, which the Trainer is not given: it would
        # remove them before the new one is marked, leaving no complete checkpoint if killed between).
        self._last_save = time.monotonic()
        ckpt = self.paths.checkpoints / f"checkpoint-{state.global_step}"
        if not (self.is_rank0 and ckpt.is_dir()):
            return
        # The metrics up to this step on disk first: a resume from this checkpoint logs from the next step
        # on, so a row still queued when the run is killed would be a step missing for good.
        writer.drain()
        mark_complete(ckpt)
        if self.save_total_limit is not None:
            best = state.best_model_checkpoint
            rotate_checkpoints(self.paths, self.save_total_limit, also_keep=Path(best) if best else None)

    def _requests_agreed(self, args: TrainingArguments) -> tuple[bool, bool]:
        """(stop, checkpoint now), agreed by every rank. Every rank must stop or save after the same
        step, or the others would wait forever in the next collective; one tiny all-reduce settles it."""
        import torch
        import torch.distributed as dist

        local = [self.stop.requested, self.stop.take_checkpoint_request()]
        # Each rank's own clock says when a checkpoint by time is due; the agreement below makes it one step.
        self._checkpoint_due = (
            self.checkpoint_every > 0 and time.monotonic() - self._last_save >= self.checkpoint_every
        )
        local[1] = local[1] or self._checkpoint_due
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return local[0], local[1]
        flags = torch.tensor([int(x) for x in local], device=args.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, ckpt = bool(flags[0].item()), bool(flags[1].item())
        if stop and not local[0]:
            self.stop.request("another rank")
        return stop, ckpt

    def close(self) -> None:
        writer.drain()
        for jsonl in (self.metrics, self.system):
            if jsonl is not None:
                jsonl.close()
        self.metrics = self.system = None
