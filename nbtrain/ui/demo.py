"""``make demo``: execute lab 1 (notebooks/01_qlora_single_card) headlessly on the tiny model and report.

    python -m nbtrain.ui.demo [--dir .demo] [--notebook PATH]

The notebook builds the tiny local model (no GPU here, so its one switch picks it), estimates full vs
LoRA vs QLoRA memory, copies the shipped dataset, fine-tunes and waits for the run; the executed
notebook is saved beside the run for inspection. About a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_qlora_single_card.ipynb"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.ui.demo", description=__doc__)
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
    # Plain figures, not widgets, in the saved notebook: it stays small and opens anywhere.
    os.environ.setdefault("NBTRAIN_DASHBOARD", "static")
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    ).execute()
    executed = work / f"{Path(args.notebook).stem}.executed.ipynb"
    nbformat.write(nb, executed)

    from nbtrain.ui.run import runs as all_runs

    runs = all_runs()
    if not runs:
        print(f"the notebook started no run; see {executed}")
        return 1
    run = runs[-1]  # the notebook's (last) training run
    st = run.status()
    loss = run.metrics()["loss"].dropna()
    print(f"run {run.id}: {st.describe()} in {time.time() - t0:.0f} s (notebook included)")
    print(f"loss: first {loss.iloc[0]:.4f} -> final {loss.iloc[-1]:.4f}")
    print(f"adapter: {run.output_dir}")
    print(f"executed notebook: {executed}")
    return 0 if st.state == "completed" and loss.iloc[-1] < loss.iloc[0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
