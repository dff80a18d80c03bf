"""Text no path, name or Hub id can hold: a NUL byte (``"\\0"`` in a double-quoted YAML string).

Every file and folder a config names (model:, data: paths, chat_template_path, hostfile, nvme_path, a
reward model's folder, a run's name) reaches the operating system as a C string, which ends at the first
NUL: Python refuses such a path with a bare ``ValueError: embedded null byte`` wherever it is looked up.
Refused here once, for every text value of the config, before any rule looks at the world."""

from __future__ import annotations

from typing import Any

from nbtrain.control.config.problems import Problems, config_values

NUL_FIX = 'remove the \\0 (a double-quoted YAML string reads "\\0" as that byte)'


def nul_problems(raw: dict[str, Any], probs: Problems) -> bool:
    """Add a problem for each text value of ``raw`` holding a NUL byte; whether there was one."""
    found = False
    for path, value in config_values(raw):
        if isinstance(value, str) and "\0" in value:
            where = "no file name, path, Hub id or name can hold"
            probs.add(path, f"{value!r} holds a NUL byte (\\0), which {where}: {NUL_FIX}")
            found = True
    return found
