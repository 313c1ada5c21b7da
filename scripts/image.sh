#!/usr/bin/env bash
# `make image`: the wasmop host's container image, built without a container daemon.
#
#   1. the host as a static binary (target x86_64-unknown-linux-musl, profile $IMAGE_PROFILE)
#   2. one layer: /wasmop, the build machine's CA bundle (for registries with public
#      certificates), /etc/passwd and /etc/group naming the non-root user 65532, an empty /tmp
#   3. assembled by crane (go-containerregistry, built from Go modules and cached like the
#      control-plane binaries) on an empty base: entrypoint /wasmop, user 65532:65532,
#      platform linux/amd64
#   4. pushed to $IMAGE_PUSH, or (without it) written as an OCI image-layout tarball to
#      $IMAGE_TAR via a throwaway local registry (`crane registry serve`, loopback only)
#
# Environment (all optional):
#   IMAGE_PROFILE  cargo profile of the binary (default release)
#   IMAGE_PUSH     push to this reference (registry/repository:tag); credentials and trust as
#                  crane reads them ($DOCKER_CONFIG/config.json, `crane auth login`; SSL_CERT_FILE)
#   IMAGE_TAR      the tarball written without IMAGE_PUSH (default <target>/image/wasmop.tar)
#   IMAGE_NAME     the name the tarball gives the image (default ghcr.io/wasmop/wasmop:<version>,
#                  the one deploy/ names): the index's io.containerd.image.name annotation
#                  (docker load, kind load image-archive) and, for its tag,
#                  org.opencontainers.image.ref.name (skopeo's oci-archive:FILE:TAG)
#   CRANE          the crane binary (default: `$TESTENV which crane`, which builds it once)
#   TESTENV        the testenv binary (default <target>/debug/testenv)
# Prints the pushed reference by digest (IMAGE_PUSH) or the tarball's path, last, on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
TARGET=x86_64-unknown-linux-musl
PROFILE=${IMAGE_PROFILE:-release}
TARGET_DIR=$("$CARGO" metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
VERSION=$("$CARGO" metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print([p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="wasmop"][0])')
step() { printf '==> %s\n' "$*" >&2; }
fail() { printf 'make image: %s\n' "$*" >&2; exit 1; }

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
    step "installing the $TARGET Rust target"
    rustup target add "$TARGET"
fi
# ring and aws-lc-sys compile C for the target. No musl cross compiler is needed: the machine's
# gcc compiles it (x86_64 glibc and musl agree on the ABI of the few libc calls they make, and
# Rust links its bundled musl statically). Always the same compiler, musl-gcc installed or not,
# so every build is the one the tests run; set CC_x86_64_unknown_linux_musl to choose another.
export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-gcc}
command -v "${CC_x86_64_unknown_linux_musl%% *}" >/dev/null \
    || fail "no C compiler $CC_x86_64_unknown_linux_musl for ring and aws-lc-sys (install gcc)"
command -v readelf >/dev/null || fail "readelf (binutils, installed with gcc) not found"

step "building the host ($TARGET, profile $PROFILE)"
"$CARGO" build -p wasmop --bin wasmop --target "$TARGET" --profile "$PROFILE"
profile_dir=$PROFILE
[ "$PROFILE" = dev ] && profile_dir=debug
binary="$TARGET_DIR/$TARGET/$profile_dir/wasmop"
[ -x "$binary" ] || fail "the build did not produce $binary"
# Static: no program interpreter and no shared libraries (the image has no libc to load).
program_headers=$(readelf -lW "$binary") || fail "readelf cannot read $binary"
dynamic_section=$(readelf -dW "$binary") || fail "readelf cannot read $binary"
if grep -q 'Requesting program interpreter' <<<"$program_headers" \
        || grep -q '(NEEDED)' <<<"$dynamic_section"; then
    fail "$binary is dynamically linked; the image has no libc to load it with"
fi

if [ -z "${CRANE:-}" ]; then
    TESTENV=${TESTENV:-$TARGET_DIR/debug/testenv}
    [ -x "$TESTENV" ] || "$CARGO" build --workspace --bin testenv
    CRANE=$("$TESTENV" which crane)
fi
[ -x "$CRANE" ] || fail "crane not found at $CRANE"

work=$(mktemp -d)
registry_pid=
cleanup() {
    [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

step "assembling the layer"
root=$work/root
bash scripts/image-root.sh "$binary" "$root"
# Reproducible: sorted, owned by root, dated 1970.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/layer.tar" .

if [ -n "${IMAGE_PUSH:-}" ]; then
    ref=$IMAGE_PUSH
else
    step "starting a throwaway local registry (crane registry serve)"
    # Port 0: the kernel picks a free port, crane logs it ("serving on port N").
    "$CRANE" registry serve --address 127.0.0.1:0 >"$work/registry.log" 2>&1 &
    registry_pid=$!
    port=
    for _ in $(seq 300); do
        port=$(sed -n 's/.*serving on port \([0-9][0-9]*\).*/\1/p' "$work/registry.log")
        [ -n "$port" ] && break
        kill -0 "$registry_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] || fail "crane registry serve did not start: $(cat "$work/registry.log")"
    ref=127.0.0.1:$port/wasmop:$VERSION
fi

step "assembling the image on an empty base with crane: $ref"
"$CRANE" append --oci-empty-base -f "$work/layer.tar" -t "$ref" >&2
pinned=$("$CRANE" mutate "$ref" -t "$ref" \
    --entrypoint /wasmop --user 65532:65532 --set-platform linux/amd64 \
    -l org.opencontainers.image.title=wasmop \
    -l org.opencontainers.image.version="$VERSION" \
    -l org.opencontainers.image.source=https://github.com/wasmop/wasmop)

if [ -n "${IMAGE_PUSH:-}" ]; then
    step "pushed"
    echo "$pinned"
else
    tarball=${IMAGE_TAR:-$TARGET_DIR/image/wasmop.tar}
    mkdir -p "$(dirname "$tarball")"
    "$CRANE" pull --format=oci "$ref" "$work/layout"
    IMAGE_NAME=${IMAGE_NAME:-ghcr.io/wasmop/wasmop:$VERSION} python3 - "$work/layout/index.json" <<'PY'
import json, os, sys
path, name = sys.argv[1], os.environ["IMAGE_NAME"]
index = json.load(open(path))
[manifest] = index["manifests"]
manifest.setdefault("annotations", {}).update({
    "io.containerd.image.name": name,
    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1] if ":" in name.rsplit("/", 1)[-1] else "latest",
})
json.dump(index, open(path, "w"), indent=3)
PY
    find "$work/layout" -type f -exec chmod 0644 {} +
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$tarball" .
    step "wrote the OCI image layout tarball (load it with skopeo, podman or docker load)"
    echo "$tarball"
fi
