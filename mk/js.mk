# JavaScript modules (componentize-js 0.23.0 and jco 1.35.0, pinned in
# guest-sdk/js/tools/package-lock.json, installed once with npm ci into ~/.cache/wasmop; offline
# afterwards). `make modules` (mk/modules.mk) builds them too; `make test` runs both through
# host/tests/js.rs.
.PHONY: js-modules js-test
JS_MODULE := bash scripts/js-module.sh

## Build every JavaScript module (the feature-flags example and the test guest
## tests/guests/js-probe) into $(TARGET_DIR)/wasm32-wasip2/release/<name>.wasm (cargo's target
## directory, beside the Rust modules); each is skipped when its inputs did not change.
js-modules: prereqs-js
	$(JS_MODULE) build examples/feature-flags flags $(TARGET_DIR)/wasm32-wasip2/release/feature_flags.wasm
	$(JS_MODULE) build tests/guests/js-probe probe $(TARGET_DIR)/wasm32-wasip2/release/js_probe.wasm

## node --test: the JavaScript SDK and the feature-flags example, natively (no cluster, no npm
## install), and the Metacontroller hook adapter as a component (built with the pinned tools,
## called through jco in node); and the image-updater hook of `make bench-scale`'s
## Metacontroller row (bench/scale/hooks).
js-test: prereqs-js
	$(JS_MODULE) test guest-sdk/js
	$(JS_MODULE) test examples/feature-flags
	$(JS_MODULE) test bench/scale/hooks
