//! The wasmop guest SDK: write a Kubernetes reconciler once, ship it as a Wasm component.
