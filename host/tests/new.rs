//! `wasmop new` out of the box: a Rust project generated without `--sdk-path` builds with only
//! the `wasmop` binary and the toolchains (the SDK it was built with is copied into the project,
//! no checkout, no git or registry release of the SDK) and passes `wasmop test` against its own
//! golden file.
//!
//! # Caveats
//! The build resolves against the workspace's `Cargo.lock` (copied in) and runs `--offline`, so
//! that the test needs no network and builds the versions the workspace is tested with; a user
//! without that lock file resolves the same version requirements from crates.io.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WASMOP: &str = env!("CARGO_BIN_EXE_wasmop");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `wasmop` binary with `args`, its failure shown with its output.
fn wasmop(args: &[&str]) -> Output {
    // A compiled-module cache of the test's own, not the user's.
    let cache = Path::new(WASMOP)
        .parent()
        .map(|d| d.join("new-test-cache"))
        .unwrap_or_else(std::env::temp_dir);
    let out = Command::new(WASMOP)
        .args(args)
        .env("WASMOP_CACHE", cache)
        .output()
        .unwrap_or_else(|e| panic!("running {WASMOP}: {e}"));
    assert!(
        out.status.success(),
        "wasmop {}: {}",
        args.join(" "),
        text(&out)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The project's `cargo build --release --target wasm32-wasip2`, as its README says, in a
/// target directory beside this test's (`<target>/new-project`, shared with tests/e2e/author.rs;
/// later runs reuse it). The nested cargo gets none of this test's cargo environment.
fn build(dir: &Path) -> PathBuf {
    let target = Path::new(WASMOP)
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("new-project"))
        .unwrap_or_else(|| repo().join("target/new-project"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--offline",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--target-dir")
        .arg(&target);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_string();
        // Nor `make test`'s clippy wrapper (scripts/test-run.sh): the project builds as its
        // README says, with plain rustc.
        if key.starts_with("CARGO_") && key != "CARGO_HOME"
            || matches!(
                key.as_str(),
                "RUSTFLAGS" | "RUSTC_WORKSPACE_WRAPPER" | "CLIPPY_ARGS"
            )
        {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running cargo: {e}"));
    assert!(
        out.status.success(),
        "building the generated project in {} failed:\n{}",
        dir.display(),
        text(&out)
    );
    target.join("wasm32-wasip2/release")
}

#[test]
fn a_project_without_sdk_path_carries_the_sdk_builds_and_passes_its_golden_test() {
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory: {e}"));
    let dir = work.path().join("hello-op");
    let dir_s = dir.display().to_string();
    wasmop(&["new", "hello-op", "--dir", &dir_s]);

    // The SDK and its contract are in the project, and the project points at them.
    for file in [
        "wasmop-sdk/Cargo.toml",
        "wasmop-sdk/src/lib.rs",
        "wit/reconciler.wit",
    ] {
        assert!(dir.join(file).is_file(), "wasmop new wrote no {file}");
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    assert!(
        manifest.contains(r#"wasmop-sdk = { path = "wasmop-sdk" }"#),
        "the project does not depend on its copy of the SDK:\n{manifest}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("wit/reconciler.wit")).ok(),
        std::fs::read_to_string(repo().join("wit/reconciler.wit")).ok(),
        "the copied contract is this wasmop's"
    );

    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock"))
        .unwrap_or_else(|e| panic!("copying Cargo.lock: {e}"));
    let module = build(&dir).join("hello_op.wasm");
    assert!(module.is_file(), "{} was not built", module.display());
    let cr = dir.join("fixtures/cr.yaml").display().to_string();
    let expected = dir.join("fixtures/expected.yaml").display().to_string();
    wasmop(&[
        "test",
        &module.display().to_string(),
        "--reconciler",
        "hello-op",
        "--object",
        &cr,
        "--expect",
        &expected,
    ]);
}
