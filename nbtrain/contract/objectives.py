"""Training objectives: what ``objective:`` may say, and what each one needs (stdlib only).

``objective:`` is *what* is optimised (supervised fine-tuning, a preference loss, a reward model, online
RL from reward functions or a reward model); ``method:`` is *which weights* train (full, LoRA, QLoRA). The
two are orthogonal: every
available objective runs with every method. This table is shared by the kernel (validation, data
checks) and the worker (which TRL config and trainer to build), so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    name: str
    config_class: str  # "module:Class" of the TRL config whose fields train: takes
    trainer_class: str  # "module:Class" of the TRL trainer
    formats: tuple[str, ...]  # data formats it trains on, the first one preferred by format: auto
    summary: str
    rewards: bool = False  # online RL: learns from ``rewards:`` (functions, built-ins, reward models)
    # peft's task type, which is also the model's head: CAUSAL_LM generates text; SEQ_CLS is a sequence
    # classifier with one output, a reward model (AutoModelForSequenceClassification, num_labels=1)
    task: str = "CAUSAL_LM"


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "sft",
            "trl:SFTConfig",
            "trl:SFTTrainer",
            ("messages", "alpaca", "sharegpt", "text"),
            "supervised fine-tuning on demonstrations",
        ),
        Objective(
            "dpo",
            "trl:DPOConfig",
            "trl:DPOTrainer",
            ("preference",),
            "Direct Preference Optimization on chosen/rejected pairs",
        ),
        Objective(
            # ORPO lives in trl.experimental in TRL 1.x: reference-free, so no second model in memory.
            "orpo",
            "trl.experimental.orpo:ORPOConfig",
            "trl.experimental.orpo:ORPOTrainer",
            ("preference",),
            "Odds-Ratio Preference Optimization (SFT + preference in one loss, no reference model)",
        ),
        Objective(
            # KTOTrainer unpairs chosen/rejected data itself, so paired preference rows work too.
            "kto",
            "trl:KTOConfig",
            "trl:KTOTrainer",
            ("unpaired", "preference"),
            "Kahneman-Tversky Optimization on completions labelled good or bad",
        ),
        Objective(
            # A reward model for grpo / rloo (rewards: [{model: <this run>}]); eval pairs measure accuracy.
            "reward",
            "trl:RewardConfig",
            "trl:RewardTrainer",
            ("preference",),
            "a reward model that learns to score the chosen answer above the rejected one",
            task="SEQ_CLS",
        ),
        Objective(
            "grpo",
            "trl:GRPOConfig",
            "trl:GRPOTrainer",
            ("prompt",),
            "Group Relative Policy Optimization: online RL from reward functions or a reward model",
            rewards=True,
        ),
        Objective(
            "rloo",
            "trl:RLOOConfig",
            "trl:RLOOTrainer",
            ("prompt",),
            "REINFORCE Leave-One-Out: online RL from reward functions or a reward model",
            rewards=True,
        ),
    )
}

# Objectives a user may name that the installed TRL cannot run, with the reason and the alternative.
UNAVAILABLE: dict[str, str] = {
    "ppo": (
        "TRL 1.x replaced PPOTrainer with RLOO and GRPO (it is neither in trl nor in trl.experimental). "
        "RLHF with a reward model is two cells: 1) objective: reward on chosen/rejected pairs trains the "
        "reward model (its eval split reports pairwise accuracy); 2) objective: rloo (or grpo) on prompts "
        "with rewards: [{model: <that run's id or folder>}] trains the policy against it, no value model "
        "needed. For offline preference data alone, objective: dpo / kto"
    ),
}

OBJECTIVE_NAMES = (*OBJECTIVES, *UNAVAILABLE)


def rewards_objectives() -> tuple[str, ...]:
    """The objectives that take ``rewards:`` (online RL)."""
    return tuple(name for name, o in OBJECTIVES.items() if o.rewards)


def objective(name: str) -> Objective:
    """The objective called ``name``; KeyError for unavailable or unknown names."""
    return OBJECTIVES[name]


# --- SFT's loss path: shared by the worker (worker/recipes/sft.py picks it) and the estimator
# (control/memory counts what it keeps), so the two cannot disagree.
#
# A batch whose float32 logits are at most this many bytes is scored whole (the model's own loss, the
# logits built); a bigger one goes through TRL's fused LM head, which never builds them. On a CPU, RAM is
# plenty and the fused head is the slower path at any vocabulary (SmolLM2, vocab 49,152, 8 x ~60 tokens,
# 94 MB of logits: ~3.2-3.6 s a step against 3.6-4.1 s, 2 cores); on an accelerator its tiles keep the
# memory down, so only small batches are scored whole there.
SFT_FULL_LOGITS_BYTES = {"cpu": 2**30}
SFT_FULL_LOGITS_BYTES_ELSEWHERE = 64 * 2**20
# The fused head's tile (trl/kernels/chunked_logprob.py): TOKEN_CHUNK_SIZE positions x up to the
# ``chunk_size`` TRL passes (_CHUNKED_LOGPROB_CHUNK_SIZE) vocabulary columns, in float32.
FUSED_HEAD_TILE_TOKENS = 4096
FUSED_HEAD_TILE_VOCAB = 32768


def sft_full_logits(tokens: int, vocab: int, device: str) -> bool:
    """Whether an SFT batch of ``tokens`` positions is scored with its whole logits on ``device`` (a torch
    device type: "cpu", "cuda", ...) rather than through TRL's fused LM head."""
    cap = SFT_FULL_LOGITS_BYTES.get(device, SFT_FULL_LOGITS_BYTES_ELSEWHERE)
    return tokens * vocab * 4 <= cap


# --- SFT's padding-free batches: shared by the planner (which model types, the reason) and the worker
# (worker/data.PaddingFreeWhereCheaper decides batch by batch).
#
# Text decoders whose attention keeps rows laid end to end in one sequence apart when the batch carries
# position_ids and no attention mask (transformers' masking_utils finds the packed rows from the restarts
# in position_ids; flash-attention 2 takes their boundaries). Each is checked by
# tests/contract/test_objectives.py: a batch's loss flattened equals its loss padded.
PACKED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "granite", "olmo", "olmo2", "phi", "phi3", "smollm3", "starcoder2", "cohere", "gpt2", "gpt_neox",
)  # fmt: skip
# How much more memory a flattened batch's dense attention (SDPA or eager: one T x T block-diagonal mask
# over the whole sequence) may keep than the padded batch's, over all layers.
PADDING_FREE_EXTRA_ATTENTION_BYTES = 256 * 2**20


def padding_free_bins(
    lengths: list[int], *, layer_params: int, attention_width: int, heads: int, layers: int, varlen: bool
) -> list[list[int]] | None:
    """How a batch of rows of these ``lengths`` (tokens) costs least: laid end to end in ``k`` sequences
    (the rows' indices of each; no padding inside a sequence, the shorter sequences padded to the longest),
    or None: padded, one row a sequence, as usual. For a decoder whose layers each multiply by
    ``layer_params`` weights and attend over ``heads`` heads ``attention_width`` wide (heads x head_dim).

    Per layer and forward pass (backward is about twice both): the weights cost 2 x params FLOPs a
    position, the attention 4 x attention_width a query-key pair. Padded, every row pays for the longest's
    positions and pairs (B x L^2). Laid end to end, an attention that takes a mask (SDPA, eager) scores
    every pair of each sequence (S^2 for S tokens), so one sequence of many rows trades the padding for
    more pairs; ``k`` sequences of about T/k tokens each keep both small. The rows are dealt longest first
    to the sequence with the fewest tokens, and the k of the lowest cost is taken. Flash-attention 2
    (``varlen``) scores each row's own pairs only: one sequence, never more than padded. The dense kernels'
    extra scores are also bounded in memory (PADDING_FREE_EXTRA_ATTENTION_BYTES, float32)."""
    n = len(lengths)
    if n < 2:
        return None
    longest = max(lengths)
    padded_pairs = n * longest * longest
    padded = 2 * layer_params * n * longest + 4 * attention_width * padded_pairs
    if varlen:
        flat = 2 * layer_params * sum(lengths) + 4 * attention_width * sum(x * x for x in lengths)
        return [list(range(n))] if flat < padded else None
    best: tuple[float, list[list[int]]] | None = None
    order = sorted(range(n), key=lambda i: -lengths[i])
    for k in range(1, n):
        bins: list[list[int]] = [[] for _ in range(k)]
        totals = [0] * k
        for i in order:
            j = totals.index(min(totals))
            bins[j].append(i)
            totals[j] += lengths[i]
        width = max(totals)
        pairs = k * width * width
        cost = 2 * layer_params * k * width + 4 * attention_width * pairs
        extra = max(0, pairs - padded_pairs) * heads * 4 * layers
        if cost < padded and extra <= PADDING_FREE_EXTRA_ATTENTION_BYTES and (best is None or cost < best[0]):
            best = (cost, [sorted(b) for b in bins])
    return None if best is None else best[1]
