"""The warm process: ``python -m nbtrain.worker.warm``. It imports the training stack once, listens on a
Unix socket (nbtrain.contract.warmproto) and forks, per request, a child that becomes exactly what
``python -m MODULE ARGS`` started cold would be (the training worker, the model server, the export,
preview and score jobs): its own session and process group, the log as stdout/stderr, stdin from
/dev/null, the passed descriptors under their numbers, the request's working directory and environment,
fresh random seeds, the same module run as ``__main__``, and at its end
what a normal interpreter exit does (non-daemon threads joined, atexit handlers run); its exit status is
written to the request's ``exit_file`` (the client, not being its parent, cannot collect it).

Safe by construction:
- no thread exists when it forks: it asserts one thread in /proc/self/task before every fork. numpy's
  OpenBLAS pool and pyarrow's jemalloc background thread would start at import, so this process sets
  ``OPENBLAS_NUM_THREADS=1`` and ``JE_ARROW_MALLOC_CONF=background_thread:false`` for itself (numpy's BLAS
  then runs on one thread in its children; torch's own pools start only at the first operation, in the
  child, sized by the request's environment);
- nothing initialises CUDA: torch is imported, never asked about devices (CUDA cannot survive a fork);
  bitsandbytes and scipy are left out as the lean-import rules leave them out of a typical run (and
  bitsandbytes queries the GPU when peft imports it), so a child hides what a cold process would, and a
  run that needs one of them (QLoRA, trust_remote_code) is answered "cold";
- it serves only its own user (SO_PEERCRED), only requests whose import-time environment matches its own
  (the socket's name is that key), and only while nbtrain and the training stack are the ones it imported:
  on a request after either changed on disk it answers "cold" and exits;
- one per key: a lock file held for its lifetime; it exits after ``NBTRAIN_WARM_IDLE`` seconds (default
  1800) without a request, or on SIGTERM, removing its socket;
- a bounded number per user: each registers in the user's folder (``contract.warmproto.user_dir``,
  whatever its NBTRAIN_HOME) and, before it imports anything, asks the least recently used idle ones of
  this user to exit until at most ``NBTRAIN_WARM_MAX`` (default 2) are left, itself included. It is asked
  over its own socket and answers between requests (one thread), so none exits while it forks a child;
- the first to give memory back: it checks the machine's available memory every MEMORY_CHECK_S while it
  idles and exits when it is below ``NBTRAIN_WARM_MIN_AVAILABLE_MB`` (default 10% of the RAM, at most
  2048 MB); the spawner starts none below it (control.launch.process.start_warm).

Killing it (even with SIGKILL) leaves the runs it forked running: they lead their own sessions.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import json
import os
import random
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from nbtrain.contract import warmproto
from nbtrain.contract.rundir import RunPaths, read_json
from nbtrain.worker.lean import WHY_HIDDEN, hide_packages, unused_packages

# What a typical run imports (the lean rules: no bitsandbytes), and the modelling code of common families.
PRELOAD = (
    "torch",
    "numpy",
    "safetensors.torch",
    "tokenizers",
    "datasets",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "nbtrain.worker.recipes.sft",
    "nbtrain.worker.recipes.preference",
    "nbtrain.worker.recipes.grpo",
    "nbtrain.worker.data",
    "nbtrain.worker.callbacks",
)
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3")
STACK = ("torch", "transformers", "datasets", "peft", "trl", "accelerate", "numpy")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def stamp() -> str:
    """What a change of the code on disk changes: nbtrain's files and the stack's installed versions."""
    root = Path(__file__).resolve().parents[1]  # the nbtrain package
    newest = max((p.stat().st_mtime_ns for p in root.rglob("*.py")), default=0)
    parts = [str(newest)]
    for name in STACK:
        mod = sys.modules.get(name)
        init = getattr(mod, "__file__", None)
        parts.append(f"{name}:{getattr(mod, '__version__', '')}:{os.stat(init).st_mtime_ns if init else 0}")
    return "|".join(parts)


def preload() -> list[str]:
    """Import the stack; returns what could not be imported (a partial preload is still a preload)."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    hide_packages(list(WHY_HIDDEN))  # as the lean rules leave them out of a typical run
    return import_stack()


def import_stack() -> list[str]:
    """Import what a typical run imports (the packages hidden before stay out); returns what could not be
    imported. Also what the ranks' launcher (``nbtrain.worker.ranks``) imports once, before it forks them."""
    failed = []
    for name in PRELOAD + tuple(f"transformers.models.{f}.modeling_{f}" for f in FAMILIES):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a child imports it again and reports it there
            failed.append(f"{name}: {type(e).__name__}")
    return failed


HIGH = 1000  # a forked child's own descriptors wait at this number and up while it places the passed ones


def refusal(request: dict[str, Any], key: str, started_stamp: str) -> str | None:
    """Why this request must start cold, or None."""
    argv = request.get("argv")
    if not (isinstance(argv, list) and len(argv) >= 3 and all(isinstance(a, str) for a in argv)):
        return "not an argv list"
    if argv[0] != sys.executable or argv[1] != "-m":
        return f"another interpreter ({argv[0]})"
    if argv[2] not in warmproto.SERVED:
        return f"{argv[2]} is not served warm"
    numbers = request.get("fds") or []
    if not (isinstance(numbers, list) and all(type(n) is int and 3 <= n < HIGH for n in numbers)):
        return f"the descriptor numbers asked for are not all from 3 to {HIGH - 1}"
    if len(set(numbers)) != len(numbers):
        return "a descriptor number is asked for twice"
    env = request.get("env")
    if not isinstance(env, dict) or warmproto.env_key(env) != key:
        return "its environment differs from the warm process's where libraries read it at import"
    if stamp() != started_stamp:
        return "nbtrain or the training stack changed since the warm process started"
    # the run it works on (the first argument that is a run directory): what it uses must be here
    cwd = Path(str(request.get("cwd") or "."))
    for a in argv[3:]:
        paths = RunPaths(cwd / a)
        if not paths.resolved.is_file():
            continue
        try:
            resolved = read_json(paths.resolved)
        except (OSError, ValueError) as e:
            return f"its resolved.json is unreadable ({e})"
        left_out = [n for n in WHY_HIDDEN if sys.modules.get(n, 0) is None]
        used = [n for n in left_out if n not in unused_packages(resolved)]
        if used:
            return f"the run uses {', '.join(used)}, which the warm process leaves out"
        break
    return None


def _child(
    request: dict[str, Any], fds: list[int], ready: int, close: list[socket.socket], lock: int
) -> None:
    """In the forked child: become the requested process, run it, exit. Never returns."""
    code: Any = 1
    try:
        os.setsid()
        for s in close:
            s.close()
        os.close(lock)  # the warm process's own lock: a child must not keep it after the parent is gone
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # the descriptors, the ready pipe's too: out of the way first (numbers at HIGH and up, which no
        # request may ask for), then under the numbers asked for: one of those may be the pipe's number here
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH) for fd in fds]
        moved = fcntl.fcntl(ready, fcntl.F_DUPFD_CLOEXEC, HIGH)
        for fd in [*fds, ready]:
            os.close(fd)
        ready = moved
        log, passed = high[0], high[1:]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        for fd, number in zip(passed, request.get("fds") or [], strict=False):
            os.dup2(fd, int(number))
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()
        random.seed()
        _reseed()
        argv = request["argv"]
        sys.argv = [argv[2], *argv[3:]]
        os.write(ready, b"1")
        os.close(ready)
        try:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException:  # noqa: BLE001 - what an uncaught exception prints cold
            traceback.print_exc()
            code = 1
        with contextlib.suppress(Exception):  # as interpreter exit does: join non-daemon threads
            threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr, flush=True)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        exit_file = request.get("exit_file")
        if exit_file:  # the client is not this process's parent: the exit status goes to where it reads
            with contextlib.suppress(OSError):
                Path(str(exit_file)).write_text(str(code))
        os._exit(code)


def _reseed() -> None:
    """Every child starts from fresh entropy, as a cold process does (the Trainer seeds its own)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


MAX_CLIENTS = 256  # requests being read at once; more wait in the listen queue


def peer_is_me(conn: socket.socket) -> bool:
    """Whether the process at the other end runs as this user (anyone else gets no answer at all)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder) == os.getuid()


def answer(
    conn: socket.socket,
    request: dict[str, Any],
    fds: list[int],
    key: str,
    started_stamp: str,
    lock: int,
    close: list[socket.socket],
    close_fds: list[int],
) -> bool:
    """Answer one whole request: fork its process or say why it starts cold. False when this process must
    exit after it (stale). ``close`` / ``close_fds``: what a forked child must not keep (the listening
    socket, the other clients' connections and the descriptors they sent)."""
    conn.setblocking(True)
    conn.settimeout(10)
    try:
        why = refusal(request, key, started_stamp)
        if why is None and not fds:
            why = "no log descriptor"
        if why is None and len(fds) != 1 + len(request.get("fds") or []):
            why = f"{len(fds) - 1} descriptors came for {len(request.get('fds') or [])} numbers"
        if why is None and threads() != 1:
            why = f"the warm process has {threads()} threads (it forks only with one)"
        if why is not None:
            warmproto.send_reply(conn, {"cold": why})
            return "changed since" not in why
        if client_gone(conn):  # it gave up waiting (and started the process cold): no fork for it
            print(
                f"nbtrain warm: the client gave up; not forking for {' '.join(request['argv'][2:])}",
                flush=True,
            )
            return True
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            for fd in close_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            _child(request, fds, w, [conn, *close], lock)
        os.close(w)
        ok = os.read(r, 1) == b"1"  # the child leads its session now: pgid == pid
        os.close(r)
        try:
            warmproto.send_reply(conn, {"pid": pid} if ok else {"cold": "the forked child did not start"})
        except OSError:  # the client left between the check and the fork: nobody knows this child
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            print(f"nbtrain warm: the client left; killed {pid}, forked for it", flush=True)
            return True
        print(f"nbtrain warm: forked {pid} for {' '.join(request['argv'][2:])}", flush=True)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def client_gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (it waits for the reply with nothing more to send, so anything
    readable is its end of file)."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(10)


def bind(path: Path) -> socket.socket:
    """Listen on ``path`` (mode 0600; created aside and renamed, so a client never sees a dead socket)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        old = os.umask(0o177)
        try:
            srv.bind(f"/proc/self/fd/{dfd}/{tmp.name}")  # any length of directory path
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        srv.listen(128)  # many starts at once queue here; each is answered in milliseconds
        os.replace(tmp, path)
    finally:
        os.close(dfd)
    return srv


MEMORY_CHECK_S = 5.0  # how often an idle warm process looks at the machine's available memory


def memory_short() -> str | None:
    """Why this warm process must give its memory back now (the machine's available memory is below the
    floor), or None."""
    vm = psutil.virtual_memory()
    return warmproto.memory_short(int(vm.available), int(vm.total))


def make_room(me: int) -> int:
    """Ask the least recently used idle warm processes of this user to exit (and wait until they have) until
    at most ``NBTRAIN_WARM_MAX`` are left with this one; returns how many exited. One still importing (no
    socket yet) or reading another request is not idle and stays: the next start makes room again."""
    limit = warmproto.max_processes()
    others = [e for e in warmproto.registered() if int(e["pid"]) != me]
    excess = len(others) + 1 - limit
    gone = 0
    for entry in others:  # least recently used first
        if excess <= 0:
            break
        why = f"warm process {me} starts and at most {limit} per user are kept ({warmproto.ENV_MAX})"
        if warmproto.ask_to_exit(entry, why):
            warmproto.wait_gone(int(entry["pid"]), float(entry["created"]))
            idle_s = time.time() - float(entry["last_used"])
            print(
                f"nbtrain warm: warm process {entry['pid']} (key {entry.get('key')}, {entry.get('folder')}, "
                f"idle {idle_s:.0f} s) exited to make room: {why}",
                flush=True,
            )
            excess -= 1
            gone += 1
    if excess > 0:
        print(
            f"nbtrain warm: {excess} warm process(es) over {warmproto.ENV_MAX}={limit} are busy; kept",
            flush=True,
        )
    return gone


def serve(idle: float) -> int:
    t0 = time.monotonic()
    key = warmproto.env_key(os.environ)  # before preload sets its own variables
    folder = warmproto.warm_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if why := warmproto.folder_problem(folder):
        print(f"nbtrain warm: not serving: {why}", flush=True)
        return 1
    lock = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"nbtrain warm: another warm process serves key {key}", flush=True)
        return 0
    os.ftruncate(lock, 0)  # who holds it, for a stop that comes while the imports still run
    os.write(lock, f"{os.getpid()} {_created()}".encode())
    entry_info = {"pid": os.getpid(), "created": _created(), "key": key, "folder": str(folder),
                  "python": sys.executable, "started": time.time()}  # fmt: skip
    entry = warmproto.register(entry_info)
    try:
        make_room(os.getpid())  # before the imports: the memory they take is given back first
        return _serve(t0, key, folder, lock, idle, entry, entry_info)
    finally:
        if entry is not None:
            entry.unlink(missing_ok=True)


def _serve(
    t0: float, key: str, folder: Path, lock: int, idle: float, entry: Path | None, entry_info: dict[str, Any]
) -> int:
    failed = preload()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
        print("nbtrain warm: an import initialised CUDA; this process cannot fork runs, exiting", flush=True)
        return 1
    started_stamp = stamp()
    path = warmproto.socket_path(key)
    srv = bind(path)
    me = os.stat(path).st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are collected by the system: no zombies
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    info = {
        "pid": os.getpid(), "key": key, "socket": str(path), "python": sys.executable,
        "ready_s": round(time.monotonic() - t0, 2), "not_preloaded": failed, "started": time.time(),
        "created": _created(),
    }  # fmt: skip
    print(f"nbtrain warm: ready in {info['ready_s']} s, {json.dumps(info)}", flush=True)
    (folder / f"{key}.json").write_text(json.dumps(info))
    if entry is not None:
        warmproto.register({**entry_info, "socket": str(path)})  # ready: it can be asked to exit now
    try:
        make_room(os.getpid())  # again: others that were still importing may be ready now
        return loop(srv, idle, key, started_stamp, lock, entry)
    finally:
        try:
            if os.stat(path).st_ino == me:
                path.unlink()
                (folder / f"{key}.json").unlink(missing_ok=True)
        except OSError:
            pass
        srv.close()


def loop(
    srv: socket.socket, idle: float, key: str, started_stamp: str, lock: int, entry: Path | None = None
) -> int:
    """Serve until idle for ``idle`` s, stale, short of memory or asked to exit. Many clients at once: each
    request is read as its bytes come (warmproto.RequestReader) and answered when whole, so a client that
    stalls or trickles holds up nobody (it is cut off after REQUEST_SECONDS); one thread throughout, as
    fork needs. ``entry``: its file in the user's folder, touched at each request (when it was last used).
    An exit request (``{"exit": why}``, contract.warmproto.ask_to_exit) is answered between requests, and only
    while no other request is being read."""
    srv.setblocking(False)
    pending: dict[socket.socket, warmproto.RequestReader] = {}
    last = time.monotonic()
    next_check = last  # the first memory check comes at once
    with selectors.DefaultSelector() as sel:

        def drop(conn: socket.socket) -> None:
            sel.unregister(conn)
            pending.pop(conn).close()

        listening = False
        try:
            while True:
                if listening != (len(pending) < MAX_CLIENTS):  # full: the rest wait in the listen queue
                    listening = not listening
                    if listening:
                        sel.register(srv, selectors.EVENT_READ)
                    else:
                        sel.unregister(srv)
                now = time.monotonic()
                idle_wait = min(idle - (now - last), next_check - now)
                wait = min([r.deadline - now for r in pending.values()], default=idle_wait)
                events = sel.select(max(0.0, wait))
                now = time.monotonic()
                if not events and not pending and now - last >= idle:
                    print(f"nbtrain warm: idle for {idle:.0f} s, exiting", flush=True)
                    return 0
                if not events and not pending and now >= next_check:
                    next_check = now + MEMORY_CHECK_S
                    if why := memory_short():
                        print(f"nbtrain warm: {why}: exiting to give its memory back", flush=True)
                        return 0
                for sk, _ in events:
                    if sk.fileobj is srv:
                        accept(srv, sel, pending)
                        continue
                    conn = sk.fileobj
                    assert isinstance(conn, socket.socket)
                    try:
                        got = pending[conn].feed()
                    except ValueError as e:  # malformed, too large, nested too deep: refused, never fatal
                        print(f"nbtrain warm: {e}; the connection is closed", flush=True)
                        with contextlib.suppress(OSError):  # the client starts cold, told why
                            warmproto.send_reply(conn, {"cold": str(e)})
                        drop(conn)
                        continue
                    if got is None:
                        continue
                    sel.unregister(conn)
                    del pending[conn]
                    if "exit" in got[0]:
                        if exit_asked(conn, got, bool(pending)):
                            return 0
                        continue
                    last = now
                    if entry is not None:
                        with contextlib.suppress(OSError):
                            os.utime(entry)  # last used now (the least recently used exits first)
                    # what a forked child must not keep: the other clients' connections and descriptors
                    fds = [fd for r in pending.values() for fd in r.fds] + [sel.fileno()]
                    try:
                        keep = answer(conn, *got, key, started_stamp, lock, [srv, *pending], fds)
                    except Exception:  # noqa: BLE001 - one bad request never ends the service
                        print(f"nbtrain warm: request failed:\n{traceback.format_exc()}", flush=True)
                        keep = True
                    finally:
                        conn.close()
                    if not keep:
                        print("nbtrain warm: nbtrain or the training stack changed, exiting", flush=True)
                        return 0
                for conn in [c for c, r in pending.items() if r.expired(now)]:
                    late = f"the warm request did not arrive within {warmproto.REQUEST_SECONDS:g} s"
                    print(f"nbtrain warm: {late}; the connection is closed", flush=True)
                    drop(conn)
        finally:
            for reader in pending.values():
                reader.close()


def exit_asked(conn: socket.socket, got: tuple[dict[str, Any], list[int]], busy: bool) -> bool:
    """Answer an exit request: True (and "exiting") when this process exits now, False (and "busy") while
    another client's request is being read."""
    request, fds = got
    for fd in fds:
        os.close(fd)
    try:
        conn.setblocking(True)
        conn.settimeout(2)
        warmproto.send_reply(conn, {"busy": "a request is being read"} if busy else {"exiting": os.getpid()})
    except OSError:
        return False  # the asker left: it does not count on this exit
    finally:
        conn.close()
    if not busy:
        print(f"nbtrain warm: asked to exit: {request.get('exit')}", flush=True)
    return not busy


def accept(
    srv: socket.socket, sel: selectors.BaseSelector, pending: dict[socket.socket, warmproto.RequestReader]
) -> None:
    """Take the connections waiting on ``srv``: this user's are read from now on, anyone else's closed."""
    while len(pending) < MAX_CLIENTS:
        try:
            conn, _ = srv.accept()
        except (BlockingIOError, InterruptedError):
            return
        if not peer_is_me(conn):
            conn.close()  # not this user's: no answer
            continue
        pending[conn] = warmproto.RequestReader(conn)
        sel.register(conn, selectors.EVENT_READ)


def _created() -> float:
    """This process's start time as psutil tells it (the identity check of ``%finetune warm status``)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    idle = float(os.environ.get(warmproto.ENV_IDLE, "1800"))
    return serve(idle)


if __name__ == "__main__":
    raise SystemExit(main())
