"""Rendering a data preview: masked vs trained text in HTML and plain text, statistics, histogram."""

from __future__ import annotations

from typing import Any

from nbtrain.ui.preview import CLIP, length_histogram, preview_html, preview_text, segments_html


def shown(**overrides: Any) -> dict[str, Any]:
    lengths = [12, 30, 30, 90]
    data: dict[str, Any] = {
        "format": "messages",
        "sources": ["a.jsonl (messages, weight 2)", "b.jsonl (alpaca, weight 1)"],
        "streaming": False,
        "assistant_only_loss": True,
        "completion_only_loss": False,
        "packing": False,
        "packing_strategy": None,
        "max_length": 64,
        "chat_template": "the model's",
        "examples": [
            {
                "index": 1,
                "tokens": 90,
                "trained": 20,
                "cut": 26,
                "segments": [("<|user|>\nIs 1 < 2?<|end|>\n<|assistant|>\n", False), ("yes <b>", True)],
            }
        ],
        "stats": {
            "rows": 4,
            "rows_limit": 2000,
            "min": 12,
            "p50": 30,
            "p95": 90,
            "max": 90,
            "mean": 40.5,
            "tokens": 162,
            "trained_tokens": 81,
            "over_max_length": 1,
        },
        "lengths": lengths,
    }
    data.update(overrides)
    return data


def test_html_greys_and_strikes_masked_text_and_highlights_trained_text_escaped() -> None:
    out = preview_html(shown())
    assert "<mark>yes &lt;b&gt;</mark>" in out
    assert "<span class='nbtrain-masked' style='color:#9e9e9e;text-decoration:line-through'>" in out
    assert "&lt;|user|&gt;\nIs 1 &lt; 2?" in out and "<b>example 1</b>" in out
    assert "90 tokens, 20 trained, 26 cut by max_length" in out
    assert "1 of 4 exceed max_length 64 and are truncated" in out and "50% of tokens trained" in out
    assert "sources: a.jsonl (messages, weight 2), b.jsonl (alpaca, weight 1)" in out


def test_plain_text_marks_masked_spans_and_says_what_the_loss_covers() -> None:
    out = preview_text(shown())
    assert "‹<|user|>\nIs 1 < 2?<|end|>\n<|assistant|>\n›yes <b>" in out
    assert "loss on assistant turns only" in out
    assert "min 12, p50 30, p95 90, max 90, mean 40.5" in out and "(all 4 rows)" in out
    everything = preview_text(shown(assistant_only_loss=False, max_length=None))
    assert "loss on every token (set train: assistant_only_loss: true" in everything
    assert "max_length: none (no truncation)" in everything


def test_packing_and_a_long_example_are_described_and_clipped() -> None:
    long = [("x" * (CLIP * 2), True)]
    data = shown(packing=True, packing_strategy="bfd")
    data["examples"][0]["segments"] = long
    out = preview_text(data)
    assert (
        "packing: bfd into sequences of 64 tokens" in out and "exceed max_length 64 and are truncated" in out
    )
    split = preview_text(shown(packing=True, packing_strategy="bfd_split"))
    assert "are split across packed sequences" in split
    assert max(len(line) for line in out.splitlines()) <= CLIP


def test_segments_without_marking_are_plain_escaped_text() -> None:
    assert segments_html([("a<", False), ("b", True)], mark=False) == "a&lt;b"


def test_histogram_counts_every_measured_example_and_marks_max_length() -> None:
    fig = length_histogram(shown())
    assert list(fig.data[0].x) == [12, 30, 30, 90]
    assert any(s.x0 == 64 for s in fig.layout.shapes)
    assert "4 rows" in fig.layout.title.text


def test_equal_lengths_make_one_visible_bar_not_a_sliver_by_a_far_max_length() -> None:
    data = shown(lengths=[18] * 40, max_length=1024)
    data["stats"]["rows"] = 40
    fig = length_histogram(data)
    lo, hi = fig.layout.xaxis.range
    assert lo < 18 < hi and hi - lo < 20  # the axis is the data's, not 0..1024
    assert fig.data[0].xbins.size >= 1
    assert not fig.layout.shapes and "max_length 1024" in fig.layout.annotations[0].text
    # a max_length near the data is drawn as a line
    near = length_histogram(shown())
    assert any(s.x0 == 64 for s in near.layout.shapes) and near.layout.xaxis.range[1] > 90
