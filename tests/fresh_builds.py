"""The fast tier as a fresh clone runs it, whatever this machine's background builds have reached.

``make check`` loads this plugin (``pytest -p tests.fresh_builds``) with NBTRAIN_CACHE_DIR at a cache that
llama.cpp is never set up in: llama-cpp-python is not importable (``find_spec`` finds none, as on a machine
where pip has not built it yet) and no converter is kept, so a fast test that needs llama.cpp's setup, rather
than making the state it checks, fails in ``make check`` on every machine and not only on a fresh one.
``make test`` runs the same tests with whatever the background setup has reached, so both states are run.

DeepSpeed's ops need no such plugin: a test that loads an op not built yet builds it or waits on torch's
build lock for the background build (tests/deepspeed_ops.py), so the ops' state can slow a test but not
change its result.
"""

from __future__ import annotations

import os
import sys

import pytest

HIDDEN = ("llama_cpp",)


def pytest_configure(config: pytest.Config) -> None:
    for name in HIDDEN:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises; find_spec returns None
    from nbtrain.control.jobs import llamacpp

    if llamacpp.kept():
        raise pytest.UsageError(
            f"tests.fresh_builds: llama.cpp's converter is kept in {llamacpp.tools_dir()}; point "
            f"NBTRAIN_CACHE_DIR (now {os.environ.get('NBTRAIN_CACHE_DIR')!r}) at a cache it is not set up in"
        )
