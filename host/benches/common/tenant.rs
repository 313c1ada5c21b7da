//! The tenant (Python) example's two builds, for the compile benches.

/// The tenant example's two builds, built (or found up to date) by scripts/python-module.sh,
/// the same way as tests/e2e/support's `tenant_module`.
pub fn tenant_builds() -> (Vec<u8>, Vec<u8>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python");
    let example = root.join("examples/tenant");
    let second_dir = dir.join("tenant-second");
    std::fs::create_dir_all(&second_dir).expect("a directory for the second build");
    for file in ["tenant.py", "quantity.py"] {
        std::fs::copy(example.join(file), second_dir.join(file)).expect("copy the example");
    }
    std::fs::write(
        second_dir.join("tenant_second.py"),
        "\"\"\"The tenant example with a default memory request of 256Mi: a second version.\"\"\"\n\
         import tenant\n\
         tenant.DEFAULT_REQUESTS[\"memory\"] = \"256Mi\"\n\
         from tenant import Guest  # noqa: E402,F401\n",
    )
    .expect("write the second build's module");
    let build = |app_dir: &std::path::Path, app: &str, out: std::path::PathBuf| {
        let status = std::process::Command::new("bash")
            .arg(root.join("scripts/python-module.sh"))
            .arg("build")
            .arg(app_dir)
            .arg(app)
            .arg(&out)
            .status()
            .expect("runs bash");
        assert!(status.success(), "building {app} failed (see above)");
        std::fs::read(&out).expect("the built component")
    };
    (
        build(&example, "tenant", dir.join("tenant.wasm")),
        build(&second_dir, "tenant_second", dir.join("tenant-second.wasm")),
    )
}
