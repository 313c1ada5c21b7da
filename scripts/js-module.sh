#!/usr/bin/env bash
# JavaScript modules: one command to build one, one to test it, with pinned tools.
#
#   scripts/js-module.sh build APP_DIR APP_NAME OUT.wasm   componentize APP_DIR/APP_NAME.js
#   scripts/js-module.sh hook HOOK_FILE.js OUT.wasm        a Metacontroller hook (fission-style
#                                                          CommonJS, unchanged): `hook` world
#   scripts/js-module.sh test DIR                          node --test DIR's tests
#   scripts/js-module.sh tools                             install the tools, print their dir
#
# The tools (guest-sdk/js/tools/package.json and its package-lock.json: componentize-js 0.23.0,
# jco 1.35.0) are installed once with `npm ci` into the cache (`$WASMOP_CACHE`, else
# `$XDG_CACHE_HOME/wasmop`, else ~/.cache/wasmop, as for every other cached tool;
# WASMOP_JS_TOOLS overrides); later runs are offline. A build is skipped when OUT.wasm was built
# from the same inputs (WIT, SDK, build script, app, tools). Tests need node only: the SDK's
# resolve hook maps `wasmop-sdk` to guest-sdk/js, no npm install (the SDK's own
# tests/hook-component.test.js also builds a hook with this script, so it needs the tools).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NAME=js-module
# shellcheck source=scripts/lib/tools.sh
source "$ROOT/scripts/lib/tools.sh"
SDK="$ROOT/guest-sdk/js"
LOCK="$SDK/tools/package-lock.json"
TOOLS=${WASMOP_JS_TOOLS:-$CACHE/componentize-js-0.23.0}
MIN_NODE=20.6

need_node() {
  command -v node >/dev/null || die "node not found: install Node.js $MIN_NODE or newer (Debian: apt-get install nodejs npm)"
  local have
  have=$(node -p 'process.versions.node')
  [ "$(printf '%s\n%s\n' "$MIN_NODE" "$have" | sort -V | head -n1)" = "$MIN_NODE" ] ||
    die "node $have is too old: the SDK needs Node.js $MIN_NODE or newer (module.register)"
}

tools() {
  need_node
  command -v npm >/dev/null || die "npm not found: install npm (Debian: apt-get install npm)"
  command -v flock >/dev/null || die "flock not found: Debian: apt-get install util-linux"
  install_once "$TOOLS" "$LOCK" .package-lock.json install_tools
}

# npm ci of the pinned tools into the empty $TOOLS (install_once's INSTALL).
install_tools() {
  echo "$NAME: installing the pinned JavaScript tools into $TOOLS (first time only)" >&2
  mkdir -p "$TOOLS"
  cp "$SDK/tools/package.json" "$LOCK" "$TOOLS/"
  (cd "$TOOLS" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2) ||
    { rm -rf "$TOOLS"; die "cannot install $LOCK with npm ci (the first run needs the npm registry)"; }
}

inputs_digest() {
  local app_dir=$1
  { cat "$LOCK" "$ROOT/wit/reconciler.wit" "$SDK/tools/build.mjs"
    (cd "$SDK/src" && find . -name '*.js' -type f | sort | xargs cat)
    # The app's sources, by relative path (the build stages the same files).
    (cd "$app_dir" && find . \( -name node_modules -o -name tests -o -name test -o -name build -o -name '.?*' \) -prune \
      -o -type f \( -name '*.js' -o -name '*.mjs' \) -print | sort | while read -r f; do echo "$f"; cat "$f"; done)
  } | sha256sum | cut -d' ' -f1
}

build() {
  [ $# -eq 3 ] || die "usage: build APP_DIR APP_NAME OUT.wasm"
  local app_dir app=$2 out=$3
  app_dir=$(cd "$1" && pwd) || die "no app directory $1"
  [ -f "$app_dir/$app.js" ] || die "no $app_dir/$app.js"
  tools
  mkdir -p "$(dirname "$out")"
  out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
  build_once "$out" inputs_digest componentize "$app_dir" "$app" "$out"
}

# componentize APP_DIR APP OUT: APP_DIR/APP.js into OUT (build_once's BUILD).
componentize() {
  local app_dir=$1 app=$2 out=$3
  node "$SDK/tools/build.mjs" "$TOOLS" "$ROOT/wit" "$SDK/src" "$app_dir" "$app" "$out" ||
    die "componentize-js failed for $app_dir/$app.js (its message is above)"
}

hook_inputs_digest() {
  local hook_file=$1
  cat "$LOCK" "$ROOT/wit/reconciler.wit" "$SDK/tools/build-hook.mjs" "$SDK/src/hook.js" "$hook_file" |
    sha256sum | cut -d' ' -f1
}

hook() {
  [ $# -eq 2 ] || die "usage: hook HOOK_FILE.js OUT.wasm"
  local hook_file out=$2
  [ -f "$1" ] || die "no hook file $1"
  hook_file=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  tools
  mkdir -p "$(dirname "$out")"
  out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
  build_once "$out" hook_inputs_digest componentize_hook "$hook_file" "$out"
}

# componentize_hook HOOK_FILE OUT: the hook file, unchanged, into OUT (build_once's BUILD).
componentize_hook() {
  local hook_file=$1 out=$2
  node "$SDK/tools/build-hook.mjs" "$TOOLS" "$ROOT/wit" "$SDK/src" "$hook_file" "$out" ||
    die "componentize-js failed for the hook $hook_file (its message is above)"
}

run_tests() {
  [ $# -eq 1 ] || die "usage: test DIR"
  need_node
  local dir
  dir=$(cd "$1" && pwd) || die "no directory $1"
  local files
  files=$(cd "$dir" && find tests -name '*.test.js' -o -name '*.test.mjs' 2>/dev/null | sort)
  [ -n "$files" ] || die "no tests/*.test.js in $dir"
  cd "$dir"
  # shellcheck disable=SC2086
  node --import "$SDK/src/register.js" --test $files
}

case "${1:-}" in
  build) shift; build "$@" ;;
  hook) shift; hook "$@" ;;
  test) shift; run_tests "$@" ;;
  tools) tools; echo "$TOOLS" ;;
  *) die "usage: $0 build APP_DIR APP_NAME OUT.wasm | hook HOOK_FILE.js OUT.wasm | test DIR | tools" ;;
esac
