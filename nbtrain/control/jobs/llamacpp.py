"""llama.cpp for GGUF export, from the package registry only: set up once per machine, checked for free.

    python -m nbtrain.control.jobs.llamacpp setup     # or: nbtrain gguf-setup; `make test` starts it early
    python -m nbtrain.control.jobs.llamacpp status

The ``llama-cpp-python`` sdist (pinned: ``contract.ggufcache.LLAMA_CPP_PYTHON``) vendors llama.cpp. Setting up
builds it with pip (CMake, CPU; ~4.5 minutes on 2 cores, measured) into the environment -- pip keeps the
built wheel, so a second environment on the machine installs it in seconds -- and keeps the sdist's
converter (``convert_hf_to_gguf.py`` with its ``conversion/`` package, ``convert_lora_to_gguf.py``,
``gguf-py``) in nbtrain's cache (``contract.ggufcache.llama_cpp_dir``), since the wheel leaves it out.
Nothing is cloned and no binary is downloaded; an export itself downloads nothing.

The kernel side of an export asks ``missing()`` (whether the package is installed -- found, not imported --
and the converter kept) and ``architectures()`` (the converter's own map of the model classes it converts,
read from its source as data, nothing of it run).
"""

from __future__ import annotations

import ast
import fcntl
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from importlib import util
from pathlib import Path

from nbtrain.contract import ggufcache
from nbtrain.contract.errors import NbtrainError

PACKAGE = "llama-cpp-python"
BUILD_MINUTES = 5  # measured: 4.5 min on 2 cores (pip wheel, CPU backend)
# The sdist's files the export needs (below vendor/llama.cpp/), kept in llama_cpp_dir().
KEPT = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion", "gguf-py", "LICENSE")
CONVERTER = "convert_hf_to_gguf.py"


def tools_dir() -> Path:
    return ggufcache.llama_cpp_dir()


def _lock_path() -> Path:
    return tools_dir().parent / "setup.lock"


def log_path() -> Path:
    return tools_dir().parent / "setup.log"


SERVER_EXTRA = ("uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


def installed() -> bool:
    """llama_cpp and its OpenAI server's packages importable here (found on the path, not imported:
    llama_cpp loads a native library)."""
    return all(util.find_spec(m) is not None for m in ("llama_cpp", *SERVER_EXTRA))


def kept() -> bool:
    return (tools_dir() / ggufcache.CONVERTED).is_file()


class NotSetUp(NbtrainError):
    """A GGUF export on a machine where llama.cpp is not set up: the message is one paragraph naming the
    command that sets it up, and IPython shows it without a traceback (``_render_traceback_``): the
    cause is this machine's setup, not the code that called export."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def missing() -> str | None:
    """What a GGUF export lacks here, in words with the command that sets it up; None when ready."""
    parts = []
    if not installed():
        parts.append(f"{PACKAGE} (llama.cpp; built from source by pip, ~{BUILD_MINUTES} minutes on 2 cores)")
    if not kept():
        parts.append(f"llama.cpp's converter from the {PACKAGE} {ggufcache.LLAMA_CPP_PYTHON} sdist")
    if not parts:
        return None
    return (
        f"GGUF export needs {' and '.join(parts)}, not set up on this machine yet: run `%finetune "
        "gguf-setup` in a notebook cell (or `nbtrain gguf-setup` in a terminal) once on this machine, then "
        "this export again; `pip install 'nbtrain[gguf]'` installs the package alone"
    )


def architectures() -> tuple[set[str], set[str]]:
    """(text models, vision projectors) the kept converter converts: its TEXT_MODEL_MAP and
    MMPROJ_MODEL_MAP, read as literals from conversion/__init__.py."""
    source = (tools_dir() / "conversion" / "__init__.py").read_text(encoding="utf-8")
    maps: dict[str, set[str]] = {}
    for node in ast.parse(source).body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("TEXT_MODEL_MAP", "MMPROJ_MODEL_MAP") and value:
            maps[target.id] = set(ast.literal_eval(value))
    return maps.get("TEXT_MODEL_MAP", set()), maps.get("MMPROJ_MODEL_MAP", set())


def _pip(*args: str, log: Path, env: dict[str, str] | None = None) -> None:
    argv = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    with open(log, "a") as out:
        out.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n")
        out.flush()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode
    if code != 0:
        raise NbtrainError(f"pip {args[0]} failed (exit code {code}); see {log}")


def _sdist(folder: Path, log: Path) -> Path:
    name = f"llama_cpp_python-{ggufcache.LLAMA_CPP_PYTHON}.tar.gz"
    if not (folder / name).is_file():
        _pip("download", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
             f"{PACKAGE}=={ggufcache.LLAMA_CPP_PYTHON}", log=log)  # fmt: skip
    return folder / name


def _keep_converter(sdist: Path) -> None:
    """The converter files out of the sdist into tools_dir(), whole or not at all (renamed in place)."""
    target = tools_dir()
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    prefix = f"llama_cpp_python-{ggufcache.LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.removeprefix(prefix)
            if m.name.startswith(prefix) and rel.split("/")[0] in KEPT and (m.isfile() or m.isdir()):
                m.name = rel
                members.append(m)
        tar.extractall(partial, members=members, filter="data")
    (partial / ggufcache.CONVERTED).write_text(sdist.name + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)


# llama.cpp's AMX kernels (Intel Sapphire Rapids and newer, which -march=native turns on) ran tile
# instructions on threads whose tiles were not configured and the process died of SIGILL ("trap invalid
# opcode ... tilezero" in libggml-cpu) on this project's machines; the build leaves them out (GCC keeps an
# explicit -mno-* over -march=native). AVX-512 and the rest stay native.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_ARGS = (
    f"-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DCMAKE_C_FLAGS='{NO_AMX}' "
    f"-DCMAKE_CXX_FLAGS='{NO_AMX}'"
)


def _wheel(folder: Path, log: Path) -> Path:
    """The llama-cpp-python wheel built with CMAKE_ARGS, once per machine, kept in nbtrain's cache under
    the flags' hash (pip's own wheel cache keys a registry sdist's build by its name alone, so a wheel
    built otherwise -- with AMX, by an earlier nbtrain -- would be taken again)."""
    import hashlib

    where = folder / hashlib.sha256(CMAKE_ARGS.encode()).hexdigest()[:12]
    found = sorted(where.glob(f"llama_cpp_python-{ggufcache.LLAMA_CPP_PYTHON}-*.whl"))
    if found:
        return found[0]
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2), "CMAKE_ARGS": CMAKE_ARGS}
    partial = where.with_name(f".{where.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    _pip("wheel", "--no-deps", "--no-cache-dir", "-w", str(partial),
         f"{PACKAGE}=={ggufcache.LLAMA_CPP_PYTHON}", log=log, env=env)  # fmt: skip
    shutil.rmtree(where, ignore_errors=True)
    os.replace(partial, where)
    return sorted(where.glob("*.whl"))[0]


def setup(*, quiet: bool = False) -> Path:
    """Install llama-cpp-python (pip builds it once per machine) and keep its converter; returns the
    converter's folder. One setup at a time per machine (a second waits, then finds it done)."""
    root = tools_dir().parent
    root.mkdir(parents=True, exist_ok=True)
    log = log_path()
    fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if missing() is None:
            return tools_dir()
        sdist = _sdist(root / "sdist", log)
        if not kept():
            _keep_converter(sdist)
        if not installed():
            if not quiet:
                print(f"nbtrain: building {PACKAGE} {ggufcache.LLAMA_CPP_PYTHON} (llama.cpp, CPU) with pip, "
                      f"~{BUILD_MINUTES} minutes once per machine; log: {log}", flush=True)  # fmt: skip
            wheel = _wheel(root / "wheels", log)
            # [server]: llama_cpp.server, the OpenAI-compatible server the export's README names
            _pip("install", f"{wheel}[server]", "sentencepiece", log=log)
            importlib.invalidate_caches()
        return tools_dir()
    finally:
        os.close(fd)


def wait(timeout: float) -> str | None:
    """Wait (up to ``timeout`` s) for a setup running elsewhere to end; what is still missing after it."""
    if missing() is None:
        return None
    _lock_path().parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return f"llama.cpp's setup still running after {timeout:.0f} s; see {log_path()}"
                time.sleep(2)
    finally:
        os.close(fd)
    importlib.invalidate_caches()
    return missing()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "status"
    if what == "setup":
        try:
            folder = setup()
        except NbtrainError as e:
            print(f"nbtrain: {e}", file=sys.stderr)
            return 1
        print(f"nbtrain: llama.cpp ready ({PACKAGE} {ggufcache.LLAMA_CPP_PYTHON}; converter in {folder})")
        return 0
    if what == "status":
        why = missing()
        print(why or f"llama.cpp ready ({PACKAGE} {ggufcache.LLAMA_CPP_PYTHON}; converter in {tools_dir()})")
        return 0 if why is None else 1
    print("usage: python -m nbtrain.control.jobs.llamacpp setup|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
