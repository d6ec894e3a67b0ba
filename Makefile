# The two commands of the README: `make stack STACK=...` and `make test`.
# Everything runs from a virtual environment this Makefile makes (.venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLI := $(BIN)/sm120-stacks
STACK ?= ci-mini
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv stack build render check lint typecheck test test-fast golden base-local wheels-local bench clean

help:
	@echo "make stack STACK=NAME   build, then test, the image of stacks/NAME.yaml"
	@echo "make test               lint, typecheck and the whole test suite"
	@echo "make render|check STACK=NAME, make golden (regenerate golden Dockerfiles)"
	@echo "make base-local         the Debian base image tests build on (no registry outside)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

stack: venv
	$(CLI) build $(STACK)
	$(CLI) test $(STACK)

build: venv
	$(CLI) build $(STACK)

render: venv
	$(CLI) render $(STACK)

check: venv
	$(CLI) check

lint: venv
	$(BIN)/ruff check builder tests bench
	$(BIN)/ruff format --check builder tests bench

typecheck: venv
	$(BIN)/mypy builder

test: lint typecheck
	$(BIN)/pytest -ra tests

test-fast: venv
	$(BIN)/pytest -ra -m "not engine" tests

golden: venv
	$(BIN)/python -m tests.golden

base-local:
	scripts/make-base-local.sh

wheels-local:
	scripts/fetch-local-wheels.sh

bench: venv
	$(BIN)/python bench/render_bench.py

clean:
	rm -rf build
