# The steps the module scripts (scripts/js-module.sh, scripts/python-module.sh) share: their
# messages, the locked install of their pinned tools, and the build of a module skipped when its
# inputs did not change. Sourced, not run: the script sets NAME (the prefix of its messages)
# first. (host/templates/new-*/build.sh do the same on their own: `wasmop new` copies them alone
# into projects outside this repository.)

# The cache of every tool (`$WASMOP_CACHE`, else `$XDG_CACHE_HOME/wasmop`, else ~/.cache/wasmop).
CACHE=${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}

# Says "NAME: MESSAGE..." on stderr and exits 1.
die() { echo "$NAME: $*" >&2; exit 1; }

# install_once DIR PINS STAMP INSTALL...: unless DIR/STAMP is a copy of the file PINS, empties
# DIR and runs INSTALL... (a command that installs the tools PINS pins into DIR), then copies
# PINS to DIR/STAMP. One installer at a time (tests build in parallel): DIR.lock is held
# throughout (fd 9).
install_once() {
  local dir=$1 pins=$2 stamp=$3
  shift 3
  mkdir -p "$(dirname "$dir")"
  # One installer at a time (tests build in parallel); the stamp says what is installed.
  exec 9>"$dir.lock"
  flock 9
  if ! cmp -s "$pins" "$dir/$stamp" 2>/dev/null; then
    rm -rf "$dir"
    "$@"
    cp "$pins" "$dir/$stamp"
  fi
  flock -u 9
}

# build_once OUT DIGEST BUILD ARGS...: builds OUT with `BUILD ARGS...` unless OUT was built from
# the same inputs, whose digest `DIGEST ARGS...` prints; OUT.inputs keeps the digest of the last
# build. One build of OUT at a time: OUT.lock is held throughout (fd 8).
build_once() {
  local out=$1 digest_of=$2 build=$3
  shift 3
  # One build of OUT at a time (test binaries may ask for the same module at once).
  exec 8>"$out.lock"
  flock 8
  local digest
  digest=$("$digest_of" "$@")
  if [ -f "$out" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$digest" ]; then
    echo "$NAME: $out is up to date" >&2
    return
  fi
  "$build" "$@"
  echo "$digest" >"$out.inputs"
}
