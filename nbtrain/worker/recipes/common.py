"""What every recipe does the same way: ``Recipe``, the class each recipe's own class extends, and the
named steps it takes.

``Recipe`` holds the start of every ``setup()`` (``prepare``: seed, training args, process group,
tokenizer, data), the trainer made with the run-directory callback (``make_trainer``), ``train()`` and
``cleanup()``. A recipe's own ``setup()`` is what differs, and reads top to bottom::

    ready = self.prepare(ConfigClass)       # None when a stop came meanwhile: train() records it
    if ready is None:
        return
    model = load_model(...)                 # the objective's own model (and rewards, for GRPO)
    self.make_trainer(TrainerClass, model, ready, **objective_kwargs)

``train()`` is ``train_and_save(trainer, callback, run)``. No recipe extends another. Nothing here imports
torch, transformers or TRL at module level: the worker hides unused packages before the first library
import.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from nbtrain.contract.rundir import RunPaths, write_status
from nbtrain.worker import introspect, writer
from nbtrain.worker.control import StopControl
from nbtrain.worker.model import INITIAL_ADAPTER, is_vision, load_tokenizer, report_trainable


class NonFiniteTraining(RuntimeError):
    """The loss or gradient norm became NaN or infinite: the run fails at that step."""

    def __init__(self, found: dict[str, Any], paths: RunPaths) -> None:
        from nbtrain.contract.rundir import latest_complete_checkpoint

        values = ", ".join(f"{k} {v}" for k, v in found["values"].items())
        ckpt = latest_complete_checkpoint(paths)
        before = f"; its last good checkpoint is {ckpt.name}" if ckpt is not None else ""
        super().__init__(
            f"training stopped at step {found['step']}: {values} (not a finite number){before}. Lower "
            f"train: learning_rate, set train: max_grad_norm (e.g. 1.0), or check the rows of that step "
            f"(on_nan: continue trains on regardless)"
        )


@dataclass
class RunContext:
    """What a recipe knows of its run: the directory, resolved.json split into its parts, and the stop
    control the entry point set up (signals and control/stop)."""

    paths: RunPaths
    resolved: dict[str, Any]
    stop: StopControl
    cfg: dict[str, Any] = field(init=False)
    plan: dict[str, Any] = field(init=False)
    args: dict[str, Any] = field(init=False)  # train: keys, as the kernel resolved them

    def __post_init__(self) -> None:
        self.cfg = self.resolved["config"]
        self.plan = self.resolved["plan"]
        self.args = dict(self.resolved["train_args"])

    @property
    def objective(self) -> str:
        return str(self.cfg.get("objective", "sft"))  # runs from before objectives existed are SFT

    @property
    def seed(self) -> int:
        return int(introspect.value(self.args, "seed", self.objective))

    @property
    def probe(self) -> bool:
        """A probe run (``nbtrain.probe``, ``%%finetune --probe``) measures what its ranks hold."""
        return bool(self.resolved.get("probe"))


def starting_phase(run: RunContext, phase: str) -> None:
    """What the run does before its first step, in status.json while it is ``starting`` (rank 0 writes
    status; the first ``running`` status drops the phase)."""
    if int(os.environ.get("RANK", "0")) == 0 and not run.stop.requested:
        write_status(run.paths, "starting", phase=phase)


def seed(run: RunContext) -> None:
    from transformers import set_seed

    set_seed(run.seed)


def training_args(config_class: Any, run: RunContext) -> Any:
    """The objective's TRL config (``SFTConfig``, ``DPOConfig``, ...) from ``train:``, checkpointing into
    RUN_DIR/checkpoints, with RUN_DIR/deepspeed.json when the plan uses DeepSpeed.

    Make it before the model and keep it until the trainer has it: under ZeRO-3 it registers the
    DeepSpeed config (transformers holds only a weak reference) that makes ``from_pretrained`` partition
    the weights as they load.

    ``save_total_limit`` is kept from the Trainer: the run-directory callback removes old checkpoints,
    after the new one is marked complete (``run_callback``)."""
    extra: dict[str, Any] = {}
    if run.plan.get("deepspeed") is not None:
        extra["deepspeed"] = str(run.paths.root / "deepspeed.json")
    args = {k: v for k, v in run.args.items() if k != "save_total_limit"}
    return config_class(output_dir=str(run.paths.checkpoints), **args, **extra)


def init_distributed(args: Any, run: RunContext) -> None:
    """Join this rank to the process group before the model exists. Reading ``args.device`` is what
    makes transformers set up torch.distributed (gloo on CPU) from the launcher's environment; DeepSpeed
    on CPU also needs its own ``init_distributed`` before ``from_pretrained`` (it is not done for it)."""
    _ = args.device
    if run.plan.get("strategy") == "fsdp":
        # What accelerate's launcher would say: with it (and the training args' CPU-RAM-efficient loading)
        # from_pretrained reads the weights on rank 0 only; the other ranks hold them on the meta device
        # until FSDP hands each its shard.
        os.environ["ACCELERATE_USE_FSDP"] = "true"
    if run.plan.get("deepspeed") is not None and run.plan["device"] == "cpu":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")


def shard_on_cpu(trainer: Any, run: RunContext) -> None:
    """FSDP on CPU ranks. accelerate (1.16, ``AcceleratorState``) turns FSDP on only for accelerator
    devices: CPU ranks over gloo become ``MULTI_CPU`` and the Trainer wraps the model in DDP, so every rank
    silently holds the whole model (why an earlier CPU run "did not shard"). torch's FSDP2 itself shards
    on CPU over gloo, so on CPU the state accelerate built is set to FSDP with the plugin from the training
    args before the first ``prepare``; on GPUs nothing is changed."""
    if run.plan["device"] != "cpu" or trainer.is_fsdp_enabled:
        return
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    # as accelerate records it on GPUs: every later AcceleratorState() copies the partial state in
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


def load_run_data(
    resolved: dict[str, Any], tok: Any, objective: str | None = None, preprocess: Any = None
) -> tuple[Any, Any]:
    """(train, eval) rows of a run exactly as training sees them: every source, ``hooks: preprocess``
    (``preprocess``, from ``nbtrain.worker.hooks``), the column mapping, the seeded eval split (the same
    rows on resume, and for ``nbtrain.evaluate``), checked against the tokenizer. ``objective`` overrides
    the run's (evaluation reads SFT rows)."""
    from nbtrain.worker.data import load_for_training

    cfg = resolved["config"]
    seed_ = int(introspect.value(resolved["train_args"], "seed", cfg.get("objective", "sft")))
    objective = objective or cfg.get("objective", "sft")
    return load_for_training(cfg, resolved["data"], objective, seed_, tok, preprocess)


def run_callback(run: RunContext, notebook_metrics: set[str] | None = None) -> Any:
    """The run-directory callback (metrics.jsonl, system.jsonl, status.json, stop and checkpoint
    requests); on a probe run with a meter that samples the model-state bytes at each optimizer step.
    ``notebook_metrics``: the names ``hooks: compute_metrics`` returns, marked in metrics.jsonl."""
    from nbtrain.worker.callbacks import RunDirCallback
    from nbtrain.worker.measure import ModelStateMeter
    from nbtrain.worker.threads import follower

    limit = run.args.get("save_total_limit")
    sweep = run.resolved.get("sweep") or {}
    return RunDirCallback(
        run.paths,
        run.stop,
        # a pruned sweep's trial: after each evaluation, its sweep's driver decides whether it goes on
        hold_after_eval=float(sweep.get("hold_after_eval") or 0.0) if isinstance(sweep, dict) else 0.0,
        meter=ModelStateMeter() if run.probe else None,
        save_total_limit=int(limit) if limit is not None else None,
        fail_on_nan=run.cfg.get("on_nan", "fail") == "fail",  # absent from older run directories
        notebook_metrics=notebook_metrics,
        threads=follower(run.resolved),
        # a checkpoint by training time too (none where the run saves none: save_strategy no, a probe)
        checkpoint_every=60.0 * float(run.cfg.get("checkpoint_minutes") or 0)
        if introspect.value(run.args, "save_strategy", run.objective) != "no"
        else 0.0,
    )


def train_and_save(trainer: Any, callback: Any, run: RunContext) -> str:
    """Train (resuming from the checkpoint resolved.json names), record what each rank held, evaluate the
    final step, save RUN_DIR/output and write the final status; "completed" or "stopped".

    ``trainer`` is None when a stop came during setup: the run stops before training."""
    from nbtrain.worker.callbacks import rank
    from nbtrain.worker.measure import state_report

    rank0 = rank() == 0
    if run.stop.requested or trainer is None:
        if rank0:
            write_status(run.paths, "stopped", stop_reason=run.stop.reason, note="stopped before training")
        return "stopped"
    resume = (run.resolved.get("resume") or {}).get("from")
    if resume:
        attempt = run.resolved["resume"].get("attempt")
        print(f"nbtrain: resuming from {resume} (attempt {attempt})", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    if callback.nonfinite is not None and callback.fail_on_nan:
        raise NonFiniteTraining(callback.nonfinite, run.paths)
    summary = dict(callback.summary)
    callback.write_system(state_report(trainer, callback.meter))
    # A stop asked for at the last step (a SLURM time limit, a user) comes after the training's own end:
    # the run completed, and saying "stopped" would have a requeued job resume it for one step too many.
    finished = state.max_steps > 0 and state.global_step >= state.max_steps
    if run.stop.requested and not finished:
        writer.drain()
        if rank0:
            write_status(run.paths, "stopped", step=state.global_step, max_steps=state.max_steps,
                         stop_reason=run.stop.reason, summary=summary)  # fmt: skip
        return "stopped"
    if trainer.eval_dataset is not None and callback.last_eval_step != state.global_step:
        trainer.evaluate()  # logs eval_loss for the final step through the callback
    save_output(trainer, run.paths)
    writer.drain()  # the queued step records and statuses first: the final status is the last word
    if rank0:
        write_status(run.paths, "completed", step=state.global_step, max_steps=state.max_steps,
                     summary=summary, output=str(run.paths.output))  # fmt: skip
    return "completed"


def save_output(trainer: Any, paths: RunPaths) -> None:
    """The model (or adapter) and tokenizer into RUN_DIR/output, complete or absent: written under
    output.partial and renamed. Every rank takes part (ZeRO-3 gathers the partitioned weights); rank 0
    writes the files."""
    from nbtrain.worker.callbacks import rank

    partial = paths.root / "output.partial"
    if rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is not None:  # checkpoints are sharded; the result is one model, gathered to rank 0
        plugin.set_state_dict_type("FULL_STATE_DICT")
    initial = paths.root / INITIAL_ADAPTER
    if initial.is_dir():  # PiSSA/OLoRA (one process): saved as a plain LoRA that loads on the untouched base
        trainer.model.save_pretrained(str(partial), path_initial_model_for_weight_conversion=str(initial))
    else:
        trainer.save_model(str(partial))
    if rank() != 0:
        return
    trainer.processing_class.save_pretrained(str(partial))
    if paths.output.exists():
        shutil.rmtree(paths.output)
    os.replace(partial, paths.output)


@dataclass
class TrainingInputs:
    """What ``Recipe.prepare`` made for the trainer: the TRL config, the tokenizer and the rows."""

    args: Any
    tokenizer: Any
    train: Any
    eval: Any


class Recipe:
    """setup / train / cleanup of one run. A recipe class names its TRL config and trainer and builds its
    model in ``setup()``; what every recipe does alike is here."""

    def __init__(self, paths: RunPaths, resolved: dict[str, Any], stop: StopControl) -> None:
        self.run = RunContext(paths, resolved, stop)
        self.trainer: Any = None
        self.callback: Any = None
        self.hooks: Any = None  # the notebook's hooks (nbtrain.worker.hooks.RunHooks), loaded by prepare

    def setup(self) -> None:
        raise NotImplementedError

    def prepare(self, config_class: Any) -> TrainingInputs | None:
        """The start of every ``setup()``, in this order: the notebook's hooks (a pickle that cannot load
        fails first), seed (before anything random), the training args (before the model: under ZeRO-3 they
        make the load partition), the process group, the tokenizer and the run's data. None when a stop was
        requested meanwhile: the run stops before training."""
        from nbtrain.worker.hooks import load_run_hooks

        run = self.run
        self.hooks = load_run_hooks(run.paths, run.cfg)
        seed(run)
        args = training_args(config_class, run)
        init_distributed(args, run)
        tok = load_tokenizer(run.cfg)
        train, evald = load_run_data(run.resolved, tok, preprocess=self.hooks.preprocess)
        if run.stop.requested:
            return None  # train() records the stop
        return TrainingInputs(args, tok, train, evald)

    def make_trainer(self, trainer_class: Any, model: Any, ready: TrainingInputs, **objective: Any) -> None:
        """The objective's trainer on the model, the args and the rows, with the run-directory callback
        (``run_callback``) and the notebook's hooks (its callbacks before the run-directory one, so what
        they add to the logs is written too); ``objective``: the trainer's own keywords (peft_config,
        reward_funcs, ...)."""
        from nbtrain.worker.data import is_streaming
        from nbtrain.worker.hooks import RunHooks

        hooks = self.hooks if self.hooks is not None else RunHooks()
        self.callback = run_callback(self.run, hooks.metric_keys if hooks.compute_metrics else None)

        if not is_streaming(ready.train):  # the trainer tokenises the rows as it is built
            starting_phase(self.run, f"tokenising {len(ready.train):,} rows")
        self.trainer = trainer_class(
            model=model,
            args=ready.args,
            train_dataset=ready.train,
            eval_dataset=ready.eval,
            processing_class=ready.tokenizer,
            callbacks=[*hooks.callbacks, self.callback],
            **hooks.trainer_kwargs(),
            **objective,
        )
        if self.run.plan.get("strategy") == "fsdp":
            shard_on_cpu(self.trainer, self.run)
        if is_vision(self.run.cfg):  # text-only rows mixed in: the collator needs an image row first
            from nbtrain.worker.data import ImageRowsFirst

            self.trainer.data_collator = ImageRowsFirst(self.trainer.data_collator)

    def report_reference(self) -> None:
        """The log lines of a trainer that attached the adapter itself (``peft_config``): the trainable
        parameters, and what it compares the policy with."""
        report_trainable(self.trainer.model, self.run.cfg["method"])
        print(f"nbtrain: {self.run.objective} reference model: {self.reference()}", flush=True)

    def reference(self) -> str:
        """What the trainer compares the policy with (objectives with a reference: preference and RL; their
        recipes first say when there is none)."""
        if getattr(self.trainer, "ref_model", None) is not None:
            return "a frozen copy of the model"
        if self.run.cfg["method"] in ("lora", "qlora"):
            return "the base model with the adapter disabled"
        return "log-probs precomputed before training"

    def train(self) -> str:
        return train_and_save(self.trainer, self.callback, self.run)

    def cleanup(self) -> None:
        if self.callback is not None:
            self.callback.close()
