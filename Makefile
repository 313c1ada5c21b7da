# wasmop: the two commands are `make demo` (the main job) and `make test` (everything CI checks).
# Other targets: `make cluster` (a local control plane until Ctrl-C), `make provision` (build the
# control-plane binaries into the cache), plus those in mk/*.mk (modules, benchmarks, ...).

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

.PHONY: test lint fmt-check clippy unit prereqs provision cluster demo testenv

## The test command (CI runs exactly this): formatting, lints, unit tests and end-to-end tests
## against a real local control plane.
test: prereqs fmt-check clippy provision
	$(CARGO) test --workspace
	@echo "make test: all checks passed"

prereqs:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup" >&2; exit 1; }
	@if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then \
		echo "installing the wasm32-wasip2 Rust target"; rustup target add wasm32-wasip2; fi

fmt-check:
	$(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

testenv:
	$(CARGO) build -p wasmop-testenv --bin testenv

## Find or build (first time: minutes, with progress) the control-plane binaries.
provision: testenv
	$(TESTENV) provision

## A local control plane for people: prints `export KUBECONFIG=...`, stays up until Ctrl-C.
cluster: testenv
	$(TESTENV) cluster

## The main job: a local control plane, visibly working. DEMO_ONCE=1 runs the scenario and exits.
demo: testenv
	DEMO_ONCE=$(DEMO_ONCE) TESTENV=$(TESTENV) bash scripts/demo.sh

-include mk/*.mk
