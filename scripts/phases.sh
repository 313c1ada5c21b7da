#!/usr/bin/env bash
# The phases of `make test` and their durations, printed as a table at the end (also when a
# phase fails, before make stops).
#
#   scripts/phases.sh start              empty the record ($MAKE_PHASES)
#   scripts/phases.sh run NAME CMD...    run CMD; record NAME, its seconds and its result
#   scripts/phases.sh cargo-test NAME CMD...
#                                        the same for `cargo test`, plus one row per test binary
#                                        (its run time, from the harness's `finished in` line)
#   scripts/phases.sh table              print the table
#
# Without $MAKE_PHASES (a make target run on its own), `run` and `cargo-test` only run CMD.
set -uo pipefail

record=${MAKE_PHASES:-}

row() { [ -n "$record" ] && printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$record"; }

table() {
  [ -n "$record" ] && [ -s "$record" ] || return 0
  # Phases overlap (provisioning beside the Rust builds, the end-to-end binary beside the other
  # tests): the total is the wall clock since `start`, not the sum of the rows.
  local total
  if [ -s "$record.start" ]; then
    total=$(awk -v a="$(cat "$record.start")" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  else
    total=$(awk -F'\t' '$1 !~ /^  / { s += $2 } END { printf "%.0f", s }' "$record")
  fi
  {
    echo
    echo "make test: phases"
    printf '  %-48s %8s  %s\n' phase seconds result
    awk -F'\t' '{ printf "  %-48s %8.1f  %s\n", $1, $2, $3 }' "$record"
    printf '  %-48s %8s\n' "total (wall clock)" "$total"
  } >&2
}

run() {
  local name=$1; shift
  [ -n "$record" ] || exec "$@"
  local start status
  start=$(date +%s.%N)
  "$@"
  status=$?
  finish "$name" "$start" "$status"
  [ "$status" -eq 0 ] || table
  return "$status"
}

cargo_test() {
  local name=$1; shift
  [ -n "$record" ] || exec "$@"
  local start status log
  log=$(mktemp)
  start=$(date +%s.%N)
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  finish "$name" "$start" "$status"
  # `Running tests/e2e/smoke.rs (target/debug/deps/smoke-0123abcd)` ... `finished in 12.34s`
  awk '
    /^ *Running / { bin = $NF; gsub(/[()]/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin)
                    src = $2; if (src == "unittests") src = $3; label = bin " (" src ")" }
    /^ *Doc-tests / { label = "doc-tests " $2 }
    /^test result: / && label != "" {
      secs = $NF; sub(/s$/, "", secs); res = ($3 == "ok.") ? "ok" : "FAILED"
      printf "    %s\t%s\t%s\n", label, secs, res; label = "" }
  ' "$log" >>"$record"
  rm -f "$log"
  [ "$status" -eq 0 ] || table
  return "$status"
}

# Records one phase: its name, seconds since `start` and result.
finish() {
  local name=$1 start=$2 status=$3 result=ok
  [ "$status" -eq 0 ] || result="FAILED (exit $status)"
  row "$name" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$result"
}

case ${1:-} in
  start) [ -n "$record" ] && { mkdir -p "$(dirname "$record")"; : >"$record"; date +%s.%N >"$record.start"; } ;;
  run) shift; run "$@" ;;
  cargo-test) shift; cargo_test "$@" ;;
  table) table ;;
  *) echo "usage: $0 start | run NAME CMD... | cargo-test NAME CMD... | table" >&2; exit 2 ;;
esac
