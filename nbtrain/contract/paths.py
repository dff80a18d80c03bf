"""Where nbtrain keeps things: NBTRAIN_HOME (registry, caches) and the runs root."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def home_dir(env: Mapping[str, str] | None = None) -> Path:
    """NBTRAIN_HOME, else $XDG_DATA_HOME/nbtrain, else ~/.local/share/nbtrain (``~`` and relative paths
    resolved): of this process's environment, or of ``env`` (a process about to be started)."""
    env = os.environ if env is None else env
    home = env.get("NBTRAIN_HOME")
    if home:
        return Path(home).expanduser().resolve()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(base).expanduser() / "nbtrain").resolve()


def runs_root() -> Path:
    """NBTRAIN_RUNS_DIR, else ``nbtrain_runs`` beside the notebook (the working directory).

    Runs live next to the work that made them so students see ``output/`` in the file browser; the
    registry in NBTRAIN_HOME indexes them from anywhere.
    """
    env = os.environ.get("NBTRAIN_RUNS_DIR")
    return Path(env).expanduser().resolve() if env else (Path.cwd() / "nbtrain_runs").resolve()
