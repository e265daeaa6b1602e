# txrepl — developer entry points.  Every target works on a fresh clone.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PROTO_SRC := proto/txrepl/v1/txrepl.proto
RPC_DIR := common/rpc

.PHONY: setup apt demo test test-fast lint proto proto-check bench clean

## setup: system packages (Java, PostgreSQL, JDBC jars) and a virtualenv with txrepl
setup: apt $(VENV)/.installed

apt:
	@bash deploy/scripts/apt-setup.sh

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

## demo: SQLite source -> publisher -> subscriber (Spark) -> SQLite target
demo: $(VENV)/.installed
	$(PY) deploy/demo/demo.py

## test: the whole suite (unit, integration, chaos; slow ones included), in
## TEST_WORKERS processes (pytest-xdist; each has its own PostgreSQL and Spark):
## the tests mostly wait on daemons, so two workers fit a 2-core machine.
## At most 4 tests handed to a worker at a time (--maxschedchunk): by default xdist
## refills a worker with up to a quarter of what is left, so at the end one worker ran
## a long queue of its own for ~11 minutes while the other sat idle (docs/testing.md,
## "Scheduling").
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --maxschedchunk 4
test: $(VENV)/.installed
	$(PY) -m pytest $(XDIST) -m "slow or not slow" --durations=25 tests

test-fast: $(VENV)/.installed
	$(PY) -m pytest $(XDIST) -m "not slow" tests

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(MAKE) proto-check

## proto: regenerate the committed gRPC code from proto/
proto: $(VENV)/.installed
	bash deploy/scripts/gen-proto.sh $(RPC_DIR)

proto-check: $(VENV)/.installed
	bash deploy/scripts/gen-proto.sh --check $(RPC_DIR)

bench: $(VENV)/.installed
	$(PY) -m tests.bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
