#!/usr/bin/env bash
# The heavy part of `make test` (after formatting and the import graph), arranged for a 2-core
# machine, where the Rust builds leave a core idle in their serial stretches and the end-to-end
# tests spend most of their time waiting on their control planes:
#
#   1. provisioning (Go builds of the control plane, registry, collector, crane and cosign into
#      the cache; nothing to do when the cache is warm) runs beside the test build, which is
#      also clippy's run (clippy-driver as the workspace wrapper);
#   2. the end-to-end binary (tests/e2e) runs beside every other test binary.
#
# Each step is a row of the phase table (scripts/phases.sh); overlapping rows say so. The
# output of the steps that run beside another goes to $TARGET_DIR/make-test-logs/ and is
# printed once they end (a failure says which log holds what).
#
#   CARGO=cargo TESTENV=target/debug/testenv TARGET_DIR=target bash scripts/test-run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
: "${CARGO:=cargo}" "${TESTENV:?the testenv binary}" "${TARGET_DIR:?cargo\'s target directory}"
PHASES="bash scripts/phases.sh"
LOGS=$TARGET_DIR/make-test-logs
mkdir -p "$LOGS"

say() { printf 'make test: %s\n' "$*" >&2; }
# (A failed phase has printed the phase table already.)
failed() { say "$*"; exit 1; }

# A background step in a session of its own, so that it and its children (go build, control
# planes) can be stopped together when make test stops early.
background=()
start_background() {
  local log=$1; shift
  setsid --wait "$@" >"$log" 2>&1 &
  background+=("$!")
}
stop_background() {
  local pid
  for pid in "${background[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
}
trap stop_background EXIT

# The user's compiled-module cache (what `wasmop push`, `test` and `run` use by default): the
# tests must leave no compile marker there. A host or CLI killed during a compile leaves one,
# and two of them quarantine that module for the user (the demo's `wasmop push` after a bare
# machine's first `make test` failed so). Markers made during this run are listed at the end.
USER_COMPILED=${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}/compiled
STAMP=$LOGS/started
touch "$STAMP"

# 1. Provisioning beside the Rust builds.
say "provisioning beside clippy and the test build (log: $LOGS/provision.log)"
start_background "$LOGS/provision.log" \
  $PHASES run "provision (beside clippy and the test build)" "$TESTENV" provision
provision=${background[-1]}

# Clippy lints the workspace's crates while they are built for the tests (clippy-driver as
# cargo's workspace wrapper, what `cargo clippy` itself uses, with `-D warnings` as
# `cargo clippy -- -D warnings` passes it): one compile of every crate instead of a check of
# every dependency for clippy and a build of the same for the tests (`make clippy` alone still
# runs `cargo clippy`). The wrapper only changes how the workspace's own crates are compiled, so
# every cargo below (and the nested `cargo build -p wasmop` of the tests, which inherits this
# environment) finds them built; dependencies are the same artifacts as without it.
CLIPPY_DRIVER=$("${RUSTC:-rustc}" --print sysroot)/bin/clippy-driver
[ -x "$CLIPPY_DRIVER" ] || failed "no clippy-driver at $CLIPPY_DRIVER (rustup component add clippy)"
export RUSTC_WORKSPACE_WRAPPER=$CLIPPY_DRIVER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
$PHASES run "clippy + build tests (one compile)" $CARGO test --workspace --all-targets --no-run ||
  failed "clippy or the test build failed"

say "waiting for provisioning"
wait "$provision"
status=$?
cat "$LOGS/provision.log"
[ "$status" -eq 0 ] || $PHASES table
[ "$status" -eq 0 ] || failed "provisioning failed (exit $status); its log is above and in $LOGS/provision.log"

# 2. The end-to-end binary (its output streams here) beside the other tests (to a log).
say "the end-to-end tests run beside the other tests (their output: $LOGS/other-tests.log)"
# Four tests at a time (the harness's default is one per core): most of an end-to-end test is
# waiting on its control plane and hosts, not CPU; the tests that need the machine or the
# process to themselves still run alone (their Turn::Alone, tests/README.md).
# E2E_TEST_THREADS=N changes it.
# Each test's turn (tests/src/turns.rs) goes to a timeline: seconds waited and held.
TIMELINE=$LOGS/e2e-timeline.tsv
rm -f "$TIMELINE"
WASMOP_TEST_TIMELINE=$TIMELINE $PHASES cargo-test "end-to-end tests (tests/e2e)" \
  $CARGO test -p wasmop-testenv --test e2e -- --test-threads="${E2E_TEST_THREADS:-4}" &
e2e=$!
$PHASES cargo-test "other tests (beside the end-to-end tests)" bash -c "
  $CARGO test --workspace --exclude wasmop-testenv &&
  $CARGO test -p wasmop-testenv --lib --bins &&
  $CARGO test -p wasmop-testenv --doc" >"$LOGS/other-tests.log" 2>&1
other=$?
wait "$e2e"
e2e_status=$?

# The lone turns run one after another with nothing beside them: their sum is the floor of
# the end-to-end tests' time. The longest shared turns follow.
timeline() {
  [ -s "$TIMELINE" ] || return 0
  say "end-to-end turns (seconds held; lone turns in total: $(awk -F'\t' '$2 == "Alone" { s += $4 } END { printf "%.0f", s }' "$TIMELINE") s; $TIMELINE):"
  { grep -P '\tAlone\t' "$TIMELINE" | sort -t$'\t' -k4,4 -rn
    grep -P '\tShared\t' "$TIMELINE" | sort -t$'\t' -k4,4 -rn | head -8
  } | awk -F'\t' '{ printf "  %-6s %7s  %s\n", $2, $4, $1 }' >&2
  say "the last turns to end (seconds held, ended at seconds since the first turn):"
  sort -t$'\t' -k5,5 -rn "$TIMELINE" | head -6 |
    awk -F'\t' '{ printf "  %-6s %7s %7s  %s\n", $2, $4, $5, $1 }' >&2
}
timeline

say "output of the other tests ($LOGS/other-tests.log):"
cat "$LOGS/other-tests.log"
[ "$other" -eq 0 ] || failed "a test outside the end-to-end binary failed (exit $other); see the output just above"
[ "$e2e_status" -eq 0 ] || failed "an end-to-end test failed (exit $e2e_status); its output is above the other tests' output"
markers=$(find "$USER_COMPILED" -maxdepth 1 -name '*.compiling' -newer "$STAMP" 2>/dev/null)
[ -z "$markers" ] || failed "the tests left compile markers in the user's compiled-module cache ($USER_COMPILED), which quarantine a module for the user's own wasmop commands; a test ran a host or the CLI there instead of in a cache of its own:
$markers"
