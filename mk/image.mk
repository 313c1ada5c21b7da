# `make image`: the host's container image without a container daemon (scripts/image.sh): a
# static musl build of the host (release profile) on an empty base, assembled by crane (built
# from Go modules and cached like the control-plane binaries), running as uid 65532.
#   make image                                   # OCI image-layout tarball: $(TARGET_DIR)/image/wasmop.tar
#   make image IMAGE_PUSH=registry.example.com/wasmop:0.1.0   # push instead (crane's credentials)
# IMAGE_PROFILE picks another cargo profile (the deploy test uses `image-test`). Dockerfile at
# the repository root does the same with Docker.
.PHONY: image
IMAGE_PROFILE ?= release
IMAGE_PUSH ?=
IMAGE_TAR ?= $(TARGET_DIR)/image/wasmop.tar

image: prereqs testenv
	IMAGE_PROFILE=$(IMAGE_PROFILE) IMAGE_PUSH=$(IMAGE_PUSH) IMAGE_TAR=$(IMAGE_TAR) \
		TESTENV=$(TESTENV) CARGO=$(CARGO) bash scripts/image.sh
