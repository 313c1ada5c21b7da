#!/usr/bin/env bash
# The tools a make target needs, checked before it builds anything (every building target of the
# Makefile runs this first with what it needs):
#
#   scripts/prereqs.sh NEED...      e.g. scripts/prereqs.sh rust wasm go
#
# NEEDs:
#   rust      cargo and the toolchain of rust-toolchain.toml (installed with rustup if missing:
#             rustup 1.28+ does not add the file's targets to a toolchain already installed)
#   lint      the rustfmt and clippy components (added with rustup if missing)
#   wasm      the wasm32-wasip2 Rust target (added with rustup if missing)
#   musl      the x86_64-unknown-linux-musl Rust target, for the image (added with rustup)
#   cc        a C compiler (ring and aws-lc-sys compile C)
#   python    Python >= 3.11 with venv (the Python SDK, componentize-py)
#   node      Node.js >= 20.6 and npm (the JavaScript SDK's tests, componentize-js)
#   go        Go >= 1.26 (builds the control-plane binaries, crane, cosign, the Go contenders)
#   binutils  readelf (checks that the image's binary is static)
#   tar       GNU tar (the image's reproducible layer)
#   flock     flock and setsid (util-linux: serialise the Python and JavaScript tools' builds;
#             make test's background provisioning)
#   all       every one of the above
#
# What rustup can add is added (it only touches ~/.rustup). Anything else is reported, one line
# per missing tool with the Debian package that provides it, and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

MIN_PYTHON=3.11
MIN_GO=1.26
MIN_NODE=20.6
missing=()
miss() { missing+=("$1"); }
note() { printf 'prereqs: %s\n' "$*" >&2; }

# `1.26.8` >= `1.26`? (numeric, field by field)
version_at_least() {
  local have=$1 want=$2
  [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" = "$want" ]
}

check_rust() {
  if ! command -v cargo >/dev/null || ! command -v rustup >/dev/null; then
    miss "cargo/rustup: install Rust with rustup (https://rustup.rs; Debian: apt-get install rustup)"
    return 1
  fi
  # The toolchain file's channel: installed with its components and targets when absent.
  if ! rustup run "$(toolchain)" rustc --version >/dev/null 2>&1; then
    note "installing the Rust toolchain $(toolchain) of rust-toolchain.toml"
    rustup toolchain install || { miss "the Rust toolchain $(toolchain): rustup toolchain install (failed)"; return 1; }
  fi
}

toolchain() { sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml; }

# Adds a rustup target or component to the toolchain of rust-toolchain.toml when absent.
rustup_add() {
  local kind=$1 name=$2
  if ! rustup "$kind" list --installed 2>/dev/null | grep -qx "$name\(-x86_64-unknown-linux-gnu\)\?"; then
    note "adding the Rust $kind $name to toolchain $(toolchain)"
    rustup "$kind" add "$name" || miss "the Rust $kind $name: rustup $kind add $name (failed)"
  fi
}

check_cc() {
  local cc=${CC:-cc}
  command -v "${cc%% *}" >/dev/null ||
    miss "a C compiler ($cc) for ring and aws-lc-sys: Debian: apt-get install gcc (or build-essential)"
}

# at_least CMD MIN VERSION ABSENT OLD: CMD is on PATH and the function VERSION prints its version,
# >= MIN. Else one missing line, "CMD >= MIN: ABSENT" or "CMD >= MIN (found HAVE): OLD", and
# returns 1 (no CMD) or 2 (too old), for the caller to skip the checks that need CMD.
at_least() {
  local cmd=$1 min=$2 version=$3 absent=$4 old=$5
  if ! command -v "$cmd" >/dev/null; then
    miss "$cmd >= $min: $absent"
    return 1
  fi
  local have
  have=$("$version" 2>/dev/null) || have=0
  version_at_least "$have" "$min" || { miss "$cmd >= $min (found $have): $old"; return 2; }
}

python_version() { python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
node_version() { node -p 'process.versions.node'; }
go_version() { go env GOVERSION | sed 's/^go//; s/[^0-9.].*//'; }

check_python() {
  at_least python3 "$MIN_PYTHON" python_version "Debian: apt-get install python3 python3-venv" \
    "Debian 12+: apt-get install python3, or pyenv" || return 0
  python3 -c 'import venv, ensurepip' 2>/dev/null ||
    miss "Python's venv with ensurepip: Debian: apt-get install python3-venv"
}

check_node() {
  # A node too old still has its npm checked; no node, no npm check.
  at_least node "$MIN_NODE" node_version "Debian 13+: apt-get install nodejs npm (or https://nodejs.org)" \
    "https://nodejs.org (Debian's nodejs is older before Debian 13)" || [ $? -eq 2 ] || return 0
  command -v npm >/dev/null || miss "npm: Debian: apt-get install npm"
}

check_go() {
  at_least go "$MIN_GO" go_version "https://go.dev/dl/ (Debian's golang-go is older; put go on PATH)" \
    "https://go.dev/dl/ (Debian's golang-go is older)" || true
}

check_binutils() {
  command -v readelf >/dev/null || miss "readelf: Debian: apt-get install binutils"
}

check_tar() {
  tar --version 2>/dev/null | grep -q 'GNU tar' || miss "GNU tar: Debian: apt-get install tar"
}

check_flock() {
  command -v flock >/dev/null || miss "flock: Debian: apt-get install util-linux"
  command -v setsid >/dev/null || miss "setsid: Debian: apt-get install util-linux"
}

needs=("$@")
[ ${#needs[@]} -gt 0 ] || { echo "usage: $0 NEED... (see the script's header)" >&2; exit 2; }
[ "${needs[*]}" = all ] && needs=(rust lint wasm musl cc python node go binutils tar flock)
# The Makefile and the scripts read cargo's target directory with python3 (any version).
[[ " ${needs[*]} " == *" python "* ]] || command -v python3 >/dev/null ||
  miss "python3: Debian: apt-get install python3"
rust_ok=false
for need in "${needs[@]}"; do
  [ "$need" = rust ] && check_rust && rust_ok=true
done
for need in "${needs[@]}"; do
  case $need in
    rust) ;;
    lint) $rust_ok && { rustup_add component rustfmt; rustup_add component clippy; } ;;
    wasm) $rust_ok && rustup_add target wasm32-wasip2 ;;
    musl) $rust_ok && rustup_add target x86_64-unknown-linux-musl ;;
    cc) check_cc ;;
    python) check_python ;;
    node) check_node ;;
    go) check_go ;;
    binutils) check_binutils ;;
    tar) check_tar ;;
    flock) check_flock ;;
    *) echo "prereqs: unknown need $need (see $0)" >&2; exit 2 ;;
  esac
done

if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do printf 'missing: %s\n' "$m" >&2; done
  exit 1
fi
