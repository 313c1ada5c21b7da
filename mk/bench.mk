# Benchmarks print their figures; they are not tests.
.PHONY: bench-dispatch
## The same reconcile native and through Wasm (fresh sandbox per call); last line is the ratio.
## WASMOP_BENCH_CALLS: calls each way (default 3000; more to profile the loop).
bench-dispatch: prereqs-bench
	$(CARGO) bench -p wasmop --bench dispatch

.PHONY: bench-engine-memory
## What the sandbox engine alone holds with 20 idle modules (no cluster): RSS after the loads and
## once every optimized build serves; last line `engine memory modules=20 rss MiB: X.X anon MiB: Y.Y`.
## WASMOP_BENCH_MODULES, WASMOP_BENCH_TIERED (on/off), WASMOP_BENCH_HOLD (seconds, for smaps).
bench-engine-memory: prereqs-bench
	$(CARGO) bench -p wasmop --bench engine_memory

.PHONY: bench-cache-memory
## What the controller's caches hold per object at N image-updater Apps (App, Deployment, Service;
## no cluster): the reflector stores of whole objects (old) against the compact caches (new), each
## in a fresh process; last line `cache memory per object KiB: old X.X new Y.Y`.
## WASMOP_BENCH_N (default 10000).
bench-cache-memory: prereqs-bench
	$(CARGO) bench -p wasmop --bench cache_memory

.PHONY: bench-watch-decode
## What the controller's watches spend per event before a reconcile (no cluster): an image-updater
## App's, Deployment's and Service's watch event lines decoded and cached as the host did
## (`DynamicObject`, stripped, serialized back) against `Lean` (text split, metadata parsed),
## rounds alternating; last line `watch decode us per event: old X.XX new Y.YY`.
## WASMOP_BENCH_N: events per kind and round (default 5000).
bench-watch-decode: prereqs-bench
	$(CARGO) bench -p wasmop --bench watch_decode

.PHONY: bench-event-publish
## What publishing a module's Event costs once many were published (no cluster): Events for
## distinct objects through a lane with one kube-runtime `Recorder` (which scans its whole cache
## on every publish) against the lane's `Recorders`, rounds alternating; last line `event publish
## us per event, last tenth: one recorder X.XX recorders Y.YY`. WASMOP_BENCH_N: Events per round
## (default 20000).
bench-event-publish: prereqs-bench
	$(CARGO) bench -p wasmop --bench event_publish

.PHONY: bench-hotswap
## Module update -> first reconcile by the new module, on the local control plane: the Rust
## example through a ConfigMap, the Python example through an OCI registry. The last lines are
## `hotswap new-build rust p50 ms: N` and `hotswap new-build python p50 ms: N`.
## WASMOP_BENCH_SWAPS: swaps per Rust series (default 20); WASMOP_BENCH_PYTHON_SWAPS (default 10).
bench-hotswap: prereqs-bench provision
	$(CARGO) bench -p wasmop-testenv --bench hotswap

.PHONY: bench-compile-settings
## What the engine's compile settings cost per compile (time, peak RSS, artifact size), before
## and now, for the Rust and Python examples. Last line `compile settings python winch ms
## before: N now: M`; WASMOP_BENCH_ROUNDS (default 3).
bench-compile-settings: prereqs-bench
	$(CARGO) bench -p wasmop --bench compile_settings

.PHONY: bench-hotswap-compile
## The fast tier's compile of a NEW build (two builds of the Rust and of the Python example):
## Winch against Cranelift with its incremental compilation cache. Last line
## `hotswap compile python second build winch ms: N`; WASMOP_BENCH_ROUNDS (default 3).
bench-hotswap-compile: prereqs-bench
	$(CARGO) bench -p wasmop --bench hotswap_compile

.PHONY: bench-scale
## N image-updater Apps converged by wasmop, native kube-rs, controller-runtime (Go) and the
## API server's write floor, by wasmop sharded over 1, 2 and 3 replicas (`--shards auto`), and
## by wasmop serving the same logic as a Metacontroller hook (`wasmop-metacontroller`: a
## JavaScript hook, bench/scale/hooks, through a CompositeController with `spec.wasmop`),
## each on a fresh local control plane; one table per N, last lines
## `scale N=<n> wasmop/floor: X.XX wasmop/kube-rs: Y.YY wasmop/controller-runtime: Z.ZZ
## wasmop-metacontroller/wasmop: R.RR` (the last ratio when that row ran) and
## `scale-sharded N=<n> replicas=<k> converge s: X rss MiB per replica: a,b,c`.
## Beside the tables, SVG charts of converged Apps and of each controller's RSS over time:
## $(TARGET_DIR)/bench/scale-N<n>-converged.svg and scale-N<n>-memory.svg (WASMOP_BENCH_CHARTS: another directory).
## WASMOP_BENCH_N (default 1000,10000), WASMOP_BENCH_CONTENDERS (default all),
## WASMOP_BENCH_REPLICAS (default 1,2,3), WASMOP_BENCH_NAMESPACES (default 100),
## WASMOP_BENCH_RESYNC (seconds, default 30); see bench/scale/src/settings.rs for the rest.
bench-scale: prereqs-bench prereqs-js provision
	$(CARGO) build --profile bench --workspace --bin wasmop
	$(CARGO) bench --workspace --bench scale

.PHONY: bench-idle-host
## The memory of an idle host serving 20 WasmReconcilers (each its own module, no objects) on the
## local control plane; last line `idle host modules=20 rss MiB: X.X peak MiB: Y.Y`.
## WASMOP_BENCH_MODULES sets the count.
bench-idle-host: prereqs-bench provision
	$(CARGO) build --profile bench --workspace --bin wasmop
	$(CARGO) bench --workspace --bench idle

.PHONY: bench-idle-image
## bench-idle-host with the release image's binary (`make image`: static musl, the release
## profile with LTO) instead of the bench profile's glibc build: the memory a deployed host holds.
## Any other build can be measured the same way: WASMOP_BENCH_BINARY=<path> (also for bench-scale).
bench-idle-image: prereqs-bench provision image
	WASMOP_BENCH_BINARY=$(IMAGE_BINARY) \
		$(CARGO) bench --workspace --bench idle
