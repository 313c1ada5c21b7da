//! The `wasmop` command line, run as users run it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use wasmop_test_modules as modules;

/// The commands' cache (compiled modules): one directory under the target's, kept between
/// runs (a warm run compiles nothing), not a new one in /tmp per run (each left ~9 MB behind).
fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache")
}

fn wasmop() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmop"));
    cmd.env("WASMOP_CACHE", cache()).env("RUST_LOG", "warn");
    cmd
}

/// Runs `cmd`, which must succeed (its stderr otherwise), and returns its stdout.
fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
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
    let out = stdout_of(wasmop().arg("inspect").arg(modules::IMAGE_UPDATER));
    let stdout = String::from_utf8_lossy(&out);
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

/// The `wasmop` binary linked under `name` in a fresh directory, as `wasmop plugin install`
/// links it.
fn linked_as(dir: &Path, name: &str) -> Command {
    let status = wasmop()
        .args(["plugin", "install", "--dir"])
        .arg(dir)
        .status()
        .expect("runs");
    assert!(status.success());
    let mut cmd = Command::new(dir.join(name));
    cmd.env("WASMOP_CACHE", cache()).env("RUST_LOG", "warn");
    cmd
}

#[test]
fn as_kubectl_wasmop_it_runs_as_wasmop_under_kubectls_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = linked_as(dir.path(), "kubectl-wasmop")
        .arg("--help")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("Usage: kubectl wasmop"), "{stdout}");
    // A second install leaves the links in place; a file in the way is refused.
    let again = wasmop()
        .args(["plugin", "install", "--dir"])
        .arg(dir.path())
        .output()
        .expect("runs");
    assert!(again.status.success());
    let other = tempfile::tempdir().expect("tempdir");
    std::fs::write(other.path().join("kubectl-wasmop"), "x").expect("write");
    let refused = wasmop()
        .args(["plugin", "install", "--dir"])
        .arg(other.path())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("--force"), "{stderr}");
}

#[test]
fn kubectl_plugin_completion_offers_subcommands_and_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    // kubectl runs `kubectl_complete-wasmop <words after "kubectl wasmop">`, the last being
    // the word completed, and reads cobra's format: candidates, then `:directive`.
    let complete = |words: &[&str]| {
        let out = linked_as(dir.path(), "kubectl_complete-wasmop")
            .args(words)
            .output()
            .expect("runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let subcommands = complete(&[""]);
    for name in ["inspect", "test", "diff", "push", "completion", "plugin"] {
        assert!(
            subcommands
                .lines()
                .any(|l| l.starts_with(&format!("{name}\t"))),
            "{subcommands}"
        );
    }
    assert!(subcommands.ends_with(":4\n"), "{subcommands}");
    let flags = complete(&["diff", "--con"]);
    assert!(flags.starts_with("--context\t"), "{flags}");
    // A module path: the shell completes file names.
    assert_eq!(complete(&["inspect", "mod"]), ":0\n");
}

#[test]
fn completion_scripts_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = wasmop().args(["completion", shell]).output().expect("runs");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}");
        for name in ["inspect", "test", "diff", "push", "completion"] {
            assert!(script.contains(name), "{shell} lacks {name}");
        }
    }
    let bad = wasmop()
        .args(["completion", "tcsh"])
        .output()
        .expect("runs");
    assert!(!bad.status.success());
}

#[test]
fn test_prints_the_same_intents_as_json_or_yaml_with_output() {
    let run = |extra: &[&str]| {
        let mut cmd = wasmop();
        test_args(&mut cmd, &fixtures().join("cr.yaml"));
        String::from_utf8_lossy(&stdout_of(cmd.args(extra))).into_owned()
    };
    let default = run(&[]);
    let json: serde_json::Value = serde_json::from_str(&run(&["-o", "json"])).expect("JSON");
    let yaml = run(&["--output", "yaml"]);
    assert_eq!(yaml, default, "-o yaml is the default output");
    let golden: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(fixtures().join("expected.yaml")).expect("golden"),
    )
    .expect("golden");
    assert_eq!(
        json, golden,
        "the JSON is the intents the golden file holds"
    );
    assert!(
        json["children"].as_array().is_some_and(|c| !c.is_empty()),
        "{json}"
    );
}

#[test]
fn inspect_prints_json_with_output() {
    let out = stdout_of(wasmop().args(["inspect", modules::IMAGE_UPDATER, "-o", "json"]));
    let doc: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
    assert_eq!(doc["metadata"]["name"], "image-updater", "{doc}");
    assert!(
        doc["sha256"].as_str().is_some_and(|s| s.len() == 64),
        "{doc}"
    );
}

/// A kubeconfig file with `body` (no cluster is contacted: `push --dry-run` only reads it).
fn kubeconfig(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).expect("write");
    path
}

/// A KUBECONFIG list of two files in `dir`, merged in order: the current context (`two`) from
/// the first, the contexts from the second, which holds cluster `c`, user `u` and `contexts`
/// (the items of its `contexts:` list). Returns the list and the second file.
fn kubeconfig_list(dir: &Path, contexts: &str) -> (OsString, PathBuf) {
    let first = kubeconfig(
        dir,
        "a",
        "apiVersion: v1\nkind: Config\ncurrent-context: two\n",
    );
    let second = kubeconfig(
        dir,
        "b",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:1'}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n{contexts}"
        ),
    );
    let list = std::env::join_paths([&first, &second]).expect("join");
    (list, second)
}

#[test]
fn push_takes_its_namespace_as_kubectl_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (list, second) = kubeconfig_list(
        dir.path(),
        "- name: two\n  context: {cluster: c, user: u, namespace: from-two}\n\
         - name: three\n  context: {cluster: c, user: u, namespace: from-three}\n",
    );
    let namespace = |extra: &[&str]| {
        let out = stdout_of(
            wasmop()
                .args(["push", modules::IMAGE_UPDATER, "--name", "m", "--dry-run"])
                .args(extra)
                .env("KUBECONFIG", &list),
        );
        let cm: serde_json::Value =
            serde_saphyr::from_str(&String::from_utf8_lossy(&out)).expect("YAML");
        cm["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(namespace(&[]), "from-two");
    assert_eq!(namespace(&["--context", "three"]), "from-three");
    assert_eq!(namespace(&["--context", "three", "-n", "given"]), "given");
    let only = second.display().to_string();
    assert_eq!(
        namespace(&["--kubeconfig", &only, "--context", "three"]),
        "from-three"
    );
}

#[test]
fn run_takes_kubectls_connection_flags_and_kubeconfig_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (list, _) = kubeconfig_list(
        dir.path(),
        "- name: two\n  context: {cluster: c, user: u}\n",
    );
    // A context the merged list does not hold is refused at once, named, before any connection.
    let out = wasmop()
        .args(["run", "--context", "nope"])
        .env("KUBECONFIG", &list)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("nope") && stderr.contains("$KUBECONFIG"),
        "{stderr}"
    );
}
