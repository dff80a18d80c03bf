"""After `pip install` of the wheel, Jupyter finds both extensions: the prebuilt lab extension (shared-data
in share/jupyter/labextensions) and the server extension (enabled by etc/jupyter/jupyter_server_config.d)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.browser  # needs the built lab extension, like the browser tests


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_the_wheel_ships_both_extensions_and_jupyter_lists_them_ok(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(ROOT),
        ]
    )
    (wheel,) = dist.glob("nbtrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = "nbtrain-0.1.0.data/data/"
    assert data + "share/jupyter/labextensions/nbtrain/package.json" in names
    assert data + "share/jupyter/labextensions/nbtrain/install.json" in names
    assert any(n.startswith(data + "share/jupyter/labextensions/nbtrain/static/remoteEntry.") for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/nbtrain.json" in names

    config = json.loads(
        zipfile.ZipFile(wheel).read(data + "etc/jupyter/jupyter_server_config.d/nbtrain.json")
    )
    assert config["ServerApp"]["jpserver_extensions"] == {"nbtrain.server": True}

    # Install it into a prefix of its own (--ignore-installed: leave the venv's own nbtrain alone) and ask
    # JupyterLab, looking only there for nbtrain.
    prefix = tmp_path / "prefix"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            "--prefix",
            str(prefix),
            str(wheel),
        ]
    )
    (site,) = prefix.glob("lib/python*/site-packages")
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
    }
    lab = _run([sys.executable, "-m", "jupyter", "labextension", "list"], env)
    line = next(ln for ln in lab.splitlines() if "nbtrain v0.1.0" in ln)
    assert "enabled" in line and "OK" in line and str(prefix) in lab
    # `jupyter server extension list` reads only the user, sys.prefix and system config dirs: ask the venv,
    # whose install of nbtrain put the same config file there.
    server = _run([sys.executable, "-m", "jupyter", "server", "extension", "list"])
    assert re.search(r"nbtrain\.server\W+(\[\d+m)?enabled", server), server
    assert re.search(r"nbtrain\.server\s+(\x1b\[\d+m)?OK", server), server
    assert importlib.metadata.version("nbtrain") == "0.1.0"  # the venv's install is untouched
