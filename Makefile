# Two commands matter (README): `make demo` and `make test`. Both set everything up from scratch.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Re-install when the dependency list changes.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# DeepSpeed compiles C++ ops on first use (60-120 s each); one cache per machine that tests and CI reuse.
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/nbtrain/torch_extensions

.PHONY: install demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in the same command (STACK-NOTES): an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0 -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(PY) -m nbtrain.demo

lint: install
	$(PY) -m ruff check nbtrain tests bench
	$(PY) -m ruff format --check nbtrain tests bench

typecheck: install
	$(PY) -m mypy

pytest: install
	$(PY) -m pytest -q -ra

test: lint typecheck pytest

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache

# The JupyterLab extension (TypeScript -> nbtrain/labextension, shipped in the wheel as shared-data). Kept
# out of `test`: the Python tests never need the build, so they pass where npm cannot run.
.PHONY: labext browser-test
labext: install
	cd labextension && npm ci --no-audit --no-fund && npx tsc --sourceMap false \
		&& PATH="$(abspath $(VENV))/bin:$$PATH" jupyter-builder build .

# JupyterLab in headless Debian chromium (apt-get install chromium; pip install playwright jupyterlab).
browser-test: labext
	$(PY) -m pip install -q -e ".[dev,browser]"
	$(PY) -m pytest -q -ra -m browser tests/browser
