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

/// The chart's Metacontroller mode (`metacontroller.enabled`) renders the chart's copies of the
/// files of deploy/components/metacontroller: every resource the component's kustomization
/// lists has its copy in deploy/helm/wasmop/files/metacontroller/, byte for byte, and there is
/// no other (tests/e2e/chart.rs compares the rendered objects with kustomize's).
#[test]
fn the_charts_metacontroller_files_are_the_components() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let component = root.join("deploy/components/metacontroller");
    let copies = root.join("deploy/helm/wasmop/files/metacontroller");
    let kustomization = std::fs::read_to_string(component.join("kustomization.yaml"))
        .unwrap_or_else(|e| panic!("deploy/components/metacontroller/kustomization.yaml: {e}"));
    let kustomization: serde_json::Value = serde_saphyr::from_str(&kustomization)
        .unwrap_or_else(|e| panic!("deploy/components/metacontroller/kustomization.yaml: {e}"));
    let mut resources: Vec<String> = kustomization["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("the component's kustomization lists no resources"))
        .iter()
        .map(|r| r.as_str().unwrap_or_default().to_string())
        .collect();
    resources.sort();
    let mut copied: Vec<String> = std::fs::read_dir(&copies)
        .unwrap_or_else(|e| panic!("deploy/helm/wasmop/files/metacontroller: {e}"))
        .map(|entry| {
            let entry = entry.unwrap_or_else(|e| panic!("{e}"));
            entry.file_name().to_string_lossy().into_owned()
        })
        .collect();
    copied.sort();
    assert_eq!(
        copied, resources,
        "deploy/helm/wasmop/files/metacontroller/ must hold exactly the resources of deploy/components/metacontroller/kustomization.yaml; copy them: make crds"
    );
    for file in &resources {
        let original = std::fs::read_to_string(component.join(file)).unwrap_or_default();
        let copy = std::fs::read_to_string(copies.join(file)).unwrap_or_default();
        assert!(
            !original.is_empty() && copy == original,
            "deploy/helm/wasmop/files/metacontroller/{file} differs from deploy/components/metacontroller/{file}; copy it: make crds"
        );
    }
}
