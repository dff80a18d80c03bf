"""Chat templates nbtrain ships, by name (``chat_template: NAME`` in a config; stdlib only).

``chatml-tools``: ChatML (``<|im_start|>`` / ``<|im_end|>``: SmolLM2, Qwen, and most models trained on it)
that renders tools and tool calls, for a model whose own template does not: calls in the Hermes / Qwen
convention (``<tool_call>{JSON}</tool_call>``), which the server parses back into OpenAI ``tool_calls``.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
BUILTIN = {"chatml-tools": TEMPLATES / "chatml_tools.jinja"}


def builtin_template(name: str) -> Path | None:
    """The file of the built-in template ``name``, or None when there is no such template."""
    return BUILTIN.get(name)
