"""The memory guard's message when it stops a run: whose memory it is and what fits the run's method."""

from __future__ import annotations

import os

from nbtrain.worker.oom import Holder, Holders, holders, message

GIB = 2**30


def _busy() -> Holders:
    """A LoRA run of 2 GiB on a machine where others hold 21 GiB and nbtrain's warm processes 1.5 GiB."""
    return Holders(
        run=2 * GIB,
        others=[Holder(10, "java", 12 * GIB), Holder(11, "chromium", 6 * GIB), Holder(12, "python3", 2 * GIB),
                Holder(13, "bash", GIB)],
        warm=[Holder(20, "python", GIB), Holder(21, "python", GIB // 2)],
    )  # fmt: skip


def test_a_lora_run_stopped_on_a_busy_machine_is_told_whose_memory_it_is_and_never_to_use_lora() -> None:
    text = message(11, 300 * 2**20, 31 * GIB, _busy(), {"method": "lora", "device": "cpu"}, "lab6")
    assert "at step 11 only 300 MiB of 31.0 GiB were left" in text
    assert "Whose memory (RSS): this run 2.0 GiB; other processes 21.0 GiB" in text
    assert (
        "(the largest: java (pid 10) 12.0 GiB, chromium (pid 11) 6.0 GiB, python3 (pid 12) 2.0 GiB)" in text
    )
    assert "bash" not in text  # the three largest are named
    assert "nbtrain's idle warm processes 1.5 GiB (2 processes: %finetune warm stop frees them" in text
    assert "Most of it is not this run's" in text and "%finetune resume lab6" in text
    assert "checkpoint_minutes" in text
    assert "per_device_train_batch_size or max_length" in text and "gradient_checkpointing: true" in text
    assert "lora" not in text.replace("lab6", "").split("Or make the run smaller")[1]
    assert "qlora" not in text  # not on a CPU


def test_a_run_holding_most_memory_itself_is_told_to_shrink_in_the_way_its_method_allows() -> None:
    alone = Holders(run=20 * GIB, others=[Holder(10, "bash", GIB)])
    full = message(3, 0, 31 * GIB, alone, {"method": "full", "device": "cpu"})
    assert "This run holds most of it: use method: lora" in full and "qlora" not in full
    assert "warm processes" not in full  # none here
    on_gpu = message(3, 0, 31 * GIB, alone, {"method": "full", "device": "cuda"})
    assert (
        "use method: lora (a small adapter is trained, not every weight with its optimizer states) or qlora"
        in on_gpu
    )
    lora_gpu = message(
        3, 0, 31 * GIB, alone, {"method": "lora", "device": "cuda", "gradient_checkpointing": True}
    )
    assert "lower train: per_device_train_batch_size or max_length or use method: qlora" in lora_gpu
    assert "gradient_checkpointing" not in lora_gpu  # already on
    qlora = message(3, 0, 31 * GIB, alone, {"method": "qlora", "device": "cuda"})
    assert "method:" not in qlora and "gradient_checkpointing: true" in qlora


def test_holders_counts_this_process_group_as_the_run_and_lists_the_others_largest_first() -> None:
    who = holders()
    assert who.run > 0  # this test's own process is in its group
    assert all(h.pid != os.getpid() for h in who.others + who.warm)
    sizes = [h.rss for h in who.others]
    assert sizes == sorted(sizes, reverse=True)
