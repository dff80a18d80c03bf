#!/usr/bin/env bash
# Build the peer's own environment for bench/bench_msswift.py: bench/.venv-msswift with ms-swift
# (`swift sft`) from PyPI next to the same CPU torch nbtrain uses. Idempotent: a venv whose `swift`
# already imports its SFT entry point is left as it is.
#
#   bash bench/setup_msswift.sh            # log: bench/.venv-msswift.log when the bench runs it
#
# torch is pinned in the same pip command (STACK-NOTES: an unpinned torch pulls a multi-GB CUDA build);
# ms-swift 4.x then resolves its own older stack (transformers < 5.20, trl < 1.0, peft < 0.21), which is
# why it gets a venv of its own. Unlike LLaMA-Factory it needs no CPU fix-ups: it imports neither
# torchvision nor torchaudio on the text SFT path. MSSWIFT_VERSION picks another release
# (default 4.6.0, the one the results were measured with).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${MSSWIFT_VENV:-$HERE/.venv-msswift}"
PYTHON="${PYTHON:-python3.11}"
VERSION="${MSSWIFT_VERSION:-4.6.0}"
PY="$VENV/bin/python"

if [[ -x "$VENV/bin/swift" ]] && "$PY" -c "import swift.cli.sft" >/dev/null 2>&1; then
    echo "ms-swift already set up in $VENV"
    exit 0
fi

test -x "$PY" || "$PYTHON" -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install torch==2.13.0 "ms-swift==$VERSION" psutil

"$PY" -c "import swift.cli.sft"  # what `swift sft` runs
"$PY" -c "import importlib.metadata as m; print('ms-swift', m.version('ms-swift'))"
