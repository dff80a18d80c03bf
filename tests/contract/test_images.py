"""Images in training rows: every layout a user brings normalises to TRL's vision layout, and rows whose
images do not add up are refused with what to change."""

from __future__ import annotations

import base64

import pytest

from nbtrain.contract.formats import RowError, check_rows, to_example
from nbtrain.contract.images import image_source

Q = "What colour is this?"
IMAGE = {"type": "image", "text": None}


def text(s: str) -> dict[str, str]:
    return {"type": "text", "text": s}


def test_every_layout_becomes_content_parts_and_an_images_list() -> None:
    parts_with_path = {"messages": [
        {"role": "user", "content": [{"type": "image", "path": "img/1.png"}, text(Q)]},
        {"role": "assistant", "content": "red"},
    ]}  # fmt: skip
    trl = {"images": ["img/1.png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, text(Q)]},
        {"role": "assistant", "content": [text("red")]},
    ]}  # fmt: skip
    openai = {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "img/1.png"}}, text(Q)]},
        {"role": "assistant", "content": "red"},
    ]}  # fmt: skip
    alpaca = {"image": "img/1.png", "instruction": Q, "output": "red"}
    sharegpt = {"images": ["img/1.png"], "conversations": [
        {"from": "human", "value": f"<image>{Q}"}, {"from": "gpt", "value": "red"},
    ]}  # fmt: skip
    want = {
        "messages": [
            {"role": "user", "content": [IMAGE, text(Q)]},
            {"role": "assistant", "content": [text("red")]},
        ],
        "images": ["img/1.png"],
    }
    for row, fmt in ((parts_with_path, "messages"), (trl, "messages"), (openai, "messages"),
                     (alpaca, "alpaca"), (sharegpt, "sharegpt")):  # fmt: skip
        assert to_example(row, fmt, vision=True) == want, fmt
        assert to_example(row, fmt, vision=None) == want, fmt  # the kernel's check sees the images


def test_text_rows_of_a_vision_run_take_the_same_shape_and_text_parts_join_for_a_text_model() -> None:
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    assert to_example(row, "messages", vision=True) == {
        "messages": [
            {"role": "user", "content": [text("hi")]},
            {"role": "assistant", "content": [text("hello")]},
        ],
        "images": [],
    }
    parts = {
        "messages": [
            {"role": "user", "content": [text("h"), text("i")]},
            {"role": "assistant", "content": "x"},
        ]
    }
    assert to_example(parts, "messages") == {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    }


def test_placeholders_and_images_must_add_up() -> None:
    two_images_one_place = {"images": ["a.png", "b.png"], "conversations": [
        {"from": "human", "value": "<image> compare"}, {"from": "gpt", "value": "same"},
    ]}  # fmt: skip
    with pytest.raises(RowError, match=r"2 image.*but 1 <image> place"):
        to_example(two_images_one_place, "sharegpt", vision=True)
    no_place = {"images": ["a.png", "b.png"], "conversations": [
        {"from": "human", "value": "compare"}, {"from": "gpt", "value": "same"},
    ]}  # fmt: skip
    assert to_example(no_place, "sharegpt", vision=True)["messages"][0]["content"] == [
        IMAGE,
        IMAGE,
        text("compare"),
    ]
    bad_part = {
        "messages": [{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "x"}]
    }
    with pytest.raises(RowError, match="parts are text or image"):
        to_example(bad_part, "messages", vision=True)


def test_a_text_model_refuses_rows_with_images_naming_the_row() -> None:
    row = {"image": "img/1.png", "instruction": Q, "output": "red"}
    with pytest.raises(RowError, match="only a vision-language model"):
        to_example(row, "alpaca")
    fmt, problem = check_rows([(1, {"text": "plain"}), (2, {"text": "again"})], "auto")
    assert (fmt, problem) == ("text", None)
    _, problem = check_rows([(3, {"images": ["x.png"], "text": "plain <image>"})], "text")
    assert problem is not None and problem.startswith("row 3") and "cannot hold images" in problem


def test_image_references_resolve_to_paths_bytes_or_urls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    png = b"\x89PNG\r\n\x1a\n"
    assert image_source("img/1.png", tmp_path) == ("path", str(tmp_path / "img" / "1.png"))
    assert image_source("/abs/x.png", tmp_path) == ("path", "/abs/x.png")
    assert image_source("file:///abs/x.png", None) == ("path", "/abs/x.png")
    assert image_source("https://example.org/x.png", None) == ("url", "https://example.org/x.png")
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    assert image_source(uri, None) == ("bytes", png)
    assert image_source({"bytes": png, "path": None}, None) == ("bytes", png)
    with pytest.raises(ValueError, match="not valid base64"):
        image_source("data:image/png;base64,@@@", None)
