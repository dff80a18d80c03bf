"""Run a pickled notebook function in a detached process: ``python -m nbtrain.worker.function RUN_DIR``.

The fallback of ``nbtrain.launch_function(..., fallback="detached")`` when the kernel is not safe to
fork; under torchrun for several processes. The function logs with ``nbtrain.log`` as usual.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

from nbtrain.contract.pickles import read_trusted
from nbtrain.contract.rundir import RunPaths, tail_text, write_status
from nbtrain.worker import runlog
from nbtrain.worker.control import LogCap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = RunPaths(Path(argv[0]).resolve())
    rank = int(os.environ.get("RANK", "0"))
    if "RANK" in os.environ:
        fd = os.open(paths.rank_log(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ["NBTRAIN_RUN_DIR"] = str(paths.root)
    LogCap(paths.rank_log(rank)).start()
    signal.signal(signal.SIGTERM, lambda s, f: runlog.mark_signalled())
    if rank == 0:
        write_status(paths, "running")
    try:
        import cloudpickle

        # only a pickle this user owns and nobody else can write (nbtrain.contract.pickles)
        fn, args = cloudpickle.loads(read_trusted(paths.root / "function.pkl"))
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - recorded in status.json for every reader
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        error = {"type": type(e).__name__, "message": str(e)[:4000], "traceback": tb}
        write_status(paths, "failed", error={**error, "log_tail": tail_text(paths.rank_log(rank), 30)})
        return 1
    if rank == 0:
        # Not should_stop(): that is a collective, and the other ranks have finished.
        write_status(paths, "stopped" if runlog.stop_requested_here() else "completed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
