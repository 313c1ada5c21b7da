#!/usr/bin/env bash
# Python modules: one command to build one, one to test it, with pinned tools.
#
#   scripts/python-module.sh build APP_DIR APP_MODULE OUT.wasm   componentize APP_DIR/APP_MODULE.py
#   scripts/python-module.sh hook HOOK.py OUT.wasm               a Metacontroller http.server hook
#                                                                file, unchanged, into a component
#                                                                of the `hook` world
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

# A hook file is run by wasmop_sdk.hook from a generated entry (the app componentize-py imports),
# which finds it on the Python path by its name: a plain file name, not a standard module's.
HOOK_NAME='^[A-Za-z_][A-Za-z0-9_]*[.]py$'
HOOK_ENTRY=wasmop_hook_entry

hook() {
  [ $# -eq 2 ] || die "usage: hook HOOK.py OUT.wasm"
  local file=$1 out=$2
  [ -f "$file" ] || die "no hook file $file"
  [[ $(basename "$file") =~ $HOOK_NAME ]] ||
    die "$file: a hook file's name is a Python module name ending in .py (sync.py)"
  file=$(cd "$(dirname "$file")" && pwd)/$(basename "$file")
  tools
  "$VENV/bin/python" -c 'import sys; sys.exit(sys.argv[1] in sys.stdlib_module_names)' "$(basename "$file" .py)" ||
    die "$file: the name of a standard module; rename the hook file (sync.py)"
  mkdir -p "$(dirname "$out")"
  build_once "$out" hook_digest componentize_hook "$file" "$out"
}

# hook_digest HOOK OUT: the inputs of a hook's build (build_once's DIGEST): what every build
# reads (the .py files beside the hook among them), and which of them is the hook.
hook_digest() {
  { echo "$HOOK_ENTRY $(basename "$1")"; inputs_digest "$(dirname "$1")"; } | sha256sum | cut -d' ' -f1
}

# componentize_hook HOOK OUT: HOOK, run by a generated entry, into OUT (build_once's BUILD). The
# hook's directory is first on the path: the entry finds the hook there, the hook its own modules.
componentize_hook() {
  local file=$1 out=$2 started=$SECONDS
  ENTRY_DIR=$(mktemp -d "${TMPDIR:-/tmp}/python-hook.XXXXXX")
  trap 'rm -rf "$ENTRY_DIR"' EXIT
  hook_entry "$(basename "$file")" >"$ENTRY_DIR/$HOOK_ENTRY.py"
  "$VENV/bin/componentize-py" -d "$ROOT/wit/reconciler.wit" -w hook componentize "$HOOK_ENTRY" \
    -p "$(dirname "$file")" -p "$ENTRY_DIR" -p "$ROOT/guest-sdk/python" -o "$out.tmp" >&2 ||
    die "componentize-py failed for the hook $file (its message is above)"
  mv "$out.tmp" "$out"
  echo "$NAME: built $out ($(stat -c %s "$out") bytes) from the hook $file in $((SECONDS - started)) s" >&2
}

# hook_entry NAME.py: the entry of a component running the hook file NAME.py.
hook_entry() {
  echo "# Generated by scripts/python-module.sh hook: the component runs the hook file $1."
  echo "from wasmop_sdk import hook"
  echo
  echo "Hooks = hook.export(hook.load(hook.on_path(\"$1\")))"
}

run_pytest() {
  [ $# -eq 1 ] || die "usage: pytest DIR"
  tools
  cd "$1"
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider
}

case "${1:-}" in
  build) shift; build "$@" ;;
  hook) shift; hook "$@" ;;
  pytest) shift; run_pytest "$@" ;;
  tools) tools; echo "$VENV" ;;
  *) die "usage: $0 build APP_DIR APP_MODULE OUT.wasm | hook HOOK.py OUT.wasm | pytest DIR | tools" ;;
esac
