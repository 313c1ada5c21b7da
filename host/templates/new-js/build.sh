#!/usr/bin/env bash
# Build and test {{name}} with pinned tools (tools/package-lock.json: componentize-js 0.23.0,
# jco 1.35.0), installed once with `npm ci` under ~/.cache/wasmop (WASMOP_JS_TOOLS overrides;
# the same directory wasmop's own scripts use); later runs are offline.
#
#   ./build.sh          build build/{{crate}}.wasm from {{crate}}.js, wasmop-sdk/ and wit/
#   ./build.sh test     run node --test (natively: no Wasm, no cluster)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
CACHE=${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}
TOOLS=${WASMOP_JS_TOOLS:-$CACHE/componentize-js-0.23.0}

die() { echo "{{name}}: $*" >&2; exit 1; }

need_node() {
  command -v node >/dev/null || die "node not found: install Node.js 20.6 or newer"
  node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 6) ? 0 : 1)' ||
    die "node $(node --version) is too old: the SDK needs Node.js 20.6 or newer"
}

tools() {
  need_node
  command -v npm >/dev/null || die "npm not found: install npm"
  command -v flock >/dev/null || die "flock not found (util-linux)"
  mkdir -p "$(dirname "$TOOLS")"
  # One installer at a time; the stamp says what is installed.
  exec 9>"$TOOLS.lock"
  flock 9
  if ! cmp -s tools/package-lock.json "$TOOLS/.package-lock.json" 2>/dev/null; then
    echo "{{name}}: installing the pinned JavaScript tools into $TOOLS (first time only)" >&2
    rm -rf "$TOOLS"
    mkdir -p "$TOOLS"
    cp tools/package.json tools/package-lock.json "$TOOLS/"
    (cd "$TOOLS" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2) ||
      { rm -rf "$TOOLS"; die "cannot install tools/package-lock.json (the first run needs the npm registry)"; }
    cp tools/package-lock.json "$TOOLS/.package-lock.json"
  fi
  flock -u 9
}

case "${1:-build}" in
  build)
    tools
    node tools/build.mjs "$TOOLS" wit wasmop-sdk . {{crate}} build/{{crate}}.wasm ||
      die "componentize-js failed (its message is above)"
    ;;
  test) need_node; node --import ./wasmop-sdk/register.js --test tests/*.test.js ;;
  *) die "usage: $0 [build | test]" ;;
esac
