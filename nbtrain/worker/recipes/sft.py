"""Supervised fine-tuning (full, LoRA, QLoRA) on TRL's SFTTrainer.

    python -m nbtrain.worker RUN_DIR        # RUN_DIR/resolved.json has objective: sft (or none: older
                                            # runs) and method: full | lora | qlora

setup() seeds, builds the SFTConfig from ``train:``, joins the process group, loads tokenizer, data and
model (with a freshly initialised LoRA adapter for lora/qlora) as resolved.json says, and builds the
trainer; train() runs it with the run-directory callback, resuming from the checkpoint resolved.json
names, and saves the result to RUN_DIR/output (complete or absent); cleanup() closes the metric files.
"""

from __future__ import annotations

from nbtrain.worker.model import load_model, loraplus_optimizer, save_initial_adapter
from nbtrain.worker.recipes.common import Recipe


class SFTRecipe(Recipe):
    def setup(self) -> None:
        from trl import SFTConfig, SFTTrainer

        run = self.run
        ready = self.prepare(SFTConfig)
        if ready is None:
            return  # a stop came during setup: train() records it
        model = load_model(run.cfg, run.plan, run.args)  # wrapped in its LoRA adapter for lora/qlora
        save_initial_adapter(model, run.cfg, run.paths.root)  # PiSSA/OLoRA: kept to convert the result
        optimizer = loraplus_optimizer(model, run.cfg, ready.args)
        self.make_trainer(
            SFTTrainer, model, ready, **({"optimizers": (optimizer, None)} if optimizer else {})
        )
