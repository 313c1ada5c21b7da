# wasmop: the two commands are `make demo` (the main job) and `make test` (everything CI checks).
# Other targets: `make help` lists them all with what they do (the `##` lines here and in mk/*.mk).

CARGO ?= cargo
# The target directory as cargo sees it (honours CARGO_TARGET_DIR and .cargo/config.toml), the
# same way scripts/demo.sh finds it; never a hard-coded `target/`.
TARGET_DIR := $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || echo target)
TESTENV := $(TARGET_DIR)/debug/testenv
export CARGO_TERM_COLOR ?= never
# No incremental-compilation state: a fresh clone (CI) never reuses it, and for ~50 test binaries
# it is ~20 GB beside the ~20 GB of the build itself, enough to fill CI's disk. Set
# CARGO_INCREMENTAL=1 for quicker edit-and-rerun cycles in a working copy.
export CARGO_INCREMENTAL ?= 0

.PHONY: help test fmt-check imports clippy provision cluster demo testenv crds monitoring

## Print the targets and what they do (the `##` lines of Makefile and mk/*.mk).
help:
	@awk '/^## / { doc = doc "    " substr($$0, 4) "\n"; next } \
		/^[a-zA-Z0-9_.-]+:/ && doc != "" { split($$0, t, ":"); printf "make %s\n%s", t[1], doc } \
		{ doc = "" }' Makefile mk/*.mk

# --- prerequisites: every target that builds checks (and where it safely can, installs) what it
# needs first; scripts/prereqs.sh says what each NEED is and prints one line per missing tool.
PREREQS := bash scripts/prereqs.sh
.PHONY: prereqs prereqs-rust prereqs-cluster prereqs-demo prereqs-modules prereqs-python \
	prereqs-js prereqs-bench prereqs-image
## Check (and add the Rust targets of) everything `make test` needs.
prereqs:
	@$(PHASES) run prereqs $(PREREQS) all
prereqs-rust:
	@$(PREREQS) rust cc
prereqs-cluster:
	@$(PREREQS) rust cc go
prereqs-demo:
	@$(PREREQS) rust wasm cc go
prereqs-modules:
	@$(PREREQS) rust wasm cc python node flock
prereqs-python:
	@$(PREREQS) python flock
prereqs-js:
	@$(PREREQS) node flock
prereqs-bench:
	@$(PREREQS) rust wasm cc go python flock
prereqs-image:
	@$(PREREQS) rust musl cc go binutils tar

# --- make test: each phase timed (scripts/phases.sh); a table of the phases ends the output.
PHASES := bash scripts/phases.sh
test: export MAKE_PHASES := $(TARGET_DIR)/make-test-phases.tsv

## The test command (CI runs exactly this): formatting, lints, unit tests and end-to-end tests
## against a real local control plane. Ends with a table of its phases and their durations.
## Provisioning runs beside clippy and the test build, the end-to-end binary beside the other
## tests (scripts/test-run.sh).
test: phases-start prereqs fmt-check imports testenv
	@CARGO="$(CARGO)" TESTENV="$(TESTENV)" TARGET_DIR="$(TARGET_DIR)" bash scripts/test-run.sh
	@$(PHASES) table
	@echo "make test: all checks passed"

.PHONY: phases-start
phases-start:
	@$(PHASES) start

fmt-check: prereqs-rust
	$(PHASES) run fmt $(CARGO) fmt --all --check

## No import circle in host/src (scripts/import-graph.py: rooms and files, exit 1 on a circle).
imports:
	$(PHASES) run imports python3 scripts/import-graph.py host/src

clippy: prereqs-rust
	$(PHASES) run clippy $(CARGO) clippy --workspace --all-targets -- -D warnings

# `--workspace`: the dependencies are built with the features the whole workspace unifies, so
# the test build reuses them (with `-p` a cold run built tokio, kube, rustls... twice).
testenv: prereqs-rust
	$(PHASES) run "build testenv" $(CARGO) build --workspace --bin testenv

## Find or build (first time: minutes, with progress) the control-plane binaries.
provision: prereqs-cluster testenv
	$(PHASES) run provision $(TESTENV) provision

## A local control plane for people: prints `export KUBECONFIG=...`, stays up until Ctrl-C.
cluster: prereqs-cluster testenv
	$(TESTENV) cluster

## The main job: a local control plane, visibly working. DEMO_ONCE=1 runs the scenario and exits.
demo: prereqs-demo testenv
	DEMO_ONCE=$(DEMO_ONCE) TESTENV=$(TESTENV) bash scripts/demo.sh

## Regenerate deploy/crds/ and the chart's crds/ from the Rust types (host/src/crd.rs), and
## copy deploy/components/metacontroller/'s resources into the chart (its Metacontroller mode);
## host/tests/crds.rs checks all of them.
crds: prereqs-rust
	$(CARGO) run -p wasmop --bin wasmop -- crdgen > deploy/crds/wasmreconciler.yaml.new
	cp deploy/crds/wasmreconciler.yaml.new deploy/helm/wasmop/crds/wasmreconciler.yaml
	mv deploy/crds/wasmreconciler.yaml.new deploy/crds/wasmreconciler.yaml
	$(CARGO) run -p wasmop --bin wasmop -- crdgen --metacontroller > deploy/components/metacontroller/crds.yaml.new
	mv deploy/components/metacontroller/crds.yaml.new deploy/components/metacontroller/crds.yaml
	rm -f deploy/helm/wasmop/files/metacontroller/*.yaml
	for f in $$(sed -n '/^resources:/,/^[a-z]/s/^- //p' deploy/components/metacontroller/kustomization.yaml); do \
		cp deploy/components/metacontroller/$$f deploy/helm/wasmop/files/metacontroller/$$f || exit 1; done

## Write deploy/monitoring/prometheusrule.yaml and the chart's copies of the alerts and the
## dashboard from deploy/monitoring/alerts.yaml and dashboard.json (tests check they are current).
monitoring:
	python3 scripts/monitoring.py

-include mk/*.mk
