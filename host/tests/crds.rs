//! The checked-in CRDs (deploy/'s and the Helm chart's) are exactly what the Rust types generate.

#[test]
fn the_checked_in_compositecontroller_crd_matches_the_rust_types() {
    let generated = wasmop::metacontroller::crds_yaml();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/components/metacontroller/crds.yaml");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "deploy/components/metacontroller/crds.yaml has drifted from host/src/metacontroller/api.rs; regenerate it: make crds"
    );
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = wasmop::crd::crds_yaml();
    for file in [
        "deploy/crds/wasmreconciler.yaml",
        "deploy/helm/wasmop/crds/wasmreconciler.yaml",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(file);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{file} has drifted from the Rust types in host/src/crd.rs; regenerate it: make crds"
        );
    }
}
