# Benchmarks print their figures; they are not tests.
.PHONY: bench-dispatch
## The same reconcile native and through Wasm (fresh sandbox per call); last line is the ratio.
bench-dispatch: prereqs
	$(CARGO) bench -p wasmop --bench dispatch

.PHONY: bench-hotswap
## ConfigMap update -> first reconcile by the new module, on the local control plane; last line
## is `hotswap p50 ms: N`. WASMOP_BENCH_SWAPS sets the swaps per series (default 20).
bench-hotswap: prereqs provision
	$(CARGO) bench -p wasmop-testenv --bench hotswap
