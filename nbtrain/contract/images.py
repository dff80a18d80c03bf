"""Images in training rows (stdlib only): where a row's images are, and the shape a vision-language trainer
takes.

A row names its images in any of these ways (mixed text-only rows are allowed):

- content parts of a message: ``{"type": "image", "path" | "url" | "image" | "base64": ...}`` or OpenAI's
  ``{"type": "image_url", "image_url": {"url": ...}}``, beside ``{"type": "text", "text": ...}`` parts;
- TRL's layout: an ``images`` column (or ``image``: one) and ``{"type": "image"}`` parts, or ``<image>``
  placeholders in the text (LLaMA-Factory's), filled in order; with no placeholder at all the images go
  before the first user turn's text (alpaca + an image column);
- a Hub dataset's ``Image`` feature: the column holds ``{"bytes", "path"}`` (or decoded images).

An image reference is a path (relative to the data file), an http(s) URL, a ``data:`` URI or bare base64,
or what ``datasets`` holds for an image. ``flatten`` turns a row into the text formats' shape with
``<image>`` where each image goes (so every text format's own checks apply unchanged); ``to_parts`` turns
the normalised example back into TRL's vision layout: ``{"messages": [{"role", "content": [{"type":
"text", "text"} | {"type": "image"}]}], "images": [ref, ...]}``.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = "<image>"
# The most pixels an image may have, read from its header before it is decoded (a small compressed file
# can hold a huge picture: a 187 KB PNG of 12000 x 12000 decodes to 432 MB); and the most one request to
# the model server may carry in all. 50 megapixels is a large camera's photo.
MAX_IMAGE_PIXELS = 50_000_000
MAX_REQUEST_PIXELS = 100_000_000
IMAGE_COLUMNS = ("images", "image")
_INLINE_KEYS = ("path", "url", "image", "base64")
_MESSAGE_KEYS = ("messages", "conversations", "prompt", "chosen", "rejected", "completion")


class ImageRowError(ValueError):
    """The images of a row do not add up; the message says how."""


def _inline_ref(part: Mapping[str, Any]) -> Any:
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, Mapping) else url
    for key in _INLINE_KEYS:
        if part.get(key) is not None:
            value = part[key]
            return f"data:image;base64,{value}" if key == "base64" and isinstance(value, str) else value
    return None


def _flatten_content(content: Any, slots: list[Any], where: str) -> Any:
    """A message's content as text with ``<image>`` per image part; inline references go to ``slots``
    (None for a part that takes the next image of the row's images column)."""
    if isinstance(content, str):
        slots.extend([None] * content.count(PLACEHOLDER))
        return content
    if not isinstance(content, list):
        return content  # the text format's check names the problem
    text = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, Mapping) or "type" not in part:
            raise ImageRowError(f"{where}[{i}] must be a {{type: text | image, ...}} part")
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ImageRowError(f"{where}[{i}] is a text part without a 'text' string")
            slots.extend([None] * part["text"].count(PLACEHOLDER))
            text.append(part["text"])
        elif kind in ("image", "image_url"):
            slots.append(_inline_ref(part))
            text.append(PLACEHOLDER)
        else:
            raise ImageRowError(f"{where}[{i}] has type {kind!r}; parts are text or image")
    return "".join(text)


def flatten(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any], int]:
    """(the row with every message's content as text, its image references in order, how many go before
    the first user turn because the row has no placeholder for them)."""
    out = dict(row)
    slots: list[Any] = []
    for key in _MESSAGE_KEYS:
        turns = row.get(key)
        if not isinstance(turns, list):
            continue
        flat = []
        for i, turn in enumerate(turns):
            if isinstance(turn, Mapping):
                field = "value" if "value" in turn and "content" not in turn else "content"
                if field in turn:
                    turn = {**turn, field: _flatten_content(turn[field], slots, f"{key}[{i}].{field}")}
            flat.append(turn)
        out[key] = flat
    for key in ("instruction", "input", "text"):
        if isinstance(row.get(key), str):
            slots.extend([None] * row[key].count(PLACEHOLDER))
    column = _image_column(row)
    for key in IMAGE_COLUMNS:
        out.pop(key, None)
    open_slots = [i for i, ref in enumerate(slots) if ref is None]
    if not column:
        if open_slots and any(ref is not None for ref in slots):
            raise ImageRowError(
                f"it has {len(open_slots)} {PLACEHOLDER} place(s) without an image and no 'images' column "
                f"to fill them"
            )
        return out, [ref for ref in slots if ref is not None], 0
    if not open_slots:
        return out, [*column, *(ref for ref in slots if ref is not None)], len(column)
    if len(open_slots) != len(column):
        raise ImageRowError(
            f"it has {len(column)} image(s) in its images column but {len(open_slots)} {PLACEHOLDER} "
            f"place(s) for them; give one place per image (or none: they then go before the first user "
            f"turn)"
        )
    for slot, ref in zip(open_slots, column, strict=True):
        slots[slot] = ref
    return out, slots, 0


def _image_column(row: Mapping[str, Any]) -> list[Any]:
    for key in IMAGE_COLUMNS:
        value = row.get(key)
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        return [v for v in items if v is not None]
    return []


def has_images(row: Mapping[str, Any]) -> bool:
    """Whether a raw row names at least one image (any of the ways above)."""
    if _image_column(row):
        return True
    for key in _MESSAGE_KEYS:
        turns = row.get(key)
        if isinstance(turns, list):
            for turn in turns:
                content = turn.get("content") if isinstance(turn, Mapping) else None
                if isinstance(content, list) and any(
                    isinstance(p, Mapping) and p.get("type") in ("image", "image_url") for p in content
                ):
                    return True
    return False


def to_parts(example: Mapping[str, Any], images: list[Any], leading: int) -> dict[str, Any]:
    """A normalised example (``messages``, or preference ``prompt``/``chosen``/``rejected``; contents as
    text with ``<image>``) in TRL's vision layout: every turn's content as parts, a plain-string prompt or
    answer as one user or assistant turn; the first ``leading`` images go before the first user turn's
    text."""
    out: dict[str, Any] = {k: v for k, v in example.items() if k not in _MESSAGE_KEYS}
    for key in _MESSAGE_KEYS:
        if key not in example:
            continue
        turns = example[key]
        if isinstance(turns, str):  # a preference row's plain strings
            turns = [{"role": "user" if key == "prompt" else "assistant", "content": turns}]
        out[key] = [{"role": m["role"], "content": _parts(str(m["content"]))} for m in turns]
        if leading and key in ("messages", "prompt"):
            first_user = next((m for m in out[key] if m["role"] == "user"), None)
            if first_user is None:
                raise ImageRowError("it has images but no user turn to show them in")
            first_user["content"][:0] = [{"type": "image", "text": None}] * leading
            leading = 0
    out["images"] = list(images)
    return out


def _parts(text: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for j, piece in enumerate(text.split(PLACEHOLDER)):
        if j:
            parts.append({"type": "image", "text": None})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def too_many_pixels(width: int, height: int) -> str | None:
    """What is wrong with an image of ``width`` x ``height`` (read from its header, before it is decoded):
    more than MAX_IMAGE_PIXELS, the one limit of the kernel's check and the worker; None when within it."""
    if width * height <= MAX_IMAGE_PIXELS:
        return None
    return f"is {width} x {height} pixels, over {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels"


def _credentials(url: str) -> list[str]:
    """The secrets an http(s) URL carries before its host (``http://user:secret@host/``): the user name
    and password together, and the password (or a lone user name, which is often a token); longest first."""
    if not url.startswith(("http://", "https://")):
        return []
    authority = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    userinfo, at, _ = authority.rpartition("@")
    if not at or not userinfo:
        return []
    user, colon, password = userinfo.partition(":")
    return sorted({s for s in (userinfo, password if colon else user) if s}, key=len, reverse=True)


def hide_credentials(text: str, url: str) -> str:
    """``text`` (a message, an error from a library about ``url``) with the user name and password that
    ``url`` carries replaced by ``***``: they are never echoed in an error or a log line."""
    for secret in _credentials(url):
        text = text.replace(secret, "***")
    return text


def describe(ref: Any) -> str:
    """A short name of an image reference for a message: the path or URL (a URL's user name and password
    masked), or what kind of data it is."""
    if isinstance(ref, str):
        ref = hide_credentials(ref, ref)
        return ref if not ref.startswith("data:") and len(ref) < 300 else f"{ref[:40]}... (inline data)"
    if isinstance(ref, Mapping):
        return str(ref.get("path") or "image bytes")
    return type(ref).__name__


def image_source(ref: Any, base: str | os.PathLike[str] | None) -> tuple[str, Any]:
    """Where an image reference's bytes are: ("path", absolute path), ("url", URL), ("bytes", data) or
    ("object", a decoded image); ImageRowError for one that is none of these."""
    if isinstance(ref, Mapping):
        if ref.get("bytes") is not None:
            return "bytes", ref["bytes"]
        if ref.get("path"):
            return image_source(str(ref["path"]), base)
        raise ImageRowError("an image entry has neither bytes nor a path")
    if not isinstance(ref, str):
        return "object", ref
    if ref.startswith(("http://", "https://")):
        return "url", ref
    if ref.startswith("data:"):
        head, _, data = ref.partition(",")
        if ";base64" not in head:
            raise ImageRowError(f"the data URI {describe(ref)} is not base64")
        return "bytes", _b64(data, ref)
    if ref.startswith("file://"):
        ref = ref[len("file://") :]
    if len(ref) > 512 and "/" not in ref[:64]:  # bare base64 (no data: prefix)
        return "bytes", _b64(ref, ref)
    path = os.path.expanduser(ref)
    if base is not None and not os.path.isabs(path):
        path = os.path.join(base, path)
    return "path", os.path.abspath(path)


# Hosts whose image URLs are fetched although they are not public (loopback, the local network): a
# comma-separated list of host names or addresses as the URLs write them, or "*" for any.
ENV_IMAGE_HOSTS = "NBTRAIN_IMAGE_HOSTS"


def url_problem(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why nbtrain will not fetch the image at ``url``, or None: an http(s) URL whose host resolves to
    public addresses only. A data file written elsewhere must not make a run read this machine's or its
    network's services: loopback, private, link-local (a cloud's metadata service, 169.254.169.254),
    multicast and reserved addresses are refused unless the host is listed in NBTRAIN_IMAGE_HOSTS. Checked
    in the kernel for the rows it samples, and by the worker before each fetch and each redirect."""
    import ipaddress
    import socket
    import urllib.parse

    env = os.environ if env is None else env
    fix = (
        f"download the image and give its path, or, if you trust that host, list it in {ENV_IMAGE_HOSTS} "
        f"(comma-separated, or * for any)"
    )
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return f"is not a valid URL ({e}); {fix}"
    if parts.scheme not in ("http", "https"):
        return f"is a {parts.scheme}: URL; images are fetched over http(s) only"
    host = (parts.hostname or "").lower()
    if not host:
        return f"names no host; {fix}"
    allowed = {h.strip().lower().strip("[]") for h in env.get(ENV_IMAGE_HOSTS, "").split(",") if h.strip()}
    if "*" in allowed or host in allowed:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        return f"names a host that does not resolve here ({host}: {e}); {fix}"
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not ip.is_global or ip.is_multicast:
            kind = (
                "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else
                "private" if ip.is_private else "non-public"
            )  # fmt: skip
            where = f"points at {host} ({ip}), a {kind} address"
            return f"{where}, and nbtrain fetches images from public hosts only; {fix}"
    return None


def _b64(data: str, ref: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRowError(f"the image {describe(ref)} is not valid base64") from None
