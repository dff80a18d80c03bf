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
	$(PY) -m pip install -q torch==2.13.0 -e '.[dev,browser]'
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

# NBTRAIN_REQUIRE_BROWSER: here the browser tests fail, rather than skip, when chromium or the build is missing.
pytest: install labext
	NBTRAIN_REQUIRE_BROWSER=1 $(PY) -m pytest -q -ra --durations=25

test: lint typecheck pytest

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache test-output labextension/node_modules \
		labextension/lib labextension/build-test nbtrain/labextension

# The JupyterLab extension (TypeScript -> nbtrain/labextension, shipped in the wheel as shared-data):
# ESLint + tsc type-check, node unit tests of its logic, then the build. `make test` runs it (the browser
# tests need the build).
.PHONY: labext browser-test
LABEXT_NODE := labextension/node_modules/.installed
$(LABEXT_NODE): labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund
	touch $@

LABEXT_DEV := $(VENV)/share/jupyter/labextensions/nbtrain
labext: install $(LABEXT_NODE)
	cd labextension && npm run -s lint && npm test --silent && npx tsc --sourceMap false \
		&& PATH="$(abspath $(VENV))/bin:$$PATH" jupyter-builder build .
	cp labextension/install.json nbtrain/labextension/
	# Like `jupyter labextension develop`: the venv's JupyterLab loads this build, not a copy made at install.
	rm -rf $(LABEXT_DEV) && ln -s $(abspath nbtrain/labextension) $(LABEXT_DEV)

# Only the JupyterLab tests in headless Debian chromium (apt-get install chromium).
browser-test: labext
	NBTRAIN_REQUIRE_BROWSER=1 $(PY) -m pytest -q -ra -m browser tests/browser
