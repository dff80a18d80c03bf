"""``make demo``: execute the quickstart notebook headlessly in a real kernel and report the result.

    python -m nbtrain.demo [--dir .demo]

The notebook builds the tiny local model, copies the shipped dataset, runs a LoRA fine-tune with
%%finetune and waits for it; the executed notebook is saved beside the run for inspection.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "00_quickstart.ipynb"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.demo", description=__doc__)
    ap.add_argument("--dir", default=".demo", help="working directory for the demo (default .demo)")
    ap.add_argument("--notebook", default=str(NOTEBOOK))
    args = ap.parse_args(argv)

    import nbformat
    from nbclient import NotebookClient

    work = Path(args.dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # Keep the demo's runs and registry inside its folder so it leaves nothing behind elsewhere.
    os.environ["NBTRAIN_HOME"] = str(work / "home")
    os.environ["NBTRAIN_RUNS_DIR"] = str(work / "nbtrain_runs")
    nb = nbformat.read(args.notebook, as_version=4)
    t0 = time.time()
    print(f"executing {args.notebook} in {work} ...", flush=True)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    ).execute()
    executed = work / "00_quickstart.executed.ipynb"
    nbformat.write(nb, executed)

    import nbtrain

    run = nbtrain.get_run("add-lora")
    st = run.status()
    loss = run.metrics()["loss"].dropna()
    print(f"run {run.id}: {st.describe()} in {time.time() - t0:.0f} s (notebook included)")
    print(f"loss: first {loss.iloc[0]:.4f} -> final {loss.iloc[-1]:.4f}")
    print(f"adapter: {run.output_dir}")
    print(f"executed notebook: {executed}")
    return 0 if st.state == "completed" and loss.iloc[-1] < loss.iloc[0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
