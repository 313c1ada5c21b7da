# Python modules (componentize-py 0.25.1, pinned in guest-sdk/python/requirements.txt, installed
# once into ~/.cache/wasmop; offline afterwards). `make modules` builds them too.
.PHONY: python-modules python-test
PYTHON_MODULE := bash scripts/python-module.sh

## Build every Python example into target/wasm32-wasip2/release/<name>.wasm.
python-modules:
	$(PYTHON_MODULE) build examples/tenant tenant target/wasm32-wasip2/release/tenant.wasm

## pytest: the Python SDK and the Python examples, natively (no Wasm, no cluster).
python-test:
	$(PYTHON_MODULE) pytest guest-sdk/python
	$(PYTHON_MODULE) pytest examples/tenant

modules: python-modules
