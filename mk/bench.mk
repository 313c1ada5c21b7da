# Benchmarks print their figures; they are not tests.
.PHONY: bench-dispatch
## The same reconcile native and through Wasm (fresh sandbox per call); last line is the ratio.
bench-dispatch: prereqs
	$(CARGO) bench -p wasmop --bench dispatch
