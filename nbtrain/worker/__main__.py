"""Entry point of a training process: ``python -m nbtrain.worker RUN_DIR``.

Started by the kernel (or the CLI) in its own session; reads everything from the run directory and
writes everything back to it. It never imports UI code.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType

from nbtrain.rundir import RunPaths, read_json, write_status
from nbtrain.worker.control import StopControl


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nbtrain.worker RUN_DIR", file=sys.stderr)
        return 2
    paths = RunPaths(Path(argv[0]).resolve())
    stop = StopControl(paths)

    # Installed before the heavy imports, so a stop during start-up is not lost.
    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        stop.request(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    write_status(paths, "starting", pid=os.getpid())
    try:
        resolved = read_json(paths.resolved)
        from nbtrain.worker.sft import SFTRecipe

        recipe = SFTRecipe(paths, resolved, stop)
        recipe.setup()
        outcome = recipe.train()
        recipe.cleanup()
    except BaseException as e:  # noqa: BLE001 - every failure is recorded in status.json, then re-raised
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        write_status(
            paths,
            "failed",
            error={
                "type": type(e).__name__,
                "message": str(e)[:4000],
                "traceback": tb[-8000:],
            },
        )
        return 1
    print(f"nbtrain worker: {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
