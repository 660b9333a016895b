# make test: everything CI runs, from a fresh clone (installs its own venv and apt packages).
# make test-unit: the quick part (no VM).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: all venv lint test test-unit test-lab test-deploy lab-deps clean demo bench

all: test

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lab]'
	touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check ipvsctl tests

test-unit: venv
	$(BIN)/pytest -q tests/unit

# Real-kernel tests: boots Debian's kernel once under qemu (virtme-ng) and runs tests/lab
# inside. IPVSCTL_VM_KVM=1 uses KVM where it works.
lab-deps:
	bash tests/lab/install-deps.sh

test-lab: venv lab-deps
	$(BIN)/python -m tests.lab.boot

test-deploy: venv
	bash tests/deploy/run.sh

test: lint test-unit test-deploy test-lab

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache out
