# The two commands of the README: `make stack STACK=...` and `make test`.
# Everything runs from a virtual environment this Makefile makes (.venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLI := $(BIN)/sm120-stacks
STACK ?= ci-mini

.PHONY: help venv host host-registry compose-v2 stack build render check docs docs-check lint typecheck test test-fast golden base-local base-cuda-local wheels-local flagship-local bench bench-flagship bench-cache bench-fleet bench-faults bench-tool-soak bench-kill bench-warm-fleet arm64-emulated clean

help:
	@echo "make stack STACK=NAME   build, then test, the image of stacks/NAME.yaml (MODELS=DIR: the host's model folder)"
	@echo "make test               lint, typecheck and the whole test suite"
	@echo "make render|check STACK=NAME, make golden (regenerate golden Dockerfiles)"
	@echo "make docs               the generated tables of README.md and docs/ (make docs-check: stale?)"
	@echo "make base-local         a Debian + Python base image made here (no registry needed)"
	@echo "make base-cuda-local    a CUDA 13.0 devel base made here from NVIDIA's PyPI wheels"
	@echo "make flagship-local STACK=vllm-0.33-b12x   a flagship on that base (hours on 2 cores)"
	@echo "make bench-flagship STACK=vllm-0.33-b12x   its measurements (bench/RESULTS.md §4)"
	@echo "make bench-rebuild-flagship   the front door built cold, then three children and a no-op (§14)"
	@echo "make bench-cache        a fresh engine builds a ci-mini variant from the registry's cache (bench/RESULTS.md)"
	@echo "make bench-fleet        two hosts (namespaces, sshd, dockerd): roll, rollback, drift (bench/RESULTS.md)"
	@echo "make bench-faults       a private engine restarted mid-build/push/test, a full registry, a prune (bench/FAULTS.md)"
	@echo "make bench-kill         SIGKILL every state-writing command at spread points, invariants checked (bench/FAULTS.md)"
	@echo "make bench-tool-soak    two build folders looping build..verify on the fleet, then leaks counted (bench/FAULTS.md)"
	@echo "make bench-warm-fleet   a warm cache captured on one namespace host, restored and proved on a second"
	@echo "make arm64-emulated     ci-mini for linux/arm64 under qemu here: qemu/binfmt, arm64 bases, build, test (MEASURE=1: timed cold against amd64, bench/RESULTS.md)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	scripts/fetch-local-wheels.sh
	$(BIN)/pip install --quiet --find-links build/wheels -e '.[dev,report]'
	touch $@

venv: $(VENV)/.installed

# The CPU test stacks serve a tiny model made here. Every other stack reads its model (the
# manifest's serve.model.id) from the host's model folder, mounted at /models as a pin mounts
# it: MODELS=DIR, else /var/lib/sm120-stacks/models. `test` stops before any container when a
# smoke would run without it, naming the `hf download` command (docs/gpu-host.md).
MODELS ?= /var/lib/sm120-stacks/models
SMOKE_MOUNTS ?= $(if $(filter ci-mini%,$(STACK)),--volume $(CURDIR)/build/tiny-model:/models/tiny:ro,--models $(MODELS))

# The engine (and, for the tests, a local registry): installed and started on a fresh Debian
# machine as root; two pings when they already run (scripts/host-setup.sh).
host:
	scripts/host-setup.sh

host-registry:
	scripts/host-setup.sh --registry

stack: venv host $(if $(filter ci-mini%,$(STACK)),build/tiny-model base-cuda-local)
	$(CLI) build $(STACK)
	$(CLI) test $(STACK) $(SMOKE_MOUNTS)

build/tiny-model: | venv
	$(BIN)/python -m tests.support.tinymodel $@

build: venv host
	$(CLI) build $(STACK)

render: venv
	$(CLI) render $(STACK)

check: venv
	$(CLI) check

# The generated tables of README.md and docs/ (stacks, rules), from the manifests, the committed
# evidence (bench/results/stack-evidence.yaml) and knowledge/rules.yaml.
docs: venv
	$(CLI) docs

docs-check: venv
	$(CLI) docs --check

# templates/tools/ runs inside every image: the same lint and types as builder/.
LINTED := builder tests bench templates/tools

lint: venv
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy builder templates/tools

# Compose v2 (build/tools/, or the engine's plugin), as .ci/run: tests/engine/test_compose.py
# runs with it. Where none can be had, those tests skip saying so (under CI=true they fail).
compose-v2:
	-scripts/compose-v2.sh

# The slowest tests with their times in build/test-durations.txt (a WARNING line there when the
# engine tests' total passes its budget, tests/conftest.py), and every test's time in
# build/test-junit.xml: `bench/test_time.py build/test-junit.xml` tabulates it by file.
# Two workers (pytest-xdist): the engine tests in order on one (they share the session's
# ci-mini and ci-tiny builds and the registry's repositories), the rest spread over both.
SLOWEST_TESTS ?= 30
TEST_WORKERS ?= 2
test: lint typecheck host-registry compose-v2
	$(BIN)/pytest -ra -n $(TEST_WORKERS) --durations=$(SLOWEST_TESTS) --durations-file=build/test-durations.txt --junitxml=build/test-junit.xml tests

test-fast: venv
	$(BIN)/pytest -ra -m "not engine" tests

golden: venv
	$(BIN)/python -m tests.golden

base-local:
	scripts/make-base-local.sh

base-cuda-local:
	scripts/make-base-cuda-local.sh

wheels-local:
	scripts/fetch-local-wheels.sh

# Flagship stacks on a base made here (no registry needed): too long for CI, hence targets.
flagship-local: venv host
	scripts/flagship-local.sh $(STACK)

bench: venv
	$(BIN)/python bench/render_bench.py

bench-flagship: venv
	bench/flagship.sh $(STACK)

# Issue 37: ci-mini with new compile inputs built (its FlashInfer compile cold), then a child that
# adds `six`: the JIT step of each from their BuildKit logs, bench/results/rebuild-economy/.
# Issue 46: `make bench-rebuild-flagship` (STACK=vllm-0.33-marlin unless named) does the same on
# the front door's local variant: cold, three children and a no-op side by side (about an hour
# and a quarter on 2 cores, 40 GB of disk), bench/results/rebuild-economy/flagship/.
.PHONY: bench-rebuild bench-rebuild-flagship
bench-rebuild: venv base-cuda-local wheels-local
	bench/rebuild-economy.sh

bench-rebuild-flagship: venv base-cuda-local wheels-local
	STACK=$(if $(filter command line,$(origin STACK)),$(STACK),vllm-0.33-marlin) bench/rebuild-flagship.sh

# Heavy, root only: each starts private engines in network namespaces (scripts/fleet-netns.sh)
# and tears them down afterwards.
bench-cache: venv host-registry base-cuda-local
	bench/shared-cache.sh

bench-fleet: venv host-registry base-cuda-local
	bench/fleet.sh

# The engine's own faults on an engine of its own (restarts mid-build, mid-push, mid-test; a
# registry's disk full; a prune mid-test): bench/FAULTS.md, raw logs under bench/results/faults/.
bench-faults: venv host base-cuda-local build/tiny-model
	bench/engine-faults.sh

# Issue 34's sweep: every command that writes state SIGKILLed at points spread over its run (time,
# printed lines), the next command run, the invariants checked; four slices, each with its own
# raw output: images (build, push, pin, deploy --apply), state (lock, propose, list, pull, a fleet
# deploy, cache capture, a restore), serve (test, smoke --record, report, docs), and outages (the
# registry or the engine killed instead). bench/FAULTS.md "Kill it anywhere",
# bench/results/kill-sweep/. Not part of `make test`. KILL_SLICES picks slices.
KILL_SLICES ?= kill_sweep kill_state kill_serve kill_outages
bench-kill: venv host base-cuda-local build/tiny-model
	set -e; for slice in $(KILL_SLICES); do $(BIN)/python bench/$$slice.py; done; \
	$(BIN)/python bench/kill_table.py

# Two loops at once of change, build, test, push, pin, deploy, verify on the namespace fleet,
# then every leak counted (LOOPS, LIMIT_S): bench/FAULTS.md, bench/results/tool-soak/.
bench-tool-soak: venv host base-cuda-local build/tiny-model
	bench/tool-soak.sh

# Issue 24 item 5: capture on namespace host 1 (cold), restore on host 2 with --require-warm,
# `cache prove` there says nothing compiled: bench/results/warm-fleet/.
bench-warm-fleet: venv host-registry base-local
	bench/warm-fleet.sh

# ci-mini-arm64 built and tested on this amd64 machine under emulation (qemu-user-static through
# binfmt_misc, which it installs and registers). Not part of `make test`: CI machines need not
# allow binfmt_misc, and it takes much longer than the amd64 build. The Spark image itself builds
# on an arm64 machine: `make stack STACK=vllm-0.33-spark` there.
arm64-emulated: venv host build/tiny-model
	scripts/arm64-emulated.sh

clean:
	rm -rf build
