# Two commands matter (README): `make demo` and `make test`. Both set everything up from scratch.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Re-install when the dependency list or the tested versions change.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
# DeepSpeed compiles C++ ops on first use (60-120 s each) into a cache that tests and CI reuse: one per
# checkout, since a build names its venv's sources and two checkouts sharing one folder rebuild each other's.
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/nbtrain/torch_extensions/$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)

.PHONY: install demo test check lint typecheck pytest bench faults clean llamacpp slurm deepspeed-ops

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in the same command (STACK-NOTES): an unpinned torch pulls a multi-GB CUDA build.
	# constraints.txt: the versions of everything else that make test passed with.
	$(PY) -m pip install -q torch==2.13.0 -c constraints.txt -e '.[dev,browser]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP) libaio

demo: install
	$(PY) -m nbtrain.ui.demo

lint: install
	$(PY) -m ruff check nbtrain tests bench labextension/build_hook.py
	$(PY) -m ruff format --check nbtrain tests bench labextension/build_hook.py
	# The layer contracts in pyproject.toml (docs/architecture.md): imports point down.
	$(VENV)/bin/lint-imports

typecheck: install
	$(PY) -m mypy

# NBTRAIN_REQUIRE_BROWSER / _LLAMACPP: here those tests fail, rather than skip, when chromium, the lab build
# or llama.cpp is missing.
pytest: install labext chromium slurm
	NBTRAIN_REQUIRE_BROWSER=1 NBTRAIN_REQUIRE_LLAMACPP=1 NBTRAIN_REQUIRE_SLURM=1 $(PY) -m pytest -q -ra --durations=25

# llama.cpp for GGUF export (nbtrain.control.jobs.llamacpp): pip builds llama-cpp-python from its sdist once per
# machine (~4.5 min on 2 cores; then seconds) and its converter is kept in nbtrain's cache. `make test`
# starts it in the background first, at the lowest CPU priority (the timed browser tests run meanwhile);
# the GGUF tests wait for it (its log: the cache's llama.cpp/setup.log).
llamacpp: install
	@echo "llama.cpp setup started in the background (GGUF export; the tests that need it wait for it)"
	@setsid nohup nice -n 19 $(PY) -m nbtrain.control.jobs.llamacpp setup > $(VENV)/llamacpp-setup.out 2>&1 &

# DeepSpeed's CPU ops (tests/deepspeed_ops.py), built like llama.cpp: in the background at the lowest CPU
# priority, once per checkout; the tests that use an op wait on torch's build lock for it.
deepspeed-ops: install
	@echo "DeepSpeed's CPU ops build started in the background (the tests that use them wait for them)"
	@setsid nohup nice -n 19 $(PY) -m tests.deepspeed_ops > $(VENV)/deepspeed-ops.out 2>&1 &

# chromium and SLURM first: on a machine where they cannot be installed, stop before minutes of setup. The
# extension's node half (npm ci, lint, unit tests: ~40 s) runs beside pip's install (~2 min), the type
# check (~70 s on 2 cores) beside the suite's first minutes (the output of each follows); make test fails if
# any does.
test: chromium slurm
	@$(MAKE) --no-print-directory $(LABEXT_CHECKED) > labextension/check.out 2>&1 & node=$$!; \
	$(MAKE) --no-print-directory install; rc=$$?; \
	wait $$node; nrc=$$?; echo "--- the extension's npm ci, lint and tests (beside the install):"; \
	cat labextension/check.out; [ $$rc -eq 0 ] && [ $$nrc -eq 0 ]
	@$(MAKE) --no-print-directory llamacpp deepspeed-ops lint
	@$(MAKE) --no-print-directory typecheck > $(VENV)/typecheck.out 2>&1 & tc=$$!; \
	$(MAKE) --no-print-directory pytest; rc=$$?; \
	wait $$tc; trc=$$?; echo "--- make typecheck (beside the suite):"; cat $(VENV)/typecheck.out; \
	[ $$rc -eq 0 ] && [ $$trc -eq 0 ]

# The fast tier, to iterate with: lint, types and every test that starts no training process, drives no
# browser and needs no GPU (make test runs them all). It runs as on a fresh clone whatever the background
# builds have reached (tests/fresh_builds.py): llama.cpp not set up, in a cache of its own that it never is.
check: lint typecheck
	NBTRAIN_CACHE_DIR="$(CURDIR)/$(VENV)/check-cache" $(PY) -m pytest -q -x -p tests.fresh_builds \
		-m "not slow and not browser and not gpu"

bench: install
	$(PY) -m bench

# Every fault and hostile input of tests/faults/replay.py, with 20 kills around checkpoint rotation.
faults: install
	$(PY) -m tests.faults.replay

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache test-output labextension/node_modules \
		labextension/lib labextension/build-test labextension/check.out nbtrain/labextension

# The JupyterLab extension (TypeScript -> nbtrain/labextension, shipped in the wheel as shared-data):
# ESLint + tsc type-check, node unit tests of its logic, then the build, through the top-level package.json
# (whose build:prod is what `pip install .` runs on a tree without a build). `make test` runs it (the
# browser tests need the build).
.PHONY: labext browser-test
LABEXT_NODE := labextension/node_modules/.installed
$(LABEXT_NODE): labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund
	touch $@

# The extension's node half (ESLint + tsc, its unit tests) needs no venv: `make test` runs it beside pip.
LABEXT_CHECKED := labextension/node_modules/.checked
$(LABEXT_CHECKED): $(LABEXT_NODE) $(wildcard labextension/src/* labextension/test/* labextension/*.json) \
		labextension/eslint.config.mjs
	npm run -s lint && npm test --silent
	touch $@

LABEXT_DEV := $(VENV)/share/jupyter/labextensions/nbtrain
labext: install $(LABEXT_CHECKED)
	PATH="$(abspath $(VENV))/bin:$$PATH" npm run -s build
	# Like `jupyter labextension develop`: the venv's JupyterLab loads this build, not a copy made at install.
	rm -rf $(LABEXT_DEV) && ln -s $(abspath nbtrain/labextension) $(LABEXT_DEV)

# The browser tests drive Debian's chromium (never a browser that a tool downloads). A fresh machine of this
# kind has none: install it when we may (root with apt-get), else stop at once with the one command to run.
.PHONY: chromium
CHROMIUM ?= chromium
chromium:
	@if command -v $(CHROMIUM) >/dev/null 2>&1; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "make test needs chromium (/usr/bin/chromium) for the browser tests, and there is no apt-get here" \
			"to install Debian's package: install chromium with this system's package manager" >&2; \
		exit 1; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "chromium is missing: installing Debian's package (apt-get install chromium)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else \
		echo "make test needs Debian's chromium for the browser tests; run: sudo apt-get install -y chromium" >&2; \
		exit 1; \
	fi

# The SLURM tests run a real cluster on this machine (tests/slurmcluster.py: munged, slurmctld, two slurmd)
# from Debian's slurm-wlm and munge, installed like chromium: root with apt-get, else stop with the command.
SLURM_PKGS := slurm-wlm munge
slurm:
	@if command -v sbatch >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "make test needs SLURM (slurmctld, slurmd, munged) for the SLURM tests, and there is no apt-get here" \
			"to install Debian's slurm-wlm and munge: install them with this system's package manager" >&2; \
		exit 1; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "SLURM is missing: installing Debian's packages (apt-get install $(SLURM_PKGS))"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SLURM_PKGS) || \
			{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
				$(SLURM_PKGS); }; \
	else \
		echo "make test needs SLURM for the SLURM tests; run: sudo apt-get install -y $(SLURM_PKGS)" >&2; \
		exit 1; \
	fi

# offload: nvme (DeepSpeed ZeRO-Infinity) builds DeepSpeed's async_io op against libaio's header and library
# on first use. Installed like chromium when we may (root with apt-get); otherwise the command to run is
# printed and everything else works (the NVMe test skips, saying why).
.PHONY: libaio
libaio:
	@if [ -e /usr/include/libaio.h ] || [ -e /usr/local/include/libaio.h ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "libaio-dev is missing (offload: nvme needs it): installing Debian's package"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev || \
			{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev; }; \
	else \
		echo "note: offload: nvme needs libaio's header and library: sudo apt-get install -y libaio-dev" \
			"(Fedora: dnf install libaio-devel); the rest of nbtrain works without it" >&2; \
	fi

# Only the JupyterLab tests in headless Debian chromium.
browser-test: labext chromium
	NBTRAIN_REQUIRE_BROWSER=1 $(PY) -m pytest -q -ra -m browser tests/browser
