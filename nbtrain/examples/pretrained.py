"""A tiny model that has learned something: what the labs and ``make demo`` fine-tune on a CPU.

``make_tiny_model`` (nbtrain.examples) has random weights: fine-tuning it shows the workflow, but its
answers stay gibberish before and after. This one is the same kind of model (a small Llama with a
byte-level BPE tokenizer and the same chat template) that nbtrain pretrained here, on a CPU, on generated
text of two kinds:

- sums written out as plain text, in several forms: ``12 + 7 = 19``, ``the sum of 12 and 7 is 19.``,
  ``12 plus 7 makes 19.``, ``add 12 and 7 and you get 19.`` (the sums of the labs' data, of the held-out
  questions below, and of more pairs: ``fact_pairs``);
- short chats about other things: repeat a few words or numbers, reverse a few words, the number after N,
  the larger of two.

So it knows the sums, and it knows how a chat goes, but it was never asked a sum in a chat: asked
"What is 12 + 7?" it answers some number. The labs' fine-tuning (``What is a + b?`` -> ``a + b = c``)
teaches it to answer, and it then answers the held-out questions (``held_out_addition``), which no
training row asks, mostly right: what it read in pretraining, fine-tuning taught it to say.

The weights ship in the package (``nbtrain/assets/tiny-adder``, 2 MB); ``nbtrain.example_model()``
copies them to a folder. ``build`` makes them again, seeded (on another machine the floats may differ in their
last bits; the config and tokenizer are the same):

    python -m nbtrain.examples.pretrained build DIR [--steps N]   # ~10 min on one CPU core
    python -m nbtrain.examples.pretrained check DIR              # what the model answers
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

from nbtrain.examples import CHAT_TEMPLATE, SPECIAL_TOKENS, addition_items

ASSET = "assets/tiny-adder"  # inside the nbtrain package
SEED = 0
N_FACTS = 1000  # the sums pretraining reads: the labs' 400, the held-out ones, more to make 1000
N_HELD_OUT = 64
WORDS = [
    "red", "blue", "green", "yellow", "black", "white", "cat", "dog", "bird", "fish", "tree", "sun", "moon",
    "star", "car", "boat", "book", "cup", "hat", "shoe",
]  # fmt: skip
# The model: 3 layers, hidden 96; about 0.52 M parameters (2 MB in float32).
SHAPE: dict[str, Any] = {"hidden_size": 96, "intermediate_size": 384, "num_hidden_layers": 3,
                         "num_attention_heads": 4, "num_key_value_heads": 4}  # fmt: skip


def _pair(question: str) -> tuple[int, int]:
    a, b = re.findall(r"\d+", question)[:2]
    return int(a), int(b)


def lab_pairs() -> list[tuple[int, int]]:
    """The (a, b) of the labs' addition data (``nbtrain/assets/add.jsonl``, ``addition_items(400)``)."""
    return [_pair(q) for q, _ in addition_items(400, seed=0)]


def held_out_pairs(n: int = N_HELD_OUT) -> list[tuple[int, int]]:
    """``n`` (at most 64) sums that no training row of the labs asks (seeded, always the same)."""
    if not 0 < n <= N_HELD_OUT:
        raise ValueError(f"there are {N_HELD_OUT} held-out sums; ask for 1 to {N_HELD_OUT}, not {n}")
    taken = set(lab_pairs())
    rng = random.Random(12345)
    out: list[tuple[int, int]] = []
    while len(out) < N_HELD_OUT:
        p = (rng.randint(0, 99), rng.randint(0, 99))
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out[:n]


def held_out_addition(n: int = 32) -> list[tuple[str, str]]:
    """(question, answer) pairs in the labs' form (``What is a + b?``, ``a + b = c``) for ``n`` sums no
    training row asks: the questions to measure accuracy on. Standard library only: kernel-safe."""
    return [(f"What is {a} + {b}?", f"{a} + {b} = {a + b}") for a, b in held_out_pairs(n)]


def fact_pairs() -> list[tuple[int, int]]:
    """Every sum pretraining reads: the labs' pairs, the held-out ones, and more up to ``N_FACTS``."""
    pairs = list(dict.fromkeys(lab_pairs() + held_out_pairs()))
    taken = set(pairs)
    rng = random.Random(SEED + 7)
    while len(pairs) < N_FACTS:
        p = (rng.randint(0, 99), rng.randint(0, 99))
        if p not in taken:
            taken.add(p)
            pairs.append(p)
    return pairs


def fact_text(a: int, b: int, form: int) -> str:
    c = a + b
    forms = (f"{a} + {b} = {c}", f"the sum of {a} and {b} is {c}.", f"{a} plus {b} makes {c}.",
             f"add {a} and {b} and you get {c}.")  # fmt: skip
    return forms[form % len(forms)] + "\n"


def _chat(question: str, answer: str) -> str:
    return f"<|user|>\n{question}<|end|>\n<|assistant|>\n{answer}<|end|>\n"  # CHAT_TEMPLATE's rendering


def chat_text(rng: random.Random) -> str:
    """One short chat about something other than sums."""
    kind = rng.randrange(5)
    words = rng.sample(WORDS, rng.randint(2, 4))
    if kind == 0:
        return _chat("Repeat after me: " + " ".join(words), " ".join(words))
    if kind == 1:
        return _chat("Reverse the words: " + " ".join(words), " ".join(reversed(words)))
    if kind == 2:
        nums = " and ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 3)))
        return _chat(f"Repeat after me: {nums}", nums)
    if kind == 3:
        n = rng.randint(0, 198)
        return _chat(f"What number comes after {n}?", str(n + 1))
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return _chat(f"Which is bigger, {a} or {b}?", str(max(a, b)))


def corpus_piece(rng: random.Random, pairs: list[tuple[int, int]]) -> str:
    """A sum in one of its plain-text forms (70%) or a chat (30%)."""
    if rng.random() < 0.7:
        a, b = rng.choice(pairs)
        return fact_text(a, b, rng.randrange(4))
    return chat_text(rng)


def corpus_text(rng: random.Random, pairs: list[tuple[int, int]]) -> str:
    """One pretraining example: 1 to 4 pieces in a row, so that a sum is read anywhere in a text (after a
    chat too), not only at its start."""
    return "".join(corpus_piece(rng, pairs) for _ in range(rng.randint(1, 4)))


def build_tokenizer() -> Any:
    """The byte-level BPE of the pretraining text, digits kept apart (so sums are read digit by digit)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(SEED)
    pairs = fact_pairs()
    lines = [corpus_text(rng, pairs) for _ in range(6000)]
    lines += [_chat(q, a) for q, a in addition_items(50, seed=3)]  # the labs' words are in the vocabulary
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="<|end|>", unk_token=None, model_max_length=512)  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(tok: Any) -> Any:
    """The model's LlamaConfig (what ``build`` trains and the shipped config.json holds)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **SHAPE,
    )


def answers(model: Any, tok: Any, prompts: list[str], max_new_tokens: int = 12) -> list[str]:
    """Greedy continuations of ``prompts`` (raw text), in one left-padded batch."""
    import torch

    side, tok.padding_side = tok.padding_side, "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    tok.padding_side = side
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
    texts: list[str] = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def check(model: Any, tok: Any, n: int = N_HELD_OUT) -> dict[str, Any]:
    """What the model knows: the held-out sums as plain text (``a + b =``, after a chat about something
    else), and as a chat question."""
    pairs = held_out_pairs(n)
    rng = random.Random(1)  # each sum read after a chat, as it is in a chat
    text = answers(model, tok, [f"{chat_text(rng)}{a} + {b} =" for a, b in pairs], 6)
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                     tokenize=False) for q, _ in held_out_addition(n)]  # fmt: skip
    chat = answers(model, tok, chats)
    right = [t.split("\n")[0].strip() == str(a + b) for t, (a, b) in zip(text, pairs, strict=True)]
    asked = [c.strip() == e for c, (_, e) in zip(chat, held_out_addition(n), strict=True)]
    return {
        "plain_text_accuracy": sum(right) / n,
        "chat_accuracy": sum(asked) / n,
        "examples": [{"prompt": f"{a} + {b} =", "answer": t, "chat": c}
                     for (a, b), t, c in list(zip(pairs, text, chat, strict=True))[:4]],
    }  # fmt: skip


def build(out: str | Path, *, steps: int = 3000, batch_size: int = 32, lr: float = 3e-3, seed: int = SEED,
          threads: int = 1, log: Any = print) -> dict[str, Any]:  # fmt: skip
    """Pretrain the model from scratch (seeded) and save it with its tokenizer at ``out``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)  # one thread: a busy shared CPU makes several spin, far slower
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_tokenizer()
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(dest)  # as built: padding in training and checks below changes its settings
    model = LlamaForCausalLM(model_config(tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    pairs = fact_pairs()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = 100

    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * max(0.05, 0.5 * (1 + math.cos(math.pi * step / steps)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    t0 = time.time()
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        texts = [corpus_text(rng, pairs) for _ in range(batch_size)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 250 == 0:
            log(f"step {step}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
    model.eval()
    report = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "final_loss": loss.item(),
              "seconds": round(time.time() - t0), "parameters": model.num_parameters(),
              **check(model, tok)}  # fmt: skip
    model.save_pretrained(dest)
    (dest / "pretraining.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.examples.pretrained", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="pretrain the model from scratch and save it")
    b.add_argument("dir")
    b.add_argument("--steps", type=int, default=3000)
    b.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("check", help="what a built model answers")
    c.add_argument("dir")
    args = ap.parse_args(argv)
    if args.what == "build":
        report = build(args.dir, steps=args.steps, threads=args.threads)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.dir)
        report = check(AutoModelForCausalLM.from_pretrained(args.dir), tok)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
