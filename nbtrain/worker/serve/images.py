"""The images of a chat request (a vision-language run's ``image_url`` parts): data: URIs or file: URLs,
each bounded in bytes and pixels before Pillow decodes it, and the parts as the processor's chat template
takes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbtrain.contract.images import MAX_IMAGE_PIXELS, MAX_REQUEST_PIXELS
from nbtrain.worker.serve.request import RequestError

# The most images one request may carry, and the most bytes of each.
MAX_IMAGES = 16
MAX_IMAGE_BYTES = 32 * 2**20


def request_image(url: Any, where: str, pixels_left: int = MAX_REQUEST_PIXELS) -> Any:
    """The image of an ``image_url`` part: a ``data:`` URI (base64) or a ``file:`` URL / path of a regular
    file on this machine, decoded with Pillow once its header says it has at most MAX_IMAGE_PIXELS (and at
    most ``pixels_left``, what the request's earlier images left); RequestError naming the part otherwise."""
    import io
    import stat

    from PIL import Image

    from nbtrain.contract.images import ImageRowError, describe, image_source

    if not isinstance(url, str) or not url:
        raise RequestError(f"{where} needs image_url.url: a data: URI or a file: URL", "messages")
    try:
        kind, value = image_source(url, None)
    except ImageRowError as e:
        raise RequestError(f"{where}: {e}", "messages") from None
    if kind == "url":
        raise RequestError(
            f"{where}: give the image as a data: URI or a file: URL, not {describe(url)[:80]}", "messages"
        )
    too_big = f"{where}: the image is over {MAX_IMAGE_BYTES // 2**20} MiB"
    try:
        if kind == "path":
            st = Path(value).stat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would hold the handler for ever
                raise RequestError(f"{where}: {value} is not a regular file", "messages")
            if st.st_size > MAX_IMAGE_BYTES:
                raise RequestError(too_big, "messages")
            source: Any = value
        else:
            if len(value) > MAX_IMAGE_BYTES:
                raise RequestError(too_big, "messages")
            source = io.BytesIO(value)
        with Image.open(source) as im:  # reads the header only
            pixels = im.width * im.height
            if pixels > min(MAX_IMAGE_PIXELS, pixels_left):
                most = min(MAX_IMAGE_PIXELS, pixels_left)
                which = "per image" if most == MAX_IMAGE_PIXELS else "left for this request"
                raise RequestError(
                    f"{where}: the image is {im.width} x {im.height} ({pixels / 1e6:.0f} megapixels); at "
                    f"most {most / 1e6:.0f} megapixels {which} ({MAX_REQUEST_PIXELS / 1e6:.0f} per "
                    f"request): scale it down first",
                    "messages",
                )
            return im.convert("RGB")
    except RequestError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(f"{where}: not a readable image ({type(e).__name__}: {e})", "messages") from None


def content_parts(content: list[Any], where: str, images: list[Any]) -> list[dict[str, Any]]:
    """OpenAI content parts (text, image_url) as the processor's chat template takes them; the images
    decoded into ``images`` in order."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        here = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if len(images) >= MAX_IMAGES:
                raise RequestError(f"at most {MAX_IMAGES} images per request", "messages")
            used = sum(im.width * im.height for im in images)
            images.append(request_image(url, here, MAX_REQUEST_PIXELS - used))
            parts.append({"type": "image", "image": images[-1]})
        else:
            raise RequestError(f"{here} must be a text or image_url part", "messages")
    return parts
