# The wasmop host image, for people who build with Docker (`docker build -t wasmop .`).
# `make image` builds the same image without a container daemon (scripts/image.sh, with crane):
# a static musl binary on an empty base, running as the non-root user 65532.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools cmake \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p wasmop --bin wasmop --target x86_64-unknown-linux-musl \
    && mkdir -p /out/tmp && chmod 1777 /out/tmp \
    && install -m 0755 target/x86_64-unknown-linux-musl/release/wasmop /out/wasmop \
    && printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >/out/passwd \
    && printf 'root:x:0:\nnonroot:x:65532:\n' >/out/group

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/group /etc/group
COPY --from=build /out/tmp /tmp
COPY --from=build /out/wasmop /wasmop
USER 65532:65532
ENTRYPOINT ["/wasmop"]
