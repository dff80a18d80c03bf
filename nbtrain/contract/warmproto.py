"""What the kernel (control.launch.warm) and the warm process (worker.warm) agree on: where the warm process
listens, which environment it can serve, and the bytes of one request.

A warm process has imported the training stack once and forks a child per request that becomes exactly
what ``python -m MODULE ARGS`` started cold would be. Libraries read part of the environment when they are
imported (huggingface_hub's cache and endpoint, torch's and OpenMP's settings), so a warm process serves
only requests whose environment agrees with its own on those variables: ``env_key`` hashes them, with the
interpreter, and names the socket. Every variable is applied in the child before the requested module
runs (the plan's CUDA_VISIBLE_DEVICES, the run's lock fd, NBTRAIN_* settings), so what is read after the
fork is what the cold path would read.

One request on a fresh connection: a 4-byte big-endian length, then that much JSON (``argv``, ``cwd``,
``env``, ``fds``: the numbers the child must find the passed descriptors under), the descriptors themselves
(the log first) travelling with the first bytes as SCM_RIGHTS. The reply is one JSON line:
``{"pid": N}`` (the child leads its own session: pgid == pid) or ``{"cold": "why"}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbtrain.contract.jsonbound import TooDeep, loads
from nbtrain.contract.paths import home_dir

# Read by the preloaded libraries when they are imported (so they must agree with the warm process's), by
# prefix or by name. The thread counts are among them: torch sizes its intra-op pool as it is imported, so
# a child forked from a process imported with 2 threads keeps 2 whatever OMP_NUM_THREADS it is given (a
# run asking for 1 goes to a warm process of its own). Left out: what is read only later, in the child
# (CUDA_*, PYTORCH_CUDA_ALLOC_CONF), and what libraries set for themselves when a process imports them
# (OPENBLAS_CORETYPE, TORCHINDUCTOR_CACHE_DIR...), which differ between a kernel that imported torch and
# one that did not.
_KEY_PREFIXES = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "DATASETS_",
    "TOKENIZERS_",
    "ACCELERATE_",
    "PEFT_",
    "TRL_",
)
_KEY_NAMES = (
    "HOME", "XDG_CACHE_HOME", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONNOUSERSITE",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "NBTRAIN_LEAN_IMPORTS", "TMPDIR",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KMP_AFFINITY", "GOMP_CPU_AFFINITY",
)  # fmt: skip
# The modules a warm process may become: the training worker (one process), the ranks of a one-node
# multi-process run (nbtrain.worker.ranks forks them from the warm child; torchrun, deepspeed's and
# accelerate's launchers stay cold), the model server and the one-off jobs (the eval job imports scipy
# itself for lm-eval's metrics). The kernel asks only for these; the warm process checks again and answers
# "cold" otherwise.
SERVED = frozenset({
    "nbtrain.worker", "nbtrain.worker.ranks", "nbtrain.worker.serve.server", "nbtrain.worker.serve.generate",
    "nbtrain.worker.jobs.export", "nbtrain.worker.jobs.preview", "nbtrain.worker.jobs.score",
    "nbtrain.worker.jobs.evaluate",
})  # fmt: skip
MAX_REQUEST = 1 << 20
MAX_FDS = 8
ENV_OFF = "NBTRAIN_WARM"  # "0": every process starts cold
ENV_DIR = "NBTRAIN_WARM_DIR"  # where the sockets live (default: $NBTRAIN_HOME/warm)
ENV_IDLE = "NBTRAIN_WARM_IDLE"  # seconds without a request after which a warm process exits (default 1800)
# Warm processes add up: one per NBTRAIN_HOME and environment key, each ~300-540 MB. So each registers in
# one folder per user (whatever its home), and a new one makes room first: the least recently used idle
# ones of this user exit until at most ENV_MAX are left (itself included).
ENV_MAX = "NBTRAIN_WARM_MAX"  # idle warm processes per user (default 2)
ENV_USER_DIR = "NBTRAIN_WARM_USER_DIR"  # the per-user folder they register in (default /tmp/nbtrain-warm-UID)
# A warm process exits when the machine's available memory falls below this while it idles (it is the
# first thing to give memory back), and none starts below it.
ENV_MIN_AVAILABLE = "NBTRAIN_WARM_MIN_AVAILABLE_MB"  # default: 10% of the RAM, at most 2048 MB
DEFAULT_MAX = 2


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Warm start is on unless ``NBTRAIN_WARM=0``; ``NBTRAIN_LEAN_IMPORTS=0`` turns it off too (a process
    that loads every installed package would load bitsandbytes, which queries the GPU: no fork after it)."""
    env = env if env is not None else os.environ
    off = ("0", "false", "no")
    return env.get(ENV_OFF, "1").strip() not in off and env.get("NBTRAIN_LEAN_IMPORTS", "1").strip() != "0"


def env_key(env: Mapping[str, str]) -> str:
    """The interpreter and the import-time environment, hashed: equal keys, interchangeable processes."""
    picked = {k: v for k, v in env.items() if k in _KEY_NAMES or k.startswith(_KEY_PREFIXES)}
    blob = json.dumps([sys.executable, sys.version, sorted(picked.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_dir(env: Mapping[str, str] | None = None) -> Path:
    env = env if env is not None else os.environ
    if env.get(ENV_DIR):
        return Path(env[ENV_DIR]).expanduser().resolve()
    return home_dir(env) / "warm"  # beside the registry, resolved as it is


def folder_problem(folder: Path) -> str | None:
    """Why the warm folder is not safe to use, or None: it must be this user's own folder, which nobody
    else can enter (a request carries the whole environment, tokens included, and the run's descriptors;
    a socket another user placed there would receive them). A missing folder is made so by whoever
    creates it first."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"the warm folder {folder} cannot be read ({e.strerror})"
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"the warm folder {folder} is not a folder (a link?): warm start is off"
    if st.st_uid != me:
        return (
            f"the warm folder {folder} is owned by uid {st.st_uid}, not by you (uid {me}): warm start is off"
        )
    if st.st_mode & 0o077:
        return (
            f"the warm folder {folder} can be entered by others (mode {stat.S_IMODE(st.st_mode):o}): warm "
            f"start is off until it is yours alone (chmod 700 {folder})"
        )
    return None


def socket_path(key: str, env: Mapping[str, str] | None = None) -> Path:
    return warm_dir(env) / f"{key}.sock"


def send_request(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(request).encode()
    if len(data) > MAX_REQUEST or len(fds) > MAX_FDS:
        raise ValueError("warm request too large")
    payload = struct.pack(">I", len(data)) + data
    socket.send_fds(sock, [payload[:4096]], fds)
    if len(payload) > 4096:
        sock.sendall(payload[4096:])


REQUEST_SECONDS = 2.0  # the most one client may take to send its request (it sends it whole, at once)


class RequestReader:
    """One client's request read as its bytes come, without blocking, so one process reads many clients at
    once: ``feed()`` whenever the socket is readable returns (request, descriptors) once it is whole, None
    while more is due; ValueError for a malformed request or a client that hung up. The descriptors that
    came with it are this reader's to close (``close()``) until ``feed`` hands them over."""

    def __init__(self, sock: socket.socket, seconds: float = REQUEST_SECONDS) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + seconds
        self.fds: list[int] = []
        self.data = bytearray()
        self.size: int | None = None
        sock.setblocking(False)

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def feed(self) -> tuple[dict[str, Any], list[int]] | None:
        try:
            if self.size is None and not self.data:  # the first bytes carry the descriptors
                chunk, fds, _, _ = socket.recv_fds(self.sock, 4096, MAX_FDS)
                self.fds += fds
            else:
                chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            raise ValueError(f"the warm request could not be read ({e})") from None
        if not chunk:
            raise ValueError("warm request cut short")
        self.data += chunk
        if self.size is None and len(self.data) >= 4:
            (self.size,) = struct.unpack(">I", self.data[:4])
            if self.size > MAX_REQUEST:
                raise ValueError("warm request too large")
        if self.size is None or len(self.data) < 4 + self.size:
            return None
        try:
            request = loads(bytes(self.data[4 : 4 + self.size]))
        except TooDeep as e:
            raise ValueError(f"the warm request is {e}") from None
        if not isinstance(request, dict):
            raise ValueError("warm request is not an object")
        fds, self.fds = self.fds, []
        return request, fds

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()


def send_reply(sock: socket.socket, reply: dict[str, Any]) -> None:
    sock.sendall(json.dumps(reply).encode() + b"\n")


def recv_reply(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the warm process closed the connection without a reply")
        data += chunk
        if len(data) > 65536:
            raise ValueError("warm reply too large")
    reply = loads(data)
    if not isinstance(reply, dict):
        raise ValueError("warm reply is not an object")
    return reply


def held(lock: Path) -> bool:
    """Whether a warm process holds ``lock`` (it takes it first thing and keeps it while it lives)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock this probe may have taken
    return False


# ------------------------------------------------------------------------ this user's warm processes
# Each warm process registers in one folder per user, whatever its NBTRAIN_HOME: ``PID.json`` (pid, its
# start time, key, socket, warm folder, interpreter), rewritten when it is ready and touched at every
# request it answers, so the file's mtime is when it was last used. Identity is checked against /proc
# (standard library only here): this user's process, started when the file says, running the warm module.


def max_processes(env: Mapping[str, str] | None = None) -> int:
    """How many warm processes one user keeps (ENV_MAX, at least 1; NBTRAIN_WARM=0 turns them off)."""
    env = os.environ if env is None else env
    try:
        return max(1, int(env.get(ENV_MAX, "") or DEFAULT_MAX))
    except ValueError:
        return DEFAULT_MAX


def min_available(total: int, env: Mapping[str, str] | None = None) -> int:
    """Bytes of available memory below which a warm process exits (and none starts): ENV_MIN_AVAILABLE
    (MB), else 10% of ``total`` RAM, at most 2048 MB."""
    env = os.environ if env is None else env
    try:
        return int(float(env[ENV_MIN_AVAILABLE]) * 2**20)
    except (KeyError, ValueError):
        return min(2048 * 2**20, total // 10)


def memory_short(available: int, total: int, env: Mapping[str, str] | None = None) -> str | None:
    """Why a warm process must not hold memory now (``available`` bytes of the machine's ``total`` is below
    the floor, ``min_available``), or None."""
    floor = min_available(total, env)
    if available >= floor:
        return None
    return (
        f"the machine has {available / 2**20:.0f} MiB of memory available, below {floor / 2**20:.0f} MiB "
        f"({ENV_MIN_AVAILABLE})"
    )


def user_dir(env: Mapping[str, str] | None = None) -> Path:
    """The folder this user's warm processes register in: one per uid, not per NBTRAIN_HOME (nor TMPDIR,
    which differs between environments of one user)."""
    env = os.environ if env is None else env
    if env.get(ENV_USER_DIR):
        return Path(env[ENV_USER_DIR]).expanduser().resolve()
    return Path("/tmp") / f"nbtrain-warm-{os.geteuid()}"


def proc_created(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, as psutil's create_time), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    if fields[0] == "Z":
        return None  # it has exited; only its parent has yet to collect it
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def is_warm_process(pid: int, created: float) -> bool:
    """Whether ``pid`` is still the warm process of this user that started at ``created`` (not a reused pid,
    not another user's, not another program)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    began = proc_created(pid)
    return began is not None and abs(began - created) <= 1 and b"nbtrain.worker.warm" in argv


def register(info: dict[str, Any], env: Mapping[str, str] | None = None) -> Path | None:
    """Write (or rewrite) this warm process's entry in the user's folder; None when that folder is not safe
    to use (another user's, or open to others): the bound then does not apply to this process."""
    folder = user_dir(env)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    if folder_problem(folder) is not None:
        return None
    path = folder / f"{info['pid']}.json"
    tmp = folder / f".{info['pid']}.json.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)
    return path


def registered(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """This user's warm processes, alive and identity-checked, each entry with ``last_used`` (the time its
    entry was last touched), least recently used first. Entries of processes that are gone are removed."""
    folder = user_dir(env)
    if folder_problem(folder) is not None:
        return []
    out = []
    for path in folder.glob("*.json"):
        try:
            info = json.loads(path.read_text())
            pid, created = int(info["pid"]), float(info["created"])
            last = path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not is_warm_process(pid, created):
            with contextlib.suppress(OSError):
                path.unlink()  # a dead one's (its own exit removes it; a kill -9 does not)
            continue
        out.append({**info, "last_used": last, "entry": str(path)})
    return sorted(out, key=lambda e: e["last_used"])


EXIT_SECONDS = 3.0  # the most an exit request waits for a warm process to answer


def ask_to_exit(entry: Mapping[str, Any], why: str, seconds: float = EXIT_SECONDS) -> bool:
    """Ask the registered warm process ``entry`` to exit, over its own socket: it answers between requests
    (one thread: never while it forks a child), and only while no other request is being read; True when
    it said it exits. Identity-checked: the process listening on the socket is this user's and the very
    process of the entry (SO_PEERCRED), started when the entry says."""
    pid, created = int(entry["pid"]), float(entry["created"])
    if not entry.get("socket") or not is_warm_process(pid, created):
        return False
    path = Path(str(entry["socket"]))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(seconds)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            s.connect(f"/proc/self/fd/{dfd}/{path.name}")
        finally:
            os.close(dfd)
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        peer_pid = int.from_bytes(creds[0:4], sys.byteorder)
        peer_uid = int.from_bytes(creds[4:8], sys.byteorder)
        if peer_pid != pid or peer_uid != os.geteuid() or not is_warm_process(pid, created):
            return False
        send_request(s, {"exit": why}, [])
        return "exiting" in recv_reply(s)
    except (OSError, ValueError):
        return False
    finally:
        s.close()


def wait_gone(pid: int, created: float, seconds: float = 10.0) -> bool:
    """Wait until the warm process ``pid`` has exited (its memory is given back); True if it did."""
    deadline = time.monotonic() + seconds
    while is_warm_process(pid, created):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
