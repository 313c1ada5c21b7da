//! The checked-in CRDs are exactly what the Rust types generate.

#[test]
fn checked_in_crds_match_the_rust_types() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/wasmreconciler.yaml");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = wasmop::crd::crds_yaml();
    assert!(
        checked_in == generated,
        "deploy/crds/wasmreconciler.yaml has drifted from the Rust types in host/src/crd.rs; regenerate it:\n  cargo run -p wasmop -- crdgen > deploy/crds/wasmreconciler.yaml"
    );
}
