"""Supervised fine-tuning recipe (full, LoRA, QLoRA) on TRL's SFTTrainer.

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
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.plan["precision"], torch.float32)

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(
            self.cfg["model"], trust_remote_code=self.cfg["trust_remote_code"]
        )
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok

    def _load_data(self, tok: Any) -> tuple[Any, Any]:
        from nbtrain.worker.data import DataError, load_raw, normalise

        d = self.cfg["data"]
        train_src = self.data["train"]
        train, fmt = normalise(
            load_raw(train_src["location"], train_src["kind"]), d["format"], max_samples=d.get("max_samples")
        )
        if fmt != "text" and not getattr(tok, "chat_template", None):
            raise DataError(
                f"the data is conversational ({fmt}) but the tokenizer of {self.cfg['model']} "
                f"has no chat template; use a chat model, or give plain text rows with "
                f"format: text"
            )
        evald = None
        if self.data.get("eval"):
            ev = self.data["eval"]
            evald, _ = normalise(load_raw(ev["location"], ev["kind"]), fmt)
        elif d.get("eval_split"):
            if len(train) < 2:
                raise DataError("eval_split needs at least 2 rows of training data")
            split = train.train_test_split(test_size=d["eval_split"], seed=self.args.get("seed", 42))
            train, evald = split["train"], split["test"]
        print(
            f"nbtrain: {len(train)} training rows ({fmt})"
            + (f", {len(evald)} eval rows" if evald is not None else ""),
            flush=True,
        )
        return train, evald

    def _load_model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        method = self.cfg["method"]
        kwargs: dict[str, Any] = {"trust_remote_code": self.cfg["trust_remote_code"]}
        on_gpu = self.plan["device"] == "cuda"
        if method == "qlora":
            from transformers import BitsAndBytesConfig

            q = self.cfg["quantization"]
            compute = self._dtype()
            if q["bits"] == 4:
                kwargs["quantization_config"] = BitsAndBytesConfig(
                    load_in_4bit=True,
                    bnb_4bit_quant_type=q["quant_type"],
                    bnb_4bit_use_double_quant=q["double_quant"],
                    bnb_4bit_compute_dtype=compute,
                )
            else:
                kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
            kwargs["dtype"] = compute
            kwargs["device_map"] = {"": 0} if on_gpu else {"": "cpu"}
        elif method == "lora":
            # The frozen base can live in the compute dtype; only the adapters train.
            kwargs["dtype"] = self._dtype() if on_gpu else torch.float32
        else:
            kwargs["dtype"] = torch.float32  # full fine-tune keeps fp32 master weights; AMP does the rest
        model: Any = AutoModelForCausalLM.from_pretrained(self.cfg["model"], **kwargs)
        if method == "qlora":
            from peft import prepare_model_for_kbit_training

            bits = self.cfg["quantization"]["bits"]
            if not getattr(model, f"is_loaded_in_{bits}bit", False):
                raise RuntimeError(f"bitsandbytes did not quantise {self.cfg['model']} to {bits}-bit")
            print(f"nbtrain: base weights loaded in {bits}-bit by bitsandbytes", flush=True)

            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=bool(self.args.get("gradient_checkpointing", True))
            )
        if method in ("lora", "qlora"):
            from peft import LoraConfig, get_peft_model
            from transformers import set_seed

            lo = self.cfg["lora"]
            target = lo["target_modules"]
            peft_cfg = LoraConfig(
                r=lo["r"],
                lora_alpha=lo["alpha"],
                lora_dropout=lo["dropout"],
                bias=lo["bias"],
                target_modules=None if target == "auto" else target,
                task_type="CAUSAL_LM",
            )
            set_seed(int(self.args.get("seed", 42)))  # adapter init is random: seed it for reproducible runs
            model = get_peft_model(model, peft_cfg)
            trainable, total = model.get_nb_trainable_parameters()
            print(f"nbtrain: {method} adapters: {trainable:,} trainable of {total:,} parameters", flush=True)
        return model

    def setup(self) -> None:
        from transformers import set_seed
        from trl import SFTConfig, SFTTrainer

        from nbtrain.worker.callbacks import RunDirCallback

        set_seed(int(self.args.get("seed", 42)))
        extra: dict[str, Any] = {}
        if self.plan.get("deepspeed") is not None:
            extra["deepspeed"] = str(self.paths.root / "deepspeed.json")
        # The arguments come first: with ZeRO-3 they register the DeepSpeed config that makes
        # from_pretrained partition the weights as they load (kept alive by self.sft_args).
        self.sft_args = SFTConfig(output_dir=str(self.paths.checkpoints), **self.args, **extra)
        _ = self.sft_args.device  # sets up torch.distributed (gloo on CPU) before the model exists
        if extra and self.plan["device"] == "cpu":
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo")
        tok = self._load_tokenizer()
        train, evald = self._load_data(tok)
        if self.stop.requested:
            return
        model = self._load_model()
        self.callback = RunDirCallback(self.paths, self.stop)
        self.trainer = SFTTrainer(
            model=model,
            args=self.sft_args,
            train_dataset=train,
            eval_dataset=evald,
            processing_class=tok,
            callbacks=[self.callback],
        )

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
