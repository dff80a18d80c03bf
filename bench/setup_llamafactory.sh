#!/usr/bin/env bash
# Build the peer's own environment for bench/bench_llamafactory.py: bench/.venv-llamafactory with
# `llamafactory` from PyPI next to the same CPU torch nbtrain uses. Idempotent: a venv that already
# imports LLaMA-Factory's training entry point is left as it is.
#
#   bash bench/setup_llamafactory.sh            # log: bench/.venv-llamafactory.log
#
# Why the extra steps: torch is pinned in the same pip command (STACK-NOTES: an unpinned torch pulls a
# multi-GB CUDA build). pip then resolves torchvision and torchaudio for llamafactory from PyPI, and on
# Linux those are CUDA builds: with the CPU torch they fail at import time (torchaudio:
# "libc10_cuda.so: cannot open shared object file"). LLaMA-Factory imports torchaudio at module level
# (llamafactory/data/mm_plugin.py) even for text-only SFT, so it cannot simply be removed. The
# work-around lives here, in the benchmark's set-up, not in nbtrain. For each of the two that does not
# import: first the CPU build from PyTorch's own index; where that index is unreachable, torchaudio's
# CUDA-linked native libraries (torchaudio/lib/*.so) are deleted -- its loader treats a missing library
# as "extension not available" and the pure-Python package imports -- and torchvision is uninstalled
# (transformers and LLaMA-Factory's text path treat it as optional).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${LLAMAFACTORY_VENV:-$HERE/.venv-llamafactory}"
PYTHON="${PYTHON:-python3.11}"
PY="$VENV/bin/python"

if [[ -x "$VENV/bin/llamafactory-cli" ]] && "$PY" -c "import llamafactory.train.tuner" >/dev/null 2>&1; then
    echo "llamafactory already set up in $VENV"
    exit 0
fi

test -x "$PY" || "$PYTHON" -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install torch==2.13.0 llamafactory psutil

for mod in torchvision torchaudio; do
    if ! "$PY" -m pip show -q "$mod" >/dev/null 2>&1; then
        continue
    fi
    if "$PY" -c "import $mod" >/dev/null 2>&1; then
        echo "$mod imports fine"
        continue
    fi
    echo "$mod does not import: $("$PY" -c "import $mod" 2>&1 | tail -1)"
    version="$("$PY" -c "import importlib.metadata as m; print(m.version('$mod'))")"
    if "$PY" -m pip install -q --retries 0 --timeout 15 --no-deps --force-reinstall "$mod==$version" \
        --index-url https://download.pytorch.org/whl/cpu && "$PY" -c "import $mod" >/dev/null 2>&1; then
        echo "$mod $version: CPU build installed"
    elif [[ "$mod" == torchaudio ]]; then
        lib="$("$PY" -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('torchaudio').origin).parent / 'lib')")"
        rm -f "$lib"/*.so
        "$PY" -c "import torchaudio"
        echo "torchaudio $version: CUDA-linked native libraries removed; the Python package imports"
    else
        "$PY" -m pip uninstall -y -q "$mod"
        echo "$mod: uninstalled (optional for text SFT)"
    fi
done

"$PY" -c "import llamafactory.train.tuner"  # what `llamafactory-cli train` imports
"$VENV/bin/llamafactory-cli" version
