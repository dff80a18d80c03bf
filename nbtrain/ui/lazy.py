"""Modules imported on first attribute access, so that `%load_ext nbtrain` stays under 0.3 s.

The verb table names every verb's function at import time; the modules those functions live in (the config
schema and planner with pydantic and YAML, the metrics reader with numpy) load when a verb first runs.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``, already imported or loaded by importlib's LazyLoader on first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
