# The wasmop host image, for people who build with Docker:
#
#   docker build --platform linux/amd64 -t wasmop .
#
# `make image` builds the same image without a container daemon (scripts/image.sh, with crane):
# both compile the host for x86_64-unknown-linux-musl with the C of ring and aws-lc-sys built by
# gcc, and lay out the same files with scripts/image-root.sh (a static /wasmop, a CA bundle,
# /etc/passwd naming the non-root user 65532, /tmp). The tests run `make image`, not this file
# (there is no Docker on the test machines).
FROM rust:1.95.0-bookworm AS build
# This image's toolchain rather than the `stable` rust-toolchain.toml names (which rustup would
# download without the musl target), and the machine's gcc for the target's C (no musl-gcc).
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CC_x86_64_unknown_linux_musl=gcc
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p wasmop --bin wasmop --target x86_64-unknown-linux-musl \
    && bash scripts/image-root.sh target/x86_64-unknown-linux-musl/release/wasmop /rootfs

FROM scratch
COPY --from=build /rootfs/ /
USER 65532:65532
ENTRYPOINT ["/wasmop"]
