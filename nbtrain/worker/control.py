"""How a running worker learns it should stop or checkpoint: a signal, or a file in <run>/control/."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from nbtrain.contract.rundir import RunPaths, read_json


class StopControl:
    """Polled between steps; cheap enough to check on every step (one ``stat``, throttled)."""

    def __init__(self, paths: RunPaths, poll_interval: float = 0.5) -> None:
        self.paths = paths
        self.reason: str | None = None
        self._poll_interval = poll_interval
        self._last_poll = 0.0

    def request(self, reason: str) -> None:
        """Stop, for ``reason`` (a signal's name, "control/stop"); a stop request file that says who asked
        (``Run.stop(by=...)``: "sidebar", "user") names them instead, since the SIGTERM that follows
        it may be seen first."""
        if self.reason is None:
            self.reason = self._asked_by() or reason

    def _asked_by(self) -> str | None:
        try:
            data = read_json(self.paths.control_file("stop"), max_bytes=4096, below=self.paths.root)
        except (OSError, ValueError):  # none, a FIFO or link in its place, or the time alone
            return None
        by = data.get("by") if isinstance(data, dict) else None
        return by[:100] if isinstance(by, str) and by else None

    @property
    def requested(self) -> bool:
        if self.reason is None:
            now = time.monotonic()
            if now - self._last_poll >= self._poll_interval:
                self._last_poll = now
                if self.paths.control_file("stop").exists():
                    self.request("control/stop")
        return self.reason is not None

    def take_checkpoint_request(self) -> bool:
        """True once per ``control/checkpoint`` file (``%finetune checkpoint``); the file is consumed."""
        f = self.paths.control_file("checkpoint")
        try:
            f.unlink()
        except FileNotFoundError:
            return False
        return True


class LogCap:
    """Keeps this process's log (its stdout and stderr, fds 1 and 2) under a size cap.

    Output goes straight to a file, so a chatty worker never blocks; past ``max_bytes`` the file is
    rotated to ``<name>.1`` (the previous one dropped) and fds 1 and 2 are pointed at a fresh file.
    The cap is NBTRAIN_LOG_MAX_BYTES (default 64 MiB).
    """

    def __init__(self, path: Path, max_bytes: int | None = None, interval: float = 1.0) -> None:
        self.path = path
        self.max_bytes = max_bytes or int(os.environ.get("NBTRAIN_LOG_MAX_BYTES", str(64 * 2**20)))
        self.interval = interval
        self.rotations = 0

    def start(self) -> None:
        threading.Thread(target=self._loop, name="nbtrain-logcap", daemon=True).start()

    def check(self) -> None:
        try:
            size = os.fstat(1).st_size
        except OSError:
            return
        if size <= self.max_bytes or not self.path.exists():
            return
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.rotations += 1

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            self.check()


# ------------------------------------------------------------------------------------------- memory
class MemoryGuard:
    """Turns an approaching out-of-memory into a named failure instead of the kernel's OOM killer.

    A thread looks at the memory left (the machine's available memory, or the cgroup's headroom when a
    container limit is the tighter one) every ``interval`` seconds. Below ``reserve_bytes`` (default: 5% of
    the limit, at most 1 GiB; NBTRAIN_MEMORY_RESERVE_MIB) it acts only if this process is the one the kernel
    would kill (the highest ``oom_score`` among the processes sharing the limit): it writes status.json
    ``failed`` (OutOfMemory, with the numbers and the fixes) and kills its own process group (the run's
    ranks and launcher), which frees the memory before anything else on the machine is taken. When some
    other process holds more, it says so once in the log and leaves the kernel to decide.

    The worker also raises its own ``oom_score_adj``, so that if memory runs out faster than the guard
    looks, the kernel takes the training run rather than the notebook's kernel or the Jupyter server.
    """

    OOM_SCORE_ADJ = 500

    def __init__(
        self, paths: RunPaths, rank: int, *, reserve_bytes: int | None = None, interval: float = 0.25
    ) -> None:
        self.paths = paths
        self.rank = rank
        self.interval = interval
        self.limit, _ = headroom()
        env = os.environ.get("NBTRAIN_MEMORY_RESERVE_MIB")
        if reserve_bytes is None:
            reserve_bytes = int(float(env) * 2**20) if env else min(self.limit // 20, 2**30)
        self.reserve = reserve_bytes
        self._said_other = False

    def start(self) -> None:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(self.OOM_SCORE_ADJ))
        except OSError:
            pass  # not Linux, or not allowed: the guard still looks
        threading.Thread(target=self._loop, name="nbtrain-memguard", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.check()
            time.sleep(self.interval)

    def check(self) -> bool:
        """Fail the run if memory is about to run out and this process is the kernel's pick (True if so)."""
        limit, left = headroom()
        if left >= self.reserve:
            return False
        other = bigger_process()
        if other is not None:
            if not self._said_other:
                self._said_other = True
                print(f"nbtrain: only {left / 2**20:.0f} MiB of memory left; process {other[0]} ({other[1]}) "
                      "holds more than this run, so it is left to the kernel", flush=True)  # fmt: skip
            return False
        self._fail(limit, left)
        return True

    def _fail(self, limit: int, left: int) -> None:
        import signal

        from nbtrain.contract.rundir import read_json, write_status
        from nbtrain.worker import oom

        try:
            step = int(read_json(self.paths.status).get("step") or 0)
        except (OSError, ValueError, AttributeError):
            step = 0
        try:
            resolved = read_json(self.paths.resolved)
        except (OSError, ValueError):
            resolved = {}
        plan = resolved.get("plan") if isinstance(resolved, dict) else None
        name = (resolved.get("name") or resolved.get("id")) if isinstance(resolved, dict) else None
        message = oom.message(step, left, limit, oom.holders(), plan if isinstance(plan, dict) else {}, name)
        print(f"nbtrain: {message}", flush=True)
        write_status(
            self.paths, "failed", error={"type": "OutOfMemory", "message": message, "rank": self.rank}
        )
        if os.getpgid(0) == os.getsid(0):  # the run's own session (nbtrain starts each run in one): all of it
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # started some other way: only this process


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _cgroup_files() -> tuple[str, str, str, str] | None:
    """(limit, usage, stat, inactive-file key) of this process's memory cgroup (v2 or v1), if it has one."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2
            base = "/sys/fs/cgroup" + rel.rstrip("/")
            if os.path.exists(base + "/memory.max"):
                return base + "/memory.max", base + "/memory.current", base + "/memory.stat", "inactive_file"
        elif "memory" in controllers.split(","):
            for base in ("/sys/fs/cgroup/memory" + rel.rstrip("/"), "/sys/fs/cgroup/memory"):
                if os.path.exists(base + "/memory.limit_in_bytes"):
                    return (base + "/memory.limit_in_bytes", base + "/memory.usage_in_bytes",
                            base + "/memory.stat", "total_inactive_file")  # fmt: skip
    return None


def headroom() -> tuple[int, int]:
    """(the memory limit this process lives under, what is left of it) in bytes: the machine's total and
    available memory, or a container's cgroup limit and its headroom (reclaimable file cache not counted as
    used) when that is the tighter one."""
    import psutil

    vm = psutil.virtual_memory()
    limit, left = int(vm.total), int(vm.available)
    files = _cgroup_files()
    if files is not None:
        cg_limit, usage = _read_int(files[0]), _read_int(files[1])
        if cg_limit is not None and usage is not None and cg_limit < limit:
            inactive = 0
            try:
                with open(files[2]) as f:
                    for line in f:
                        key, _, value = line.partition(" ")
                        if key == files[3]:
                            inactive = int(value)
            except (OSError, ValueError):
                pass
            limit, left = cg_limit, min(left, cg_limit - max(0, usage - inactive))
    return limit, max(0, left)


def bigger_process() -> tuple[int, str] | None:
    """(pid, name) of a process with a higher ``oom_score`` than this one (the kernel would kill it first), or
    None when this process is the kernel's pick. Processes that cannot be read are not counted."""
    import psutil

    def score(pid: int) -> int:
        with open(f"/proc/{pid}/oom_score") as f:
            return int(f.read())

    try:
        mine = score(os.getpid())
    except (OSError, ValueError):
        return None  # no oom_score here: this process is all the guard can judge
    for proc in psutil.process_iter(["pid", "name"]):
        pid = proc.info["pid"]
        if pid == os.getpid():
            continue
        try:
            if score(pid) > mine:
                return pid, str(proc.info["name"])
        except (OSError, ValueError):
            continue
    return None
