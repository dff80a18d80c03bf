"""Supervised fine-tuning recipe (full, LoRA, QLoRA) on TRL's SFTTrainer; the base of the other recipes.

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has method full | lora | qlora

setup() loads tokenizer, data and model as resolved.json says; train() runs the trainer with the
run-directory callback and saves the result to RUN_DIR/output (written under a temporary name and
renamed, so output/ is complete or absent); cleanup() closes the metric files.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from nbtrain.rundir import RunPaths, write_status
from nbtrain.worker.callbacks import rank, state_report
from nbtrain.worker.control import StopControl
from nbtrain.worker.data import rename_columns

__all__ = ["SFTRecipe", "rename_columns"]


class SFTRecipe:
    def __init__(self, paths: RunPaths, resolved: dict[str, Any], stop: StopControl) -> None:
        self.paths = paths
        self.cfg: dict[str, Any] = resolved["config"]
        self.plan: dict[str, Any] = resolved["plan"]
        self.args: dict[str, Any] = dict(resolved["train_args"])
        self.data: dict[str, Any] = resolved["data"]
        self.resume: dict[str, Any] = resolved.get("resume") or {}
        self.stop = stop
        self.trainer: Any = None
        self.callback: Any = None

    # ------------------------------------------------------------------------------------- setup
    def _dtype(self) -> Any:
        from nbtrain.worker.model import compute_dtype

        return compute_dtype(self.plan)

    def _load_tokenizer(self) -> Any:
        from nbtrain.worker.model import load_tokenizer

        return load_tokenizer(self.cfg)

    def _load_data(self, tok: Any) -> tuple[Any, Any]:
        from nbtrain.worker.data import load_for_training

        objective = str(self.cfg.get("objective", "sft"))
        return load_for_training(self.cfg, self.data, objective, int(self.args.get("seed", 42)), tok)

    def _load_model(self) -> Any:
        from nbtrain.worker.model import load_model

        return load_model(self.cfg, self.plan, self.args)

    def _config_class(self) -> Any:
        """The TRL config class the train args go into (the other recipes name theirs)."""
        from trl import SFTConfig

        return SFTConfig

    def _make_trainer(self, tok: Any, train: Any, evald: Any) -> Any:
        from trl import SFTTrainer

        model = self._load_model()
        return SFTTrainer(
            model=model,
            args=self.sft_args,
            train_dataset=train,
            eval_dataset=evald,
            processing_class=tok,
            callbacks=[self._new_callback()],
        )

    def _new_callback(self) -> Any:
        """The run-directory callback; made once the model has loaded (it opens metrics.jsonl)."""
        from nbtrain.worker.callbacks import RunDirCallback

        self.callback = RunDirCallback(self.paths, self.stop)
        return self.callback

    def setup(self) -> None:
        from transformers import set_seed

        set_seed(int(self.args.get("seed", 42)))
        extra: dict[str, Any] = {}
        if self.plan.get("deepspeed") is not None:
            extra["deepspeed"] = str(self.paths.root / "deepspeed.json")
        # The arguments come first: with ZeRO-3 they register the DeepSpeed config that makes
        # from_pretrained partition the weights as they load (kept alive by self.sft_args).
        config_class = self._config_class()
        self.sft_args = config_class(output_dir=str(self.paths.checkpoints), **self.args, **extra)
        _ = self.sft_args.device  # sets up torch.distributed (gloo on CPU) before the model exists
        if extra and self.plan["device"] == "cpu":
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo")
        tok = self._load_tokenizer()
        train, evald = self._load_data(tok)
        if self.stop.requested:
            return
        self.trainer = self._make_trainer(tok, train, evald)

    # ------------------------------------------------------------------------------------- train
    def train(self) -> str:
        rank0 = rank() == 0
        if self.stop.requested or self.trainer is None:
            if rank0:
                write_status(
                    self.paths, "stopped", stop_reason=self.stop.reason, note="stopped before training"
                )
            return "stopped"
        resume = self.resume.get("from")
        if resume:
            print(f"nbtrain: resuming from {resume} (attempt {self.resume.get('attempt')})", flush=True)
        self.trainer.train(resume_from_checkpoint=resume)
        state = self.trainer.state
        summary = dict(self.callback.summary)
        self.callback.system.write(state_report(self.trainer))
        if self.stop.requested:
            if rank0:
                write_status(self.paths, "stopped", step=state.global_step, max_steps=state.max_steps,
                             stop_reason=self.stop.reason, summary=summary)  # fmt: skip
            return "stopped"
        if self.trainer.eval_dataset is not None and self.callback.last_eval_step != state.global_step:
            self.trainer.evaluate()  # logs eval_loss for the final step through the callback
        self._save_output()
        if rank0:
            write_status(self.paths, "completed", step=state.global_step, max_steps=state.max_steps,
                         summary=summary, output=str(self.paths.output))  # fmt: skip
        return "completed"

    def _save_output(self) -> None:
        # Every rank takes part (ZeRO-3 gathers the partitioned weights); rank 0 writes the files.
        partial = self.paths.root / "output.partial"
        if rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        self.trainer.save_model(str(partial))
        if rank() != 0:
            return
        self.trainer.processing_class.save_pretrained(str(partial))
        if self.paths.output.exists():
            shutil.rmtree(self.paths.output)
        os.replace(partial, self.paths.output)

    def cleanup(self) -> None:
        if self.callback is not None:
            self.callback.close()
