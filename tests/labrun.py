"""One lab executed top to bottom in a real kernel, in a process of its own (the ``labs`` fixture's one way
to run a lab, so the slow ones can start early in the background while other tests run):

    python -m tests.labrun STEM WORKDIR OUT.ipynb

The lab runs in WORKDIR with its own NBTRAIN_HOME and runs folder and plain figures (NBTRAIN_DASHBOARD=
static: the saved notebook stays small); the executed notebook is written to OUT.ipynb, also when a cell
failed (exit status 1 then, the error on stderr)."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import nbformat
from nbclient import NotebookClient

LABS = Path(__file__).resolve().parent.parent / "notebooks"


def main(stem: str, work: Path, out: Path) -> int:
    nb = nbformat.read(LABS / f"{stem}.ipynb", as_version=4)
    if stem == "01_qlora_single_card":
        # After Run All the chat's server still answers (the export cell used to stop it); the kernel's exit
        # stops the servers it started, so this is asked from inside, last.
        check = "from nbtrain.control.jobs.serve import find_server\nassert find_server(run)"
        nb.cells.append(nbformat.v4.new_code_cell(check))
    os.environ.update(
        NBTRAIN_DASHBOARD="static", NBTRAIN_HOME=str(work / "home"), NBTRAIN_RUNS_DIR=str(work / "runs")
    )
    os.chdir(work)
    code = 0
    try:
        NotebookClient(
            nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}}
        ).execute()
    except Exception:  # said on stderr; the notebook as far as it ran is kept
        traceback.print_exc()
        code = 1
    nbformat.write(nb, out)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
