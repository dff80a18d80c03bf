"""What a failed run says it failed on: the cause in words and the file involved, for status.json.

Library errors often leave out what the user needs to act: safetensors' ``SafetensorError: Error while
deserializing header: incomplete metadata, file not fully covered`` names no file, and a model folder
holds several. The file is found where the error happened: an ``OSError``'s own ``filename``, else a
local variable named like a file (``file``, ``filename``, ``resolved_archive_file``, ...) in the
innermost frames of the traceback that holds an existing file's path. The message then says which file
and, for the errors whose cause is known (a damaged weights file, a config file that is not JSON), what
is wrong with it, keeping the library's own words in it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType

# Local names that hold the file being read, most telling first (other locals are not looked at: a path
# that merely sits in a frame would name the wrong file).
_FILE_NAMES = (
    "file",
    "filename",
    "file_path",
    "filepath",
    "path",
    "checkpoint_file",
    "resolved_archive_file",
    "archive_file",
    "shard_file",
    "json_file",
    "config_file",
    "weights_file",
)
_FRAMES = 6  # how many of the innermost frames are looked at: the cause is near where it was raised


def _existing_file(value: object) -> str | None:
    if isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
        try:
            path = os.fspath(value)
            if path and len(path) < 4096 and os.path.isfile(path):
                return str(Path(path).resolve())
        except (OSError, TypeError, ValueError):
            return None
    return None


def _frames(tb: TracebackType | None) -> list[TracebackType]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out[::-1][:_FRAMES]  # innermost first


def failed_file(e: BaseException) -> str | None:
    """The file ``e`` happened on, when it can be told: an OSError's filename, else a path-valued local of
    the innermost frames (of ``e`` or the error it was raised from)."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.filename is not None:
            found = _existing_file(err.filename)
            if found:
                return found
        for tb in _frames(err.__traceback__):
            local = tb.tb_frame.f_locals
            for value in (local[n] for n in _FILE_NAMES if n in local):
                found = _existing_file(value)
                if found:
                    return found
        err = err.__cause__ or err.__context__
    return None


def _known(e: BaseException, text: str, file: str | None) -> str | None:
    """The message for the errors whose cause is known (naming the file when found); None otherwise."""
    kind, module = type(e).__name__, type(e).__module__ or ""
    where = f" {file}" if file else ""
    if kind == "SafetensorError" or module.startswith("safetensors"):
        return (
            f"the weights file{where} is damaged or incomplete ({text}); this is often an interrupted "
            f"download or copy: download or save the model again"
        )
    if isinstance(e, json.JSONDecodeError) and file:
        return f"{file} is not valid JSON ({text}): it is damaged, or not the file it should be; replace it"
    if isinstance(e, UnicodeDecodeError) and file:
        return f"{file} is not UTF-8 text ({text}): it is damaged, or not the file it should be; replace it"
    return None


def failure_message(e: BaseException) -> tuple[str, str | None]:
    """The run's error message for ``e`` (what is wrong and with which file, the library's words in it)
    and that file, if one was found."""
    text = str(e) or type(e).__name__
    file = failed_file(e)
    known = _known(e, text, file)
    if known:
        return known, file
    if file and file not in text and Path(file).name not in text:
        return f"{text} (while reading {file})", file
    return text, file


__all__ = ["failed_file", "failure_message"]
