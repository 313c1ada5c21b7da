#!/usr/bin/env bash
# Build and test {{name}} with pinned tools (requirements.txt: componentize-py, pytest, PyYAML),
# installed once into a venv under ~/.cache/wasmop (WASMOP_PYTHON_VENV overrides; the same venv
# wasmop's own scripts use); later runs are offline.
#
#   ./build.sh          build build/{{crate}}.wasm from {{crate}}.py, wasmop_sdk/ and wit/
#   ./build.sh test     run pytest (natively: no Wasm, no cluster)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
CACHE=${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}
VENV=${WASMOP_PYTHON_VENV:-$CACHE/componentize-py-0.25.1}
PYTHON=${PYTHON:-python3}

die() { echo "{{name}}: $*" >&2; exit 1; }

tools() {
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11 or newer"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$("$PYTHON" --version) is too old: the SDK needs Python 3.11 or newer"
  mkdir -p "$(dirname "$VENV")"
  # One installer at a time; the stamp says what is installed.
  exec 9>"$VENV.lock"
  flock 9
  if ! cmp -s requirements.txt "$VENV/.requirements" 2>/dev/null; then
    echo "{{name}}: installing the pinned Python tools into $VENV (first time only)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || die "cannot create a venv at $VENV (is python3-venv installed?)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt ||
      die "cannot install requirements.txt (the first run needs the package index)"
    cp requirements.txt "$VENV/.requirements"
  fi
  flock -u 9
}

build() {
  tools
  mkdir -p build
  local started=$SECONDS
  "$VENV/bin/componentize-py" -d wit/reconciler.wit -w module componentize {{crate}} -p . \
    -o build/{{crate}}.wasm.tmp >&2 || die "componentize-py failed (its message is above)"
  mv build/{{crate}}.wasm.tmp build/{{crate}}.wasm
  echo "{{name}}: built build/{{crate}}.wasm ($(stat -c %s build/{{crate}}.wasm) bytes) in $((SECONDS - started)) s" >&2
}

case "${1:-build}" in
  build) build ;;
  test) tools; "$VENV/bin/python" -m pytest -q -p no:cacheprovider ;;
  *) die "usage: $0 [build | test]" ;;
esac
