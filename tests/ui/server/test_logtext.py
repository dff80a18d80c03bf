"""The trainer's printed metrics dicts as the run page shows them (``nbtrain.ui.server.logtext``)."""

from __future__ import annotations

from nbtrain.ui.server.logtext import readable


def test_only_flat_metrics_dicts_are_rewritten() -> None:
    kept = [
        "{'loss': {'nested': 1}}",  # not the trainer's flat record
        "{'loss': 1.0",  # torn
        "{'loss': __import__('os')}",  # not a literal: never evaluated
        "a line with {'loss': 1.0} inside",
        "{}",
    ]
    assert readable("\n".join(kept)) == "\n".join(kept)
    assert readable("{'train_loss': '3.466', 'epoch': '1.2'}") == "train_loss 3.466 · epoch 1.2"
