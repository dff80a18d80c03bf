"""The build function of pip's build hook (hatch-jupyter-builder, pyproject.toml): `pip install .`,
`pip wheel .` and an sdist build the JupyterLab extension from labextension/ with npm, through the top-level
package.json (`npm install`, `npm run build:prod`), into nbtrain/labextension, which the wheel ships as
shared-data. hatch-jupyter-builder's own npm_builder does the work; this wrapper only

- stops at once when node or npm is missing or too old, naming what to install (npm_builder would fail
  later with a bare "Could not find cmd" or a node stack trace);
- finds `jupyter-builder` (the Python build requirement) beside the interpreter that runs the build, so a
  build without isolation from a venv that is not activated works;
- builds nothing for an editable install (`pip install -e .`, `make install`): `make labext` lints, tests
  and builds the extension for development and links it into the venv.

A tree (or sdist) that already holds the built extension is not rebuilt (`skip-if-exists`), so installing
an sdist needs no node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatch_jupyter_builder import npm_builder as _npm_builder

NODE_MIN = (20, 19)  # rspack, under @jupyter/builder: "^20.19.0 || >=22.12.0" (package.json engines)
OUT = Path("nbtrain") / "labextension"
HOW = (
    "Install Node.js >= 20.19 with npm (Debian/Ubuntu: `apt-get install -y nodejs npm`; elsewhere "
    "https://nodejs.org), then run the install again. Or install a wheel or an sdist of nbtrain, which hold "
    "the built extension and need no node."
)


def _fail(what: str) -> None:
    raise RuntimeError(
        f"nbtrain: building the JupyterLab extension (the 'Training runs' sidebar) needs {what}. {HOW}"
    )


def _check_node() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        _fail(f"node and npm on PATH, and {' and '.join(missing)} cannot be found there")
    node = shutil.which("node")
    assert node is not None
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.match(r"v(\d+)\.(\d+)", out.strip())
    if found is None or (int(found[1]), int(found[2])) < NODE_MIN:
        _fail(f"Node.js >= {NODE_MIN[0]}.{NODE_MIN[1]}, and `node --version` says {out.strip() or 'nothing'}")


def _find_jupyter_builder() -> None:
    if shutil.which("jupyter-builder") is not None:
        return
    scripts = sysconfig.get_path("scripts")
    if Path(scripts, "jupyter-builder").exists():
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        return
    raise RuntimeError(
        "nbtrain: building the JupyterLab extension needs the `jupyter-builder` command of the Python "
        f"package jupyter_builder, which {sys.executable} lacks: pip installs it in an isolated build; "
        "for a build with --no-build-isolation run `pip install jupyter_builder hatch-jupyter-builder` first."
    )


def npm_builder(target_name: str, version: str, **kwargs: Any) -> None:
    if version == "editable":
        print(
            "nbtrain: an editable install does not build the lab extension; `make labext` builds it",
            file=sys.stderr,
        )
        return
    _check_node()
    _find_jupyter_builder()
    _npm_builder(target_name, version, **kwargs)
    if not any((OUT / "static").glob("remoteEntry.*.js")):
        raise RuntimeError(f"nbtrain: the lab extension build left no {OUT}/static/remoteEntry.*.js")
