"""nbtrain.launch_function: a training function written in the notebook, run by notebook_launcher
from a real kernel (nbclient), with the kernel-contamination checks triggered on purpose."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from nbclient.exceptions import DeadKernelError

import nbtrain
from tests.notebook import error_of, execute, text_of

pytestmark = pytest.mark.slow

TRAIN = """
def train(steps, forever=False):
    import torch, nbtrain
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)          # cpu=True: real DDP over gloo, not two copies of rank 0
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    g = torch.Generator().manual_seed(acc.process_index)   # different data on each rank
    step = 0
    while step < steps or forever:
        step += 1
        x = torch.randn(8, 4, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        acc.backward(loss); opt.step(); opt.zero_grad()
        nbtrain.log(step=step, loss=loss.item(), world_size=acc.num_processes)
        if nbtrain.should_stop():
            break
        if forever:
            time.sleep(0.05)
    print("final weight sum", acc.unwrap_model(model).weight.detach().sum().item(), flush=True)
"""


def weight_sums(run: nbtrain.Run) -> list[str]:
    out = []
    for r in (0, 1):
        lines = [
            ln for ln in run.paths.rank_log(r).read_text().splitlines() if ln.startswith("final weight sum")
        ]
        out.append(lines[-1])
    return out


def test_function_runs_as_real_two_rank_ddp_and_the_cell_returns_at_once(workdir: Path) -> None:
    cells = [
        "import time, nbtrain",
        TRAIN,
        "t0 = time.monotonic(); run = nbtrain.launch_function(train, 40, num_processes=2, name='nl')\n"
        "print('returned after', round(time.monotonic() - t0, 2))",
        "print(run.wait(timeout=300).state)",
        "%load_ext nbtrain\n%finetune status nl",
    ]
    nb = execute(cells, workdir)
    returned = float(text_of(nb.cells[2]).split()[-1])
    assert returned < 2.0, returned
    # The launcher thread's own chatter may land in whichever cell runs; the result is the last line.
    assert text_of(nb.cells[3]).strip().splitlines()[-1] == "completed"
    run = nbtrain.get_run("nl")
    m = run.metrics()
    assert m["step"].max() == 40 and (m["world_size"] == 2).all()
    a, b = weight_sums(run)
    assert a == b  # DDP kept both ranks' weights identical though each saw different data
    assert "step 40" in text_of(nb.cells[4])


def test_contamination_checks_refuse_with_cause_and_fix(workdir: Path) -> None:
    cells = [
        "import nbtrain",
        TRAIN,
        "import bitsandbytes",
        "nbtrain.launch_function(train, 5, num_processes=2)",
        "run = nbtrain.launch_function(train, 5, num_processes=2, name='fallback', fallback='detached')",
        "print(run.wait(timeout=300).state)",
    ]
    nb = execute(cells, workdir, allow_errors=True)
    err = error_of(nb.cells[3])
    assert err is not None and err[0] == "NbtrainError"
    assert "bitsandbytes is imported" in err[1] and "restart the kernel" in err[1] and "fallback" in err[1]
    assert "detached process, not with notebook_launcher" in text_of(nb.cells[4])
    assert text_of(nb.cells[5]).strip().splitlines()[-1] == "completed"
    fb = nbtrain.get_run("fallback")
    assert fb.resolved["plan"]["launcher"] == "torchrun"
    a, b = weight_sums(fb)
    assert a == b

    cells = ["import nbtrain", TRAIN, "from accelerate import Accelerator\nAccelerator(cpu=True)",
             "nbtrain.launch_function(train, 5, num_processes=2)"]  # fmt: skip
    nb = execute(cells, workdir, allow_errors=True)
    err = error_of(nb.cells[3])
    assert err is not None and "an Accelerator" in err[1] and "inside the training function" in err[1]


def test_stop_ends_the_ranks_and_the_kernels_death_takes_them_along(workdir: Path) -> None:
    cells = [
        "import time, nbtrain",
        TRAIN,
        "run = nbtrain.launch_function(train, 0, True, num_processes=2, name='forever')\n"
        "deadline = time.time() + 120\n"
        "while run.status().step < 5 and time.time() < deadline: time.sleep(0.2)",
        "print(run.stop(timeout=60).state)",
        "run2 = nbtrain.launch_function(train, 0, True, num_processes=2, name='orphans')\n"
        "deadline = time.time() + 120\n"
        "while run2.status().step < 5 and time.time() < deadline: time.sleep(0.2)",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ]
    with pytest.raises(DeadKernelError):
        execute(cells, workdir)
    assert nbtrain.get_run("forever").status().state == "stopped"
    run2 = nbtrain.get_run("orphans")
    pids = run2.paths.rank_pids()
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "ranks outlived their kernel"
        time.sleep(0.2)
    assert run2.status().state == "failed" and run2.status().error["type"] == "lost"  # type: ignore[index]
