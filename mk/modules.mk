# `make modules`: the example and test guests, Rust (here), Python (python-modules, in
# mk/python.mk) and JavaScript (js-modules, in mk/js.mk). The build script of tests/modules builds the same guests for tests (into its own
# target directory), so a bare `cargo test` needs no `make modules`.
.PHONY: modules
MODULE_PACKAGES := image-updater primary-replica configmap-propagator misbehave wrong-version

## Build every example and test guest, Rust, Python and JavaScript, for wasm32-wasip2 (release) into
## $(TARGET_DIR)/wasm32-wasip2/release/*.wasm (cargo's target directory, CARGO_TARGET_DIR honoured).
modules: prereqs-modules python-modules js-modules
	$(CARGO) build --release --target wasm32-wasip2 $(addprefix -p ,$(MODULE_PACKAGES))
	$(CARGO) build --release --target wasm32-wasip2 -p image-updater --features revision-annotation
	cp $(TARGET_DIR)/wasm32-wasip2/release/image_updater.wasm $(TARGET_DIR)/wasm32-wasip2/release/image_updater_v2.wasm
	$(CARGO) build --release --target wasm32-wasip2 -p image-updater
	@ls -l $(TARGET_DIR)/wasm32-wasip2/release/*.wasm
