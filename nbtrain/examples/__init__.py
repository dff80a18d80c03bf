"""A tiny local model and small datasets, for the demo, the teaching labs on CPU, and the tests.

No model hub is needed: the model is a 2-layer Llama with hidden size 64 and random weights, and its
tokenizer is a byte-level BPE trained here on the same text the datasets use, with a chat template.

    python -m nbtrain.examples model DIR            # build the tiny model
    python -m nbtrain.examples data FILE [--format messages|alpaca|sharegpt|text|preference|unpaired|prompt]
                                        [-n N] [--plain]

``make_tiny_model`` and ``write_dataset`` import transformers, so call them from a worker or a test,
not from a kernel; the kernel-safe wrappers are ``nbtrain.make_tiny_model`` / ``nbtrain.example_data``.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ m['content'] }}<|end|>"
    "{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|tool|>"]


def addition_items(n: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs: small sums written out, a task a tiny model can start to learn."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        items.append((f"What is {a} + {b}?", f"{a} + {b} = {a + b}"))
    return items


def wrong_answer(answer: str, rng: random.Random) -> str:
    """``answer`` ("a + b = c") with a wrong sum: the rejected side of the preference data."""
    lhs, total = answer.rsplit(" = ", 1)
    delta = rng.choice([d for d in range(-9, 10) if d != 0 and int(total) + d >= 0])
    return f"{lhs} = {int(total) + delta}"


def word_answer(rng: random.Random) -> str:
    """A few common words and no sum: the rejected side of the ``rejected="words"`` preference data."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6)))


def preference_rows(
    fmt: str = "preference",
    n: int = 200,
    seed: int = 0,
    *,
    conversational: bool = True,
    rejected: str = "wrong",
) -> list[dict[str, Any]]:
    """The addition task as preference data: ``preference`` (chosen = the correct sum, rejected = a
    wrong one), ``unpaired`` (KTO: one completion per row, label true when it is correct, alternating)
    or ``prompt`` (GRPO: the question, plus an ``answer`` column a reward function can check).

    ``rejected="words"``: the rejected answer is a few common words instead of a wrong sum, a preference
    (answers written as sums) that a reward model on the tiny model learns in a few steps (the RLHF loop
    of lab 3: a reward model on these pairs, then RLOO against it)."""
    if rejected not in ("wrong", "words"):
        raise ValueError(f"rejected is 'wrong' (a wrong sum) or 'words' (common words), not {rejected!r}")
    rng = random.Random(seed + 1)
    rows: list[dict[str, Any]] = []
    for i, (q, a) in enumerate(addition_items(n, seed)):
        prompt: Any = [{"role": "user", "content": q}] if conversational else f"{q}\n"

        def said(text: str) -> Any:
            return [{"role": "assistant", "content": text}] if conversational else text

        if fmt == "preference":
            bad = wrong_answer(a, rng) if rejected == "wrong" else word_answer(rng)
            rows.append({"prompt": prompt, "chosen": said(a), "rejected": said(bad)})
        elif fmt == "unpaired":
            good = i % 2 == 0
            rows.append(
                {"prompt": prompt, "completion": said(a if good else wrong_answer(a, rng)), "label": good}
            )
        elif fmt == "prompt":
            rows.append({"prompt": prompt, "answer": a.rsplit(" = ", 1)[1]})
        else:
            raise ValueError(f"unknown preference format {fmt!r}")
    return rows


def dataset_rows(fmt: str = "messages", n: int = 400, seed: int = 0) -> list[dict[str, Any]]:
    """The addition data in one of the formats nbtrain reads."""
    if fmt in ("preference", "unpaired", "prompt"):
        return preference_rows(fmt, n, seed)
    rows: list[dict[str, Any]] = []
    for q, a in addition_items(n, seed):
        if fmt == "messages":
            rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        elif fmt == "alpaca":
            rows.append({"instruction": q, "input": "", "output": a})
        elif fmt == "sharegpt":
            rows.append({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]})
        elif fmt == "text":
            rows.append({"text": f"{q} {a}"})
        else:
            raise ValueError(f"unknown format {fmt!r}")
    return rows


def variable_length_rows(n: int = 400, seed: int = 0, *, most: int = 16) -> list[dict[str, Any]]:
    """Conversations of very different lengths (1 to ``most`` sums per question, skewed short, as real
    chat data is): the data on which padding costs most and packing helps most."""
    rng = random.Random(seed)
    items = addition_items(n * most, seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        k = min(most, 1 + int(rng.expovariate(4 / most)))
        chunk = items[i * most : i * most + k]
        question = " ".join(q for q, _ in chunk)
        answer = "; ".join(a for _, a in chunk)
        rows.append(
            {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
        )
    return rows


def write_dataset(
    path: str | Path, fmt: str = "messages", n: int = 400, seed: int = 0, *, conversational: bool = True
) -> Path:
    """Write the addition data in the file format its suffix names: JSON lines (.jsonl / .ndjson), one JSON
    array (.json) or CSV (.csv, flat formats only). Stdlib only: safe to call from a kernel.
    ``conversational`` applies to the preference formats: False writes plain strings instead of lists of
    messages."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".json", ".csv"):
        raise ValueError(
            f"{p.name}: example data is written as .jsonl, .ndjson, .json or .csv, not {suffix!r}"
        )
    rows = (
        preference_rows(fmt, n, seed, conversational=conversational)
        if fmt in ("preference", "unpaired", "prompt")
        else dataset_rows(fmt, n, seed)
    )
    nested = sorted({k for row in rows for k, v in row.items() if isinstance(v, (list, dict))})
    if suffix == ".csv" and nested:
        raise ValueError(
            f"{p.name}: {fmt} rows hold lists ({', '.join(nested)}), which a CSV cannot; write .jsonl, or a "
            "flat format (alpaca, text; preference formats with conversational=False)"
        )
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        elif suffix == ".json":
            json.dump(rows, f)
        else:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return p


# Common words, a line of the tokenizer's training text beside the sums.
WORD_LINE = "the a of to and in is it you that he was for on are with as I his they be at one have this"
WORDS = WORD_LINE.split()


def _corpus() -> list[str]:
    lines = []
    for q, a in addition_items(2000, seed=1):
        lines.append(f"<|user|>\n{q}<|end|>\n<|assistant|>\n{a}<|end|>\n")
    lines += [WORD_LINE] * 20
    return lines


def train_bpe(special_tokens: list[str], vocab_size: int, lines: list[str]) -> Any:
    """A byte-level BPE (``tokenizers``) trained on ``lines``, with ``special_tokens`` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def make_tiny_model(
    path: str | Path, *, vocab_size: int = 1000, hidden_size: int = 64, num_layers: int = 2, seed: int = 0
) -> Path:
    """Build and save the tiny Llama + tokenizer at ``path``; returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(SPECIAL_TOKENS, vocab_size, _corpus()),
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|end|>",
        unk_token=None,
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nbtrain.examples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model", help="build the tiny model")
    m.add_argument("dir")
    d = sub.add_parser("data", help="write the addition dataset")
    d.add_argument("file")
    d.add_argument(
        "--format",
        default="messages",
        choices=["messages", "alpaca", "sharegpt", "text", "preference", "unpaired", "prompt"],
    )
    d.add_argument("-n", type=int, default=400)
    d.add_argument("--plain", action="store_true", help="preference formats: strings, not messages")
    args = ap.parse_args(argv)
    if args.what == "model":
        print(make_tiny_model(args.dir))
    else:
        print(write_dataset(args.file, args.format, args.n, conversational=not args.plain))
    return 0
