# gpu-cluster developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: help demo venv tools pulumi-tools tools-if-available go-test scheduler-image lint test test-fast preview-local preview-dev clean

help:
	@echo "make demo         the whole stack on a local cluster: up, GPU pods scheduled and gated, destroy"
	@echo "make test         set up .venv, build the pinned tools, lint (ruff, mypy), run every test (Go's too)"
	@echo "make test-fast    lint and run the tests that need no built tools"
	@echo "make tools        build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubeadm, gpu-binpack-scheduler, kwok, OPA, promtool, the monitoring CRDs and the Pulumi CLI into .tools/bin"
	@echo "make pulumi-tools build the Pulumi CLI and the Python plugin scripts into .tools/bin"
	@echo "make scheduler-image build the fragmentation-aware scheduler image with ko into .tools/images (an OCI archive; no registry, no Docker)"
	@echo "make preview-local pulumi preview --diff of the local stack against a fresh local cluster"
	@echo "make preview-dev  pulumi preview --stack dev (needs the Pulumi CLI and a kubeconfig)"

$(BIN)/.installed: requirements.txt requirements-dev.txt
	@echo "==> creating $(VENV) and installing pinned dependencies"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --progress-bar off -r requirements-dev.txt
	@touch $@

venv: $(BIN)/.installed

tools:
	@bash tools/build-tools.sh
	@bash tools/build-pulumi.sh

demo: venv
	$(BIN)/python -m tools.demo

pulumi-tools:
	@bash tools/build-pulumi.sh

# Without Go (a laptop) the integration tests skip with a reason; under CI=true they must run.
tools-if-available:
	@if command -v go >/dev/null 2>&1; then bash tools/build-tools.sh && bash tools/build-pulumi.sh; \
	elif [ "$${CI:-}" = "true" ]; then echo "error: go is required to build the test tools under CI" >&2; exit 1; \
	else echo "==> go not found: integration tests will be skipped (install Go, then: make tools)"; fi

# The scheduler plugin's Go unit tests (scheduler/); like the tools, they need Go.
go-test:
	@if command -v go >/dev/null 2>&1; then bash tools/test-scheduler.sh; \
	elif [ "$${CI:-}" = "true" ]; then echo "error: go is required for the scheduler plugin's tests under CI" >&2; exit 1; \
	else echo "==> go not found: the scheduler plugin's Go tests are skipped"; fi

# The gpu-binpack-scheduler image (scheduler/) as an OCI archive, built offline with ko.
scheduler-image:
	@bash tools/build-scheduler-image.sh

lint: venv
	@echo "==> ruff"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@echo "==> mypy"
	$(BIN)/mypy .

test: venv tools-if-available lint go-test
	@echo "==> pytest"
	$(BIN)/python -m pytest

test-fast: venv lint
	$(BIN)/python -m pytest -m "not integration"

preview-local: venv
	$(BIN)/python -m tools.demo --preview

preview-dev: venv
	pulumi preview --stack dev

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
