//! Builds every example and test guest for `wasm32-wasip2` (release), so tests can load real
//! modules with a bare `cargo test`.
//!
//! The nested cargo uses its own target directory (`target/guests`): the outer build holds the
//! lock of its own, and a shared one could deadlock (for example under `cargo bench`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// (package, features, file name of the module this build produces)
const GUESTS: &[(&str, &[&str], &str)] = &[
    ("image-updater", &[], "image_updater"),
    (
        "image-updater",
        &["revision-annotation"],
        "image_updater_v2",
    ),
    ("primary-replica", &[], "primary_replica"),
    ("configmap-propagator", &[], "configmap_propagator"),
    ("misbehave", &[], "misbehave"),
    ("misbehave", &["fragile"], "misbehave_fragile"),
    ("misbehave", &["huge-metadata"], "misbehave_huge_metadata"),
    ("wrong-version", &[], "wrong_version"),
    ("hostile", &[], "hostile"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    // What the Rust guests are built from, and nothing else: a directory is watched as a whole
    // (cargo compares the newest mtime under it), and the Python example and SDK beside these
    // (examples/tenant, guest-sdk/python) get `__pycache__` written by every run of their
    // tests, which would rebuild this crate and relink every test binary using it each time.
    for watched in [
        "guest-sdk/src",
        "guest-sdk/Cargo.toml",
        "wit",
        "examples/image-updater",
        "examples/primary-replica",
        "examples/configmap-propagator",
        "tests/guests",
        "Cargo.lock",
        "Cargo.toml",
        ".cargo",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = workspace.join("target").join("guests");
    let built = target_dir.join("wasm32-wasip2").join("release");
    let mut consts = String::new();
    for (package, features, name) in GUESTS {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&workspace)
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "-p",
                package,
            ])
            .arg("--target-dir")
            .arg(&target_dir);
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        // Do not leak this build script's environment (target, flags, features) into the
        // nested build; keep the jobserver so both share the machine's cores.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().to_string();
            let leak = key.starts_with("CARGO_FEATURE_")
                || key.starts_with("CARGO_CFG_")
                || key.starts_with("CARGO_PKG_")
                || matches!(
                    key.as_str(),
                    "CARGO_TARGET_DIR"
                        | "CARGO_BUILD_TARGET"
                        | "CARGO_ENCODED_RUSTFLAGS"
                        | "RUSTFLAGS"
                        | "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "TARGET"
                        | "HOST"
                        | "OUT_DIR"
                        | "OPT_LEVEL"
                        | "PROFILE"
                        | "DEBUG"
                        | "NUM_JOBS"
                        | "RUSTC_WORKSPACE_WRAPPER"
                        | "CARGO_TARGET_WASM32_WASIP2_LINKER"
                );
            if leak {
                cmd.env_remove(&key);
            }
        }
        let status = cmd.status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => fail(&format!(
                "building the guest `{package}` for wasm32-wasip2 failed ({s}); if the target is missing, run `rustup target add wasm32-wasip2`"
            )),
            Err(e) => fail(&format!("cannot run {cargo}: {e}")),
        }
        let file = built.join(format!("{}.wasm", package.replace('-', "_")));
        let dest = out_dir.join(format!("{name}.wasm"));
        if let Err(e) = std::fs::copy(&file, &dest) {
            fail(&format!(
                "cannot copy {} to {}: {e}",
                file.display(),
                dest.display()
            ));
        }
        consts.push_str(&format!(
            "/// `{package}`{} built for wasm32-wasip2 (release).\npub const {}: &str = {:?};\n",
            if features.is_empty() {
                String::new()
            } else {
                format!(" with features {features:?}")
            },
            name.to_uppercase(),
            dest.display().to_string(),
        ));
    }
    if let Err(e) = std::fs::write(out_dir.join("modules.rs"), consts) {
        fail(&format!("cannot write modules.rs: {e}"));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
