"""Log-probabilities of preference pairs under a run's model, before and after training.

    python -m nbtrain.worker.jobs.score RUN_DIR PAIRS.jsonl --out scores.json [-n 32]

"Before" is the reference model DPO compares with: the base with the adapter disabled (LoRA/QLoRA),
or the original model (full fine-tune); "after" is the trained model in ``output/``. For each pair
``{prompt, chosen, rejected}`` (lists of messages, or plain strings) it writes the summed log-probability
of each completion's tokens given the prompt, as DPO scores them. Runs in its own process: the kernel
that asks (``nbtrain.preference_scores``) never imports torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nbtrain.worker import introspect
from nbtrain.worker.gguf import use_converted


def _texts(tok: Any, prompt: Any, completion: Any) -> tuple[str, str]:
    """(prompt text, completion text) as the chat template renders them, or the strings as given."""
    if isinstance(prompt, str):
        return prompt, completion if isinstance(completion, str) else str(completion)
    prompt_text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*prompt, *completion], tokenize=False)
    if full.startswith(prompt_text):
        return prompt_text, full[len(prompt_text) :]
    return prompt_text, "".join(m["content"] for m in completion)


def sequence_logp(model: Any, tok: Any, prompt_text: str, completion: str) -> float:
    import torch

    p_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + c_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(p_ids) - 1 : -1].float()
    logps = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(c_ids, device=logps.device)
    return float(logps.gather(1, target[:, None]).sum())


def score(run_dir: Path, pairs: list[dict[str, Any]]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from nbtrain.worker.model import load_tokenizer

    resolved = use_converted(json.loads((run_dir / "resolved.json").read_text(encoding="utf-8")))
    cfg = resolved["config"]
    output = run_dir / "output"
    if not (output / "config.json").exists() and not (output / "adapter_config.json").exists():
        raise SystemExit(f"{output} holds no trained model or adapter: did the run complete?")
    tok = load_tokenizer(cfg)
    cuda = torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "dtype": torch.bfloat16 if cuda else torch.float32,
        "trust_remote_code": cfg["trust_remote_code"],
    }
    if cuda:
        kwargs["device_map"] = {"": 0}
    texts = [(_texts(tok, p["prompt"], p["chosen"]), _texts(tok, p["prompt"], p["rejected"])) for p in pairs]

    def logps(model: Any) -> list[tuple[float, float]]:
        model.eval()
        return [(sequence_logp(model, tok, *c), sequence_logp(model, tok, *r)) for c, r in texts]

    base = AutoModelForCausalLM.from_pretrained(cfg["model"], **kwargs)
    if (output / "adapter_config.json").exists():
        from peft import PeftModel

        model = PeftModel.from_pretrained(base, str(output))
        with model.disable_adapter():
            before = logps(model)
        after = logps(model)
    else:
        before = logps(base)
        del base
        after = logps(AutoModelForCausalLM.from_pretrained(str(output), **kwargs))
    objective = str(cfg.get("objective", "dpo"))
    beta = introspect.value(resolved.get("train_args", {}), "beta", objective)
    rows = [
        {
            "logp_chosen_before": cb,
            "logp_rejected_before": rb,
            "logp_chosen_after": ca,
            "logp_rejected_after": ra,
        }
        for (cb, rb), (ca, ra) in zip(before, after, strict=True)
    ]
    return {"run": resolved.get("id"), "beta": beta, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from nbtrain.contract.jobs import result_argument
    from nbtrain.contract.rundir import atomic_write_json

    ap = argparse.ArgumentParser(prog="python -m nbtrain.worker.jobs.score", description=__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("pairs", type=Path, help="JSONL of {prompt, chosen, rejected}")
    result_argument(ap)
    ap.add_argument("-n", type=int, default=32, help="score the first N pairs (default 32)")
    args = ap.parse_args(argv)
    pairs = []
    with open(args.pairs, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                pairs.append(json.loads(line))
            if len(pairs) >= args.n:
                break
    result = score(args.run_dir, pairs)
    atomic_write_json(Path(args.result), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
