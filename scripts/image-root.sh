#!/usr/bin/env bash
# The file system of the wasmop host image, shared by `make image` (scripts/image.sh) and the
# Dockerfile so both ship the same files:
#
#   /wasmop                              the static host binary (the entrypoint), mode 0755
#   /etc/ssl/certs/ca-certificates.crt   the build machine's CA bundle, or $IMAGE_CA_BUNDLE
#                                        (registries with public certificates verify:
#                                        rustls-native-certs reads this path)
#   /etc/passwd, /etc/group              root and the non-root user `nonroot` (65532:65532)
#   /tmp                                 empty, mode 1777
#
# Usage: scripts/image-root.sh BINARY DIR   (DIR must not exist or be empty)
set -euo pipefail
fail() { printf 'image-root: %s\n' "$*" >&2; exit 1; }
[ $# -eq 2 ] || fail "usage: $0 BINARY DIR"
binary=$1 root=$2
[ -x "$binary" ] || fail "$binary is not an executable file"
if [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
    fail "$root is not empty"
fi

mkdir -p "$root/etc/ssl/certs" "$root/tmp"
chmod 0755 "$root" "$root/etc" "$root/etc/ssl" "$root/etc/ssl/certs"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/wasmop"
bundle=
for candidate in "${IMAGE_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt \
        /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
    if [ -n "$candidate" ] && [ -f "$candidate" ] && grep -q 'BEGIN CERTIFICATE' "$candidate"; then
        bundle=$candidate
        break
    fi
done
[ -n "$bundle" ] || fail "no CA bundle found (install ca-certificates, or set IMAGE_CA_BUNDLE to a PEM bundle)"
install -m 0644 "$bundle" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' \
    >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
