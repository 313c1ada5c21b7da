#!/usr/bin/env bash
# Python modules: one command to build one, one to test it, with pinned tools.
#
#   scripts/python-module.sh build APP_DIR APP_MODULE OUT.wasm   componentize APP_DIR/APP_MODULE.py
#   scripts/python-module.sh pytest DIR                          pytest in DIR (its pyproject.toml)
#   scripts/python-module.sh tools                               install the tools, print their venv
#
# The tools (guest-sdk/python/requirements.txt: componentize-py 0.25.1, pytest, PyYAML) are
# installed once into a venv in the cache (`$WASMOP_CACHE`, else `$XDG_CACHE_HOME/wasmop`, else
# ~/.cache/wasmop, as for every other cached tool; WASMOP_PYTHON_VENV overrides); later runs are
# offline. A build is skipped when OUT.wasm was built from the same inputs (WIT, SDK, app, tools).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NAME=python-module
# shellcheck source=scripts/lib/tools.sh
source "$ROOT/scripts/lib/tools.sh"
REQUIREMENTS="$ROOT/guest-sdk/python/requirements.txt"
VENV=${WASMOP_PYTHON_VENV:-$CACHE/componentize-py-0.25.1}
PYTHON=${PYTHON:-python3}

tools() {
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11 or newer"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$("$PYTHON" --version) is too old: the SDK's native tests need Python 3.11 or newer"
  install_once "$VENV" "$REQUIREMENTS" .requirements install_tools
}

# A venv with the pinned tools at the empty $VENV (install_once's INSTALL).
install_tools() {
  echo "$NAME: installing the pinned Python tools into $VENV (first time only)" >&2
  "$PYTHON" -m venv "$VENV" || die "cannot create a venv at $VENV (is python3-venv installed?)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS" ||
    die "cannot install $REQUIREMENTS (the first run needs the package index)"
}

inputs_digest() {
  local app_dir=$1
  { cat "$REQUIREMENTS" "$ROOT/wit/reconciler.wit"
    find "$ROOT/guest-sdk/python/wasmop_sdk" "$app_dir" -maxdepth 1 -name '*.py' -type f | sort | xargs cat
  } | sha256sum | cut -d' ' -f1
}

build() {
  [ $# -eq 3 ] || die "usage: build APP_DIR APP_MODULE OUT.wasm"
  local app_dir app=$2 out=$3
  app_dir=$(cd "$1" && pwd) || die "no app directory $1"
  [ -f "$app_dir/$app.py" ] || die "no $app_dir/$app.py"
  tools
  mkdir -p "$(dirname "$out")"
  build_once "$out" inputs_digest componentize "$app_dir" "$app" "$out"
}

# componentize APP_DIR APP OUT: APP_DIR/APP.py into OUT (build_once's BUILD).
componentize() {
  local app_dir=$1 app=$2 out=$3 started=$SECONDS
  "$VENV/bin/componentize-py" -d "$ROOT/wit/reconciler.wit" -w module componentize "$app" \
    -p "$app_dir" -p "$ROOT/guest-sdk/python" -o "$out.tmp" >&2 ||
    die "componentize-py failed for $app_dir/$app.py (its message is above)"
  mv "$out.tmp" "$out"
  echo "$NAME: built $out ($(stat -c %s "$out") bytes) in $((SECONDS - started)) s" >&2
}

run_pytest() {
  [ $# -eq 1 ] || die "usage: pytest DIR"
  tools
  cd "$1"
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider
}

case "${1:-}" in
  build) shift; build "$@" ;;
  pytest) shift; run_pytest "$@" ;;
  tools) tools; echo "$VENV" ;;
  *) die "usage: $0 build APP_DIR APP_MODULE OUT.wasm | pytest DIR | tools" ;;
esac
