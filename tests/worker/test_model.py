"""nbtrain.worker.model: how a run's model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.worker.model import load_model


@pytest.mark.parametrize(
    ("plan_attn", "args", "want"),
    [
        ("eager", {}, "eager"),  # the plan's choice (flash_attention_2 on a GPU that has it)
        ("eager", {"model_init_kwargs": {"attn_implementation": "sdpa"}}, "sdpa"),  # the run's own wins
        (None, {}, "sdpa"),  # neither: transformers' default
    ],
)
def test_the_model_loads_with_the_attention_kernel_asked_for(
    tiny_model: Path, plan_attn: str | None, args: dict[str, object], want: str
) -> None:
    cfg = {"method": "lora", "model": str(tiny_model), "trust_remote_code": False,
           "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "auto"}}  # fmt: skip
    plan = {"device": "cpu", "precision": "fp32", "attn_implementation": plan_attn}
    model = load_model(cfg, plan, args, attach_lora=False)
    assert model.config._attn_implementation == want
