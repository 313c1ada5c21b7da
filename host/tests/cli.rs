//! The `wasmop` command line, run as users run it.

use std::path::{Path, PathBuf};
use std::process::Command;

use wasmop_test_modules as modules;

fn wasmop() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmop"));
    let cache = std::env::temp_dir().join(format!("wasmop-cli-test-cache-{}", std::process::id()));
    cmd.env("WASMOP_CACHE", cache).env("RUST_LOG", "warn");
    cmd
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/image-updater/fixtures")
}

fn test_args(cmd: &mut Command, object: &Path) {
    let f = fixtures();
    cmd.arg("test")
        .arg(modules::IMAGE_UPDATER)
        .arg("--object")
        .arg(object)
        .arg("--observed")
        .arg(f.join("observed/deployment.yaml"))
        .arg("--observed")
        .arg(f.join("observed/service.yaml"))
        .args(["--reconciler", "image-updater"])
        .arg("--expect")
        .arg(f.join("expected.yaml"));
}

#[test]
fn test_matches_the_golden_file_of_the_example() {
    let mut cmd = wasmop();
    test_args(&mut cmd, &fixtures().join("cr.yaml"));
    let out = cmd.output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the intents match"), "{stderr}");
}

#[test]
fn test_fails_with_a_diff_when_a_fixture_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let changed = dir.path().join("cr.yaml");
    let text = std::fs::read_to_string(fixtures().join("cr.yaml")).expect("cr");
    std::fs::write(&changed, text.replace("replicas: 3", "replicas: 5")).expect("write");
    let mut cmd = wasmop();
    test_args(&mut cmd, &changed);
    let out = cmd.output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stdout.contains("-      replicas: 3") && stdout.contains("+      replicas: 5"),
        "{stdout}"
    );
    assert!(stderr.contains("differ"), "{stderr}");
}

#[test]
fn test_refuses_undeclared_children_naming_the_intent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let widget = dir.path().join("widget.yaml");
    std::fs::write(&widget, "apiVersion: test.wasmop.dev/v1\nkind: Widget\nmetadata: {name: w, namespace: ns}\nspec: {mode: undeclared}\n").expect("write");
    let out = wasmop()
        .arg("test")
        .arg(modules::MISBEHAVE)
        .arg("--object")
        .arg(&widget)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("children[v1/Secret]: v1/Secret is not an owned kind"),
        "{stderr}"
    );
}

#[test]
fn inspect_prints_metadata_version_size_and_digest() {
    let out = wasmop()
        .arg("inspect")
        .arg(modules::IMAGE_UPDATER)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = wasmop::engine::sha256_hex(&modules::bytes(modules::IMAGE_UPDATER));
    for needle in [
        "image-updater",
        "wasmop:reconciler@0.1.0",
        "example.wasmop.dev/v1/App",
        "apps/v1/Deployment, v1/Service",
        &digest,
    ] {
        assert!(stdout.contains(needle), "missing {needle} in\n{stdout}");
    }
    let out = wasmop()
        .arg("inspect")
        .arg(modules::WRONG_VERSION)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("wasmop:reconciler/guest@0.2.0"), "{stderr}");
}

/// Runs `wasmop test` as an example's README says and expects its golden file to match.
fn golden(example: &str, module: &str, args: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(example);
    let out = wasmop()
        .current_dir(&dir)
        .arg("test")
        .arg(module)
        .args(args)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{example} {args:?}: {stderr}");
    assert!(stderr.contains("the intents match"), "{example}: {stderr}");
}

#[test]
fn every_examples_golden_files_match() {
    let pr = [
        "--object",
        "fixtures/cr.yaml",
        "--observed",
        "fixtures/observed/statefulset.yaml",
        "--observed",
        "fixtures/observed/pvcs.yaml",
        "--reconciler",
        "primary-replica",
        "--now-unix-ms",
        "0",
    ];
    golden(
        "primary-replica",
        modules::PRIMARY_REPLICA,
        &[&pr[..], &["--expect", "fixtures/expected.yaml"]].concat(),
    );
    golden(
        "primary-replica",
        modules::PRIMARY_REPLICA,
        &[
            &["--finalize"],
            &pr[..],
            &["--expect", "fixtures/expected-finalize.yaml"],
        ]
        .concat(),
    );
    golden(
        "configmap-propagator",
        modules::CONFIGMAP_PROPAGATOR,
        &[
            "--object",
            "fixtures/cr.yaml",
            "--observed",
            "fixtures/observed/namespaces.yaml",
            "--observed",
            "fixtures/related/source.yaml",
            "--observed",
            "fixtures/observed/copies.yaml",
            "--reconciler",
            "configmap-propagator",
            "--now-unix-ms",
            "0",
            "--expect",
            "fixtures/expected.yaml",
        ],
    );
}

#[test]
fn validate_refuses_a_downgrade_of_the_primary_replica_example() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/primary-replica");
    let out = wasmop()
        .current_dir(&dir)
        .arg("test")
        .arg(modules::PRIMARY_REPLICA)
        .args(["--validate", "--object", "fixtures/cr.yaml"])
        .args(["--old", "fixtures/validate/old-16.1.yaml"])
        .output()
        .expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the run itself succeeds: {text}");
    assert!(
        text.contains("denied:")
            && text.contains("field: spec.version")
            && text.contains("downgrad"),
        "{text}"
    );
}

#[test]
fn test_reports_a_module_panic_with_its_message_and_exits_1() {
    // A panicking guest writes its report to stderr (a WASI call) before it traps: the command
    // must show the message, not crash itself.
    let dir = tempfile::tempdir().expect("tempdir");
    let widget = dir.path().join("widget.yaml");
    std::fs::write(&widget, "apiVersion: test.wasmop.dev/v1\nkind: Widget\nmetadata: {name: w, namespace: ns}\nspec: {mode: panic}\n").expect("write");
    let out = wasmop()
        .arg("test")
        .arg(modules::MISBEHAVE)
        .arg("--object")
        .arg(&widget)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the module panicked: deliberate panic while reconciling w"),
        "{stderr}"
    );
    assert!(!stderr.contains("Cannot start a runtime"), "{stderr}");
}
