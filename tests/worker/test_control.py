"""Worker-side control: log capping keeps a process that prints without pause from filling the disk
(and, writing to a file rather than a pipe, it never blocks)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nbtrain.contract.rundir import RunPaths
from nbtrain.control.launch import process

CHATTY = """
import sys, time
from pathlib import Path
from nbtrain.worker.control import LogCap
cap = LogCap(Path(sys.argv[1]), max_bytes=8 * 2**20, interval=0.05)
cap.start()
line = "x" * 1023 + "\\n"
for _ in range(100 * 1024):  # 100 MiB
    sys.stdout.write(line)
sys.stdout.flush()
time.sleep(0.2)
cap.check()
print("done, rotations", cap.rotations, flush=True)
"""


def test_a_process_printing_100_mib_never_blocks_and_its_log_stays_capped(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.make()
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    log = paths.rank_log(0)
    t0 = time.monotonic()
    result = process.spawn(paths, [(log.name, [sys.executable, str(script), str(log)])], {})
    assert isinstance(result, process.Launched)
    info = process.read_launch(paths)
    assert info is not None
    assert process.wait_group_gone(info, timeout=120), "the chatty process blocked"
    elapsed = time.monotonic() - t0
    assert "done, rotations" in log.read_text()
    rotations = int(log.read_text().split("rotations")[-1])
    assert rotations >= 1  # how many depends on how much the writer gets in between two checks (load)
    total = sum(p.stat().st_size for p in paths.logs.iterdir())
    # the file and one rotated file, each 8 MiB plus what the writer adds between two checks (50 ms apart,
    # more on a busy machine): far from the 100 MiB written
    assert total < 60 * 2**20, total
    assert elapsed < 120


def test_a_stop_request_names_who_asked_even_when_its_sigterm_is_seen_first(tmp_path: Path) -> None:
    from nbtrain.contract.rundir import request_control
    from nbtrain.worker.control import StopControl

    asked, plain = RunPaths(tmp_path / "asked"), RunPaths(tmp_path / "plain")
    asked.make()
    plain.make()
    request_control(asked, "stop", by="sidebar")  # Run.stop(by="sidebar"), then its SIGTERM
    stop = StopControl(asked)
    stop.request("SIGTERM")  # what the worker's signal handler does
    assert stop.reason == "sidebar"
    killed = StopControl(plain)
    killed.request("SIGTERM")  # a kill from a shell: no request file, the signal is the reason
    assert killed.reason == "SIGTERM"
    request_control(plain, "stop")  # the time alone, as earlier versions wrote it
    polled = StopControl(plain)
    assert polled.requested and polled.reason == "control/stop"
