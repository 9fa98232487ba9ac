# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchlint-installed
# The CPU wheel: a bare `torch` requirement would pull several GB of CUDA packages.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint-self docs bench clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml Makefile
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@echo "== torchlint examples/  (the findings)"
	@$(VENV)/bin/torchlint examples/ || true
	@echo
	@echo "== torchlint --diff examples/  (what --fix would change; nothing is written)"
	@$(VENV)/bin/torchlint --diff --unsafe-fixes examples/ || true
	@echo
	@echo "== the runtime sanitizer on examples/train.py"
	@if $(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
	  cd examples && $(abspath $(VENV))/bin/torchlint-sanitize --warmup-steps 2 train.py --epochs 1; \
	else \
	  echo "no CUDA device: sanitizer demo skipped"; \
	fi

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup

docs: $(STAMP)
	$(PY) -m torchlint.docs .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .torchlint_cache
