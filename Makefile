# A fresh clone needs two commands: `make demo` (the linter alone, no torch, then a lint and a
# fix of examples/) and `make test` (torch's CPU build and the test tools, then the suite).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# pip's own download progress stays on (no -q): torch alone is hundreds of MB.
PIP_INSTALL := $(PIP) install --progress-bar on
LINTER_STAMP := $(VENV)/.torchlint-linter-installed
DEV_STAMP := $(VENV)/.torchlint-dev-installed
DIST_TOOLS_STAMP := $(VENV)/.torchlint-dist-tools-installed
# torch is for the test suite only: the linter never imports it, and the package does not depend
# on it. PyTorch's CPU index serves the CPU build (about 200 MB); the default index serves the
# CUDA build on Linux (several GB), so it is the fallback when the CPU index cannot be reached.
TORCH_PIN ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
REACHABLE := import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)

.PHONY: install demo test lint dist docs clean

$(PY):
	python3 -m venv $(VENV)
	@# Editable installs from pyproject.toml alone need pip 21.3 or newer.
	$(PIP_INSTALL) --upgrade "pip>=21.3"

$(LINTER_STAMP): $(PY) pyproject.toml
	$(PIP_INSTALL) -e .
	touch $@

$(DEV_STAMP): $(PY) pyproject.toml Makefile
	@if $(PY) -c "$(REACHABLE)" "$(TORCH_CPU_INDEX)/torch/" 2>/dev/null; then \
	  echo "== $(TORCH_PIN), CPU build, from $(TORCH_CPU_INDEX)"; \
	  $(PIP_INSTALL) --index-url "$(TORCH_CPU_INDEX)" "$(TORCH_PIN)"; \
	else \
	  echo "== $(TORCH_CPU_INDEX) cannot be reached: $(TORCH_PIN) from the default index"; \
	  echo "   (on Linux that is the CUDA build, several GB, unless pip is configured with a CPU wheel)"; \
	  $(PIP_INSTALL) "$(TORCH_PIN)"; \
	fi
	$(PIP_INSTALL) -e ".[dev]"
	touch $@

install: $(DEV_STAMP)

demo: $(LINTER_STAMP)
	@echo "== torchlint --preview examples/   (the findings; rules are in preview until measured)"
	@$(VENV)/bin/torchlint --preview examples/ || true
	@echo
	@echo "== torchlint --preview --diff --unsafe-fixes examples/train.py   (what a fix changes; nothing is written)"
	@$(VENV)/bin/torchlint --preview --diff --unsafe-fixes examples/train.py || true
	@echo
	@echo "== torchlint --fix --unsafe-fixes --show-fixes, on a copy of examples/ in build/demo/"
	@rm -rf build/demo && mkdir -p build/demo && cp -R examples build/demo/
	@cd build/demo && $(abspath $(VENV))/bin/torchlint --preview --fix --unsafe-fixes --show-fixes examples/ || true
	@echo
	@echo "== the runtime sanitizer on examples/train.py"
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  $(PIP_INSTALL) -e ".[sanitizer]" && \
	  cd examples && $(abspath $(VENV))/bin/torchlint-sanitize --warmup-steps 2 train.py --epochs 1; \
	else \
	  echo "no CUDA device (nvidia-smi lists none): skipped. On a GPU machine this part installs"; \
	  echo "the sanitizer extra (torch with CUDA) and runs examples/train.py under torchlint-sanitize."; \
	fi

test: $(DEV_STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup

# Reports every tool's findings and fails if any has one; it changes no file.
lint: $(DEV_STAMP)
	@status=0; \
	$(VENV)/bin/ruff check torchlint rules sanitizer || status=1; \
	$(VENV)/bin/ruff format --check torchlint rules sanitizer || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

$(DIST_TOOLS_STAMP): $(PY)
	$(PIP_INSTALL) build twine
	touch $@

# The sdist, then the wheel built from it (so a file missing from the sdist breaks the build).
dist: $(DIST_TOOLS_STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

docs: $(LINTER_STAMP)
	$(PY) -m torchlint.docs .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .torchlint_cache
