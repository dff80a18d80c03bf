"""One trial of bench_sweep.py's Optuna-driven sweep: a bare TRL SFT script, as a user writes by hand for
Optuna to run once per trial (no nbtrain). LoRA on the tiny model with the given learning rate and rank,
a seeded held-out split, evaluation every ``--eval-steps`` (a fraction of the steps, as TRL takes it); it
prints one ``RESULT {json}`` line with the last ``eval_loss`` and the steps trained.

    python bench/sweep_bare_trl.py MODEL DATA OUT --learning-rate 1e-3 --lora-r 8 [--steps 30]
"""

from __future__ import annotations

import argparse
import json


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data", help="a JSON lines file of chat rows (messages)")
    ap.add_argument("out", help="the Trainer's output folder")
    ap.add_argument("--learning-rate", type=float, required=True)
    ap.add_argument("--lora-r", type=int, required=True)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--lora-dropout", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--eval-split", type=float, default=0.1)
    ap.add_argument("--eval-steps", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import SFTConfig, SFTTrainer

    set_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    split = load_dataset("json", data_files=args.data, split="train").train_test_split(
        test_size=args.eval_split, seed=args.seed
    )
    model = AutoModelForCausalLM.from_pretrained(args.model)
    lora = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")  # fmt: skip
    peft_model = get_peft_model(model, lora)
    config = SFTConfig(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=args.learning_rate, logging_steps=1, eval_strategy="steps", eval_steps=args.eval_steps,
        save_strategy="no", report_to="none", use_cpu=True, seed=args.seed, disable_tqdm=True,
    )  # fmt: skip
    trainer = SFTTrainer(model=peft_model, args=config, train_dataset=split["train"],
                         eval_dataset=split["test"], processing_class=tok)  # fmt: skip
    trainer.train()
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    print("RESULT", json.dumps({"eval_loss": evals[-1], "evaluations": evals,
                                "steps": trainer.state.global_step}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
