"""The panel's quick preview of image rows: each row's pictures as thumbnails, its image parts where they
go, and the chat template's rendering, all in the kernel (Pillow only)."""

from __future__ import annotations

from pathlib import Path

from nbtrain.ui.panel import data_preview, preview_html


def test_the_quick_preview_shows_image_rows_with_their_pictures(vision_workdir: Path) -> None:
    cfg = {
        "model": "tiny-llava",
        "data": {"train": "data/colours.jsonl"},
        "train": {"assistant_only_loss": True},
    }
    p = data_preview(cfg, vision_workdir, 2)
    assert [r.error for r in p.rows] == [None, None]
    assert all(
        len(r.thumbnails) == 1 and r.thumbnails[0].startswith("data:image/png;base64,") for r in p.rows
    )
    assert p.rows[0].segments is not None and "<image>" in "".join(t for t, _ in p.rows[0].segments)
    html = preview_html(p)
    assert html.count("<img src='data:image/png;base64,") == 2 and ">image</span>What colour is this?" in html
