# Python modules (componentize-py 0.25.1, pinned in guest-sdk/python/requirements.txt, installed
# once into ~/.cache/wasmop; offline afterwards). `make modules` (mk/modules.mk) builds them too.
.PHONY: python-modules python-test
PYTHON_MODULE := bash scripts/python-module.sh

## Build every Python example into $(TARGET_DIR)/wasm32-wasip2/release/<name>.wasm (cargo's
## target directory, CARGO_TARGET_DIR honoured, beside the Rust modules).
python-modules: prereqs-python
	$(PYTHON_MODULE) build examples/tenant tenant $(TARGET_DIR)/wasm32-wasip2/release/tenant.wasm

## pytest: the Python SDK and the Python examples, natively (no cluster; the SDK's hook tests
## also build one hook component, ~10 s).
python-test: prereqs-python
	$(PYTHON_MODULE) pytest guest-sdk/python
	$(PYTHON_MODULE) pytest examples/tenant
