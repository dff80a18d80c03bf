"""Crash-safety trials: kill -9 at random moments (often inside a checkpoint write) and graceful stops
at random steps, each followed by resume. Runs the same trials as tests/control/test_resume.py, 20 of each.

    python bench/bench_crash.py [--trials 20]       # writes bench/results/crash.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    env = {**os.environ, "NBTRAIN_KILL_TRIALS": str(args.trials), "NBTRAIN_STOP_TRIALS": str(args.trials)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/control/test_resume.py", "-q", "-s", "-p", "no:cacheprovider",
         "-k", "kill_at_random or graceful_stop_at_random"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    kill = re.search(r"kill -9 trials: (\d+), all resumed and completed; resumed from steps (\[.*?\])", out)
    stop = re.search(
        r"graceful stop trials: (\d+), all resumed and completed; stopped at steps (\[.*?\])", out
    )
    result = {
        "passed": proc.returncode == 0,
        "kill9_trials_completed": int(kill.group(1)) if kill else 0,
        "kill9_resumed_from_steps": json.loads(kill.group(2)) if kill else [],
        "graceful_stop_trials_completed": int(stop.group(1)) if stop else 0,
        "graceful_stopped_at_steps": json.loads(stop.group(2)) if stop else [],
        "trials_requested": args.trials,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "crash.json").write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **result}, indent=1) + "\n"
    )
    print("| trials | kill -9 -> resume ok | graceful stop -> resume ok |")
    print("|---|---|---|")
    print(
        f"| {args.trials} | {result['kill9_trials_completed']} | {result['graceful_stop_trials_completed']} |"
    )
    if proc.returncode != 0:
        print(out[-4000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
