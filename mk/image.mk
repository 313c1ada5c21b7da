# `make image`: the host's container image without a container daemon (scripts/image.sh): a
# static musl build of the host on an empty base, assembled by crane (built from Go modules and
# cached like the control-plane binaries), running as uid 65532.
#   make image                                   # OCI image-layout tarball: $(TARGET_DIR)/image/wasmop.tar
#   make image IMAGE_PUSH=registry.example.com/wasmop:0.1.0   # push instead (crane's credentials)
# IMAGE_PROFILE picks the cargo profile (default release; `make test`'s deploy test runs the
# script itself with `image-test`, so `make test` builds the image once, not through this
# target). IMAGE_NAME names the image inside the tarball. The Dockerfile at the repository root
# builds the same image with Docker.
.PHONY: image
IMAGE_PROFILE ?= release
IMAGE_PUSH ?=
IMAGE_TAR ?= $(TARGET_DIR)/image/wasmop.tar
IMAGE_NAME ?=
# Where cargo puts the image's binary: the dev profile's directory is named debug.
IMAGE_BINARY = $(TARGET_DIR)/x86_64-unknown-linux-musl/$(if $(filter dev,$(IMAGE_PROFILE)),debug,$(IMAGE_PROFILE))/wasmop

## The host's container image (a static musl build on an empty base, assembled by crane):
## $(TARGET_DIR)/image/wasmop.tar, or pushed with IMAGE_PUSH=REGISTRY/REPO:TAG.
image: prereqs-image testenv
	IMAGE_PROFILE=$(IMAGE_PROFILE) IMAGE_PUSH=$(IMAGE_PUSH) IMAGE_TAR=$(IMAGE_TAR) \
		IMAGE_NAME=$(IMAGE_NAME) TESTENV=$(TESTENV) CARGO=$(CARGO) bash scripts/image.sh
