"""A real install. `pip wheel .`, an sdist, and `pip install` of the sdist's sources (no lab extension built
yet, so pip's build hook builds it with npm) each go into a fresh venv of their own; there Jupyter lists
both extensions enabled and OK and `%load_ext nbtrain` works. Without node the build stops naming node and
npm. And a fresh machine: `make chromium` with chromium hidden from PATH installs Debian's package when it
may, else stops at once with the one command to run.

The fresh venvs see the project venv's dependencies through a .pth line (pip --no-deps, no network): a
path line adds the directory but runs none of its .pth files, so the project's editable nbtrain stays out
and the nbtrain imported there is the one just installed (each check asserts where it came from).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

BUILT = ROOT / "nbtrain" / "labextension"
DATA = "nbtrain-0.1.0.data/data/"


@pytest.fixture(autouse=True)
def _browser_prerequisites() -> None:
    """Replaces the browser tests' check (no chromium needed here): node/npm, JupyterLab and the build."""
    why = None
    if shutil.which("node") is None or shutil.which("npm") is None:
        why = "no node/npm on PATH (the lab extension is built with them)"
    elif not (BUILT / "package.json").exists():
        why = "the lab extension is not built (make labext)"
    elif shutil.which("make") is None:
        why = "no make"
    else:
        try:
            import hatch_jupyter_builder  # noqa: F401
            import jupyterlab  # noqa: F401
        except ImportError as e:
            why = f"{e.name} is not installed (pip install -e '.[dev,browser]')"
    if why is None:
        return
    if os.environ.get("NBTRAIN_REQUIRE_BROWSER"):
        pytest.fail(f"the install tests are required here (NBTRAIN_REQUIRE_BROWSER) but {why}")
    pytest.skip(why)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "PYTHON"))}
    return {**env, **extra}


def _run(argv: list[str | Path], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _fresh_venv(where: Path) -> Path:
    """A new venv without pip whose only extra is a path line to the project venv's site-packages."""
    _run([sys.executable, "-m", "venv", "--without-pip", where])
    (site,) = where.glob("lib/python*/site-packages")
    (site / "project_venv_deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    return where / "bin" / "python"


def _pip_install(python: Path, what: Path, env: dict[str, str]) -> None:
    # --ignore-installed: the project venv's nbtrain is visible through the .pth; leave it alone.
    _run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
         "--no-build-isolation", what],
        env=env,
    )  # fmt: skip


def _check_installed(python: Path, tmp: Path) -> None:
    """`jupyter labextension list` / `jupyter server extension list` (the modules those commands run, with
    this venv's python) find nbtrain in this venv, enabled and OK; `%load_ext nbtrain` registers the magics
    from this venv's nbtrain without importing torch."""
    prefix = python.parent.parent
    tmp.mkdir()
    env = _env(JUPYTER_CONFIG_DIR=str(tmp / "jupyter_config"), JUPYTER_DATA_DIR=str(tmp / "jupyter_data"))

    lab = _run([python, "-m", "jupyterlab.labextensions", "list"], env=env, cwd=tmp)
    section = lab.split(str(prefix / "share" / "jupyter" / "labextensions"), 1)
    assert len(section) == 2, lab
    line = next((ln for ln in section[1].splitlines() if "nbtrain v0.1.0" in ln), "")
    assert "enabled" in line and "OK" in line, lab

    server = _run([python, "-m", "jupyter_server.extension.serverextension", "list"], env=env, cwd=tmp)
    ours = server.split(f"Config dir: {prefix / 'etc' / 'jupyter'}", 1)
    assert len(ours) == 2, server
    ours_text = ours[1].split("Config dir:", 1)[0]
    assert re.search(r"nbtrain\.ui\.server\s+(\x1b\[\d+m)?enabled", ours_text), server
    assert re.search(r"nbtrain\.ui\.server\s+(\x1b\[\d+m)?OK", ours_text), server

    script = """
import sys
from traitlets.config import Config
from IPython.core.interactiveshell import InteractiveShell
c = Config()
c.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=c)
shell.run_cell("%load_ext nbtrain").raise_error()
assert shell.find_cell_magic("finetune") and shell.find_line_magic("finetune"), "no finetune magics"
import nbtrain
print("NBTRAIN", nbtrain.__file__)
print("TORCH", "torch" in sys.modules)
"""
    out = _run([python, "-c", script], env={**env, "IPYTHONDIR": str(tmp / "ipython")}, cwd=tmp)
    assert f"NBTRAIN {prefix}/lib/" in out, out
    assert "TORCH False" in out, out


@pytest.mark.slow
def test_wheel_sdist_and_source_install_each_give_jupyter_both_extensions_and_the_magics(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    env = _env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    # `pip wheel .` of this tree: the lab extension is built already (make labext), so the hook skips npm.
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, ROOT],
         env=env)  # fmt: skip
    (wheel,) = dist.glob("nbtrain-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        config = json.loads(zf.read(DATA + "etc/jupyter/jupyter_server_config.d/nbtrain.json"))
    for name in ("package.json", "install.json", "static/style.js"):
        assert DATA + "share/jupyter/labextensions/nbtrain/" + name in names
    assert any(n.startswith(DATA + "share/jupyter/labextensions/nbtrain/static/remoteEntry.") for n in names)
    assert config["ServerApp"]["jpserver_extensions"] == {"nbtrain.ui.server": True}

    # The sdist: sources and lockfiles to build from, and the built extension (installing it needs no node).
    _run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", dist], env=env, cwd=ROOT)
    (sdist,) = dist.glob("nbtrain-*.tar.gz")
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
        tf.extractall(tmp_path / "src", filter="data")
    for name in (
        "package.json",
        "package-lock.json",
        "labextension/package.json",
        "labextension/package-lock.json",
        "labextension/tsconfig.json",
        "labextension/src/index.ts",
        "labextension/style/index.css",
        "labextension/install.json",
        "labextension/build_hook.py",
        "nbtrain/labextension/package.json",
        "jupyter-config/jupyter_server_config.d/nbtrain.json",
    ):
        assert name in members, name  # fmt: skip
    assert not any(m.startswith(("labextension/node_modules/", "labextension/lib/")) for m in members)
    t_dists = time.monotonic() - t0

    # Without node and npm, a build from sources stops at once and says what to install.
    src = tmp_path / "src" / "nbtrain-0.1.0"
    shutil.rmtree(src / "nbtrain" / "labextension")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "x",
         src],
        capture_output=True, text=True, env=_env(PATH="/nonexistent"), timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert "needs node and npm on PATH" in said and "Install Node.js" in said, said
    assert not (src / "nbtrain" / "labextension").exists()

    # 1. The wheel.
    _pip_install(_fresh_venv(tmp_path / "venv-wheel"), wheel, env)
    _check_installed(tmp_path / "venv-wheel" / "bin" / "python", tmp_path / "wheel-home")
    # 2. The sdist, installed with no node on PATH: it carries the built extension.
    no_node = _env(PATH=str(tmp_path / "venv-sdist" / "bin"))
    _pip_install(_fresh_venv(tmp_path / "venv-sdist"), sdist, no_node)
    _check_installed(tmp_path / "venv-sdist" / "bin" / "python", tmp_path / "sdist-home")
    t_installs = time.monotonic() - t0 - t_dists

    # 3. `pip install .` of the sdist's sources with the built extension removed: pip's build hook runs npm
    # (the top-level package.json's build:prod) and the result works like the others.
    _pip_install(_fresh_venv(tmp_path / "venv-source"), src, env)
    assert any((src / "nbtrain" / "labextension" / "static").glob("remoteEntry.*.js"))
    _check_installed(tmp_path / "venv-source" / "bin" / "python", tmp_path / "source-home")
    print(f"dists {t_dists:.0f} s, two installs {t_installs:.0f} s, total {time.monotonic() - t0:.0f} s")


def _stub(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)


def _make_chromium(tmp_path: Path, uid: int, apt: bool) -> subprocess.CompletedProcess[str]:
    """`make chromium` with a PATH of a few tools only (chromium is not among them), an `id` that says
    `uid`, and (when `apt`) an apt-get that records its arguments instead of installing anything."""
    bindir = tmp_path / f"bin-{uid}-{apt}"
    bindir.mkdir()
    for tool in ("cat", "cksum", "cut"):  # the Makefile's own $(shell ...) at parse time
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    _stub(bindir, "id", f'[ "$1" = -u ] && echo {uid} || exit 1')
    if apt:
        _stub(bindir, "apt-get", f'echo "$DEBIAN_FRONTEND|$*" >> {tmp_path / "apt.log"}')
    make = shutil.which("make")
    assert make is not None
    drop = ("CHROMIUM", "MAKEFLAGS", "MFLAGS", "DEBIAN_FRONTEND")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = str(bindir)
    return subprocess.run(
        [make, "--no-print-directory", "-C", ROOT, "chromium"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_make_chromium_without_chromium_installs_it_as_root_or_stops_at_once_with_the_command(
    tmp_path: Path,
) -> None:
    apt_log = tmp_path / "apt.log"

    # Not root: stop at once with the one command to run, and touch no package manager.
    start = time.monotonic()
    proc = _make_chromium(tmp_path, uid=1000, apt=True)
    assert proc.returncode != 0
    assert "run: sudo apt-get install -y chromium" in proc.stderr, proc.stdout + proc.stderr
    assert time.monotonic() - start < 10
    assert not apt_log.exists()

    # Root without apt-get: stop at once too, saying so.
    proc = _make_chromium(tmp_path, uid=0, apt=False)
    assert proc.returncode != 0
    assert "no apt-get here" in proc.stderr, proc.stdout + proc.stderr

    # Root with apt-get: Debian's package, non-interactively.
    proc = _make_chromium(tmp_path, uid=0, apt=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "installing Debian's package" in proc.stdout
    assert apt_log.read_text(encoding="utf-8").splitlines() == [
        "|update -q",
        "noninteractive|install -y -q chromium",
    ]

    # With chromium on PATH the target does nothing.
    chromium = shutil.which("chromium")
    if chromium is not None:
        apt_log.unlink()
        env = {**os.environ, "PATH": f"{Path(chromium).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(
            [shutil.which("make") or "make", "-s", "-C", ROOT, "chromium"],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
        assert not apt_log.exists()
