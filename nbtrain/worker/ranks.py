"""The ranks of a one-node multi-process run, forked from one process that has the training stack imported:
``python -m nbtrain.worker.ranks --nproc-per-node N --master-port P RUN_DIR``.

torchrun starts each rank as a new interpreter, and each imports torch, transformers, TRL and PEFT again
(about 5 s of CPU a rank here; two ranks on two cores took 9.2 s to their first collective, 16 CPU seconds).
This launcher is torchrun's own machinery (``torch.distributed.launcher.elastic_launch``: its elastic
agent, static rendezvous, a failed rank stopping the others, SIGTERM passed on) with a function as the
entrypoint and the fork start method, as accelerate's ``notebook_launcher`` starts ranks: the stack is
imported once, here, and each rank is a fork of this process (6.4 s, 6.6 CPU seconds, the same two ranks).
The warm process (``nbtrain.worker.warm``) serves this module too, so a multi-process run forked from it
imports nothing at all. Nothing here touches a GPU before the fork: each rank initialises its own.

Each rank runs the worker (``nbtrain.worker.__main__.main``) with the environment torchrun gives it (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...). Its torch threads are set as torchrun's default
would (``OMP_NUM_THREADS=1`` per rank unless the user set it): a fork keeps the count torch took at its
import, whatever the environment says, so the rank sets it itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType

import psutil

from nbtrain.contract.rundir import RunPaths, read_json


def _rank(run_dir: str) -> int:
    """One rank, in its forked process."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from nbtrain.worker.__main__ import main

    code = main([run_dir])
    if code:
        raise SystemExit(code)  # a failed rank: the agent stops the others, as torchrun does
    return 0


def _import_once(paths: RunPaths) -> None:
    """The training stack, as the warm process imports it, unless the run uses bitsandbytes (QLoRA):
    importing it initialises CUDA, after which no rank could be forked onto a GPU (each imports its own)."""
    from nbtrain.worker.lean import hide_unused_packages, unused_packages
    from nbtrain.worker.warm import import_stack

    try:
        resolved = read_json(paths.resolved)
    except (OSError, ValueError):
        return  # the ranks read resolved.json themselves and say what is wrong with it
    if "bitsandbytes" not in unused_packages(resolved):
        return
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() without CUDA
    hide_unused_packages(resolved)
    import_stack()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nbtrain.worker.ranks")
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("run_dir")
    args = ap.parse_args(argv)
    run_dir = str(Path(args.run_dir).resolve())
    if "transformers" not in sys.modules:  # started cold: the stack once, here, for every rank
        _import_once(RunPaths(Path(run_dir)))
    n = args.nproc_per_node
    if n > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks a node
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=n,
        run_id=Path(run_dir).name,
        rdzv_backend="static",
        rdzv_endpoint=f"{args.master_addr}:{args.master_port}",
        rdzv_configs={"rank": 0},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="fork",
    )
    print(f"nbtrain: {n} ranks forked from this process (pid {os.getpid()}): the training stack imported "
          "once", flush=True)  # fmt: skip
    code: list[int] = []

    def launch() -> None:
        try:
            elastic_launch(config, _rank)(run_dir)
            code.append(0)
        except ChildFailedError as e:  # a rank failed: the agent has stopped the others
            print(e.format_msg(), file=sys.stderr, flush=True)
            code.append(1)
        except BaseException:  # noqa: BLE001 - said in the launcher's log, as torchrun would
            traceback.print_exc()
            code.append(1)

    # The agent runs in a thread, so it installs no signal handlers of its own: its SIGTERM handler would
    # stop the ranks with SIGTERM and then wait for their return values, which ranks that stopped themselves
    # (nbtrain's stop signals the whole group: each rank stops at the end of its step, at a checkpoint)
    # hand over only to an agent still polling. Here a signal to this process goes on to the ranks.
    agent = threading.Thread(target=launch, name="nbtrain-ranks-agent")
    agent.start()

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while agent.is_alive():
        agent.join(0.5)
    return code[0] if code else 1


if __name__ == "__main__":
    raise SystemExit(main())
