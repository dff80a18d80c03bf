"""llama.cpp's converter (``convert_hf_to_gguf.py`` / ``convert_lora_to_gguf.py`` of the pinned sdist,
kept by ``nbtrain.control.jobs.llamacpp``), run in a process of its own with its own ``gguf-py`` first on the
path (the installed ``gguf`` wheel may be older than the converter).

    python -m nbtrain.worker.jobs.gguf_convert TOOLS_DIR hf|lora ARGS...   # the script's own arguments

One change to what the script does: a BPE tokenizer whose pre-tokenizer the converter does not know by its
check hash (the hash is of token ids, so any vocabulary trained anew -- nbtrain's tiny models -- is unknown
to it) is named from what its ``tokenizer.json`` declares, where that is one llama.cpp implements:
GPT-2's byte-level regex ("gpt-2"), or single digits split off first, then GPT-2's ("starcoder"). Anything
else is refused as the converter refuses it. The export checks the result by running it: llama.cpp's
tokens for the prompts must equal the tokenizer's.
"""

from __future__ import annotations

import json
import logging
import runpy
import sys
from pathlib import Path
from typing import Any

SCRIPTS = {"hf": "convert_hf_to_gguf.py", "lora": "convert_lora_to_gguf.py"}


def _byte_level(p: Any) -> bool:
    return (
        isinstance(p, dict)
        and p.get("type") == "ByteLevel"
        and p.get("use_regex", True) is True
        and not p.get("add_prefix_space", False)
    )


def declared_pre_tokenizer(model_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer that ``model_dir/tokenizer.json`` declares, if it is one it has."""
    try:
        pre = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer")
    except (OSError, ValueError, AttributeError):
        return None
    if _byte_level(pre):
        return "gpt-2"
    if isinstance(pre, dict) and pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        if (
            len(parts) == 2
            and isinstance(parts[0], dict)
            and parts[0].get("type") == "Digits"
            and parts[0].get("individual_digits") is True
            and _byte_level(parts[1])
        ):
            return "starcoder"
    return None


def _patch_pre_tokenizer() -> None:
    from conversion.base import TextModel  # type: ignore[import-not-found]  # the kept converter's

    known = TextModel.get_vocab_base_pre
    log = logging.getLogger("nbtrain")

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:
            name = declared_pre_tokenizer(Path(self.dir_model))
            if name is None:
                raise
            log.warning("nbtrain: pre-tokenizer %r, as tokenizer.json declares it", name)
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str]) -> int:
    tools, kind, *rest = argv
    script = Path(tools) / SCRIPTS[kind]
    sys.path[:0] = [str(Path(tools) / "gguf-py"), str(tools)]
    for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[name]  # the converter's own gguf-py, not the wheel's
    _patch_pre_tokenizer()
    sys.argv = [str(script), *rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
