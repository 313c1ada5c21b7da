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
#   IMAGE_TAG      the tag inside the tarball (default wasmop:<version>)
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
# ring and aws-lc-sys compile C for the target. Without a musl cross compiler (musl-gcc from
# musl-tools, or x86_64-linux-musl-gcc) the host's gcc does: their C needs no libc headers
# beyond what gcc ships, and Rust links musl's own libc statically.
if [ -z "${CC_x86_64_unknown_linux_musl:-}" ] && ! command -v x86_64-linux-musl-gcc >/dev/null \
        && ! command -v musl-gcc >/dev/null; then
    export CC_x86_64_unknown_linux_musl=${CC:-gcc}
fi

step "building the host ($TARGET, profile $PROFILE)"
"$CARGO" build -p wasmop --bin wasmop --target "$TARGET" --profile "$PROFILE"
profile_dir=$PROFILE
[ "$PROFILE" = dev ] && profile_dir=debug
binary="$TARGET_DIR/$TARGET/$profile_dir/wasmop"
[ -x "$binary" ] || fail "the build did not produce $binary"
if readelf -l "$binary" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    fail "$binary is dynamically linked; the image has no libc to load it with"
fi

if [ -z "${CRANE:-}" ]; then
    TESTENV=${TESTENV:-$TARGET_DIR/debug/testenv}
    [ -x "$TESTENV" ] || "$CARGO" build -p wasmop-testenv --bin testenv
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
mkdir -p "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/wasmop"
for bundle in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
    if [ -f "$bundle" ]; then
        install -m 0644 "$bundle" "$root/etc/ssl/certs/ca-certificates.crt"
        break
    fi
done
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
# Reproducible: sorted, owned by root, dated 1970.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/layer.tar" .

if [ -n "${IMAGE_PUSH:-}" ]; then
    ref=$IMAGE_PUSH
else
    step "starting a throwaway local registry (crane registry serve)"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$CRANE" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
    registry_pid=$!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    ref=127.0.0.1:$port/${IMAGE_TAG:-wasmop:$VERSION}
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
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$tarball" .
    step "wrote the OCI image layout tarball (load it with skopeo, podman or docker load)"
    echo "$tarball"
fi
