//! JavaScript modules: the JavaScript SDK passes its `node --test` suite, and a small JavaScript
//! reconciler (tests/guests/js-probe), built with the pinned componentize-js
//! (scripts/js-module.sh), loads and runs in the host's engine with its real limits: the default
//! per-call limits, the pool of the default engine, a fresh instance per call, the deadline, the
//! memory cap, and the sandbox's clocks and randomness.
//!
//! The first run installs the pinned tools (network) and builds the component (~12 s); later
//! runs are offline and find the component up to date (by the hash of its inputs) and its
//! compiled code in the cache beside it. A missing node, npm or toolchain fails these tests with
//! the script's message: they never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{build, root, succeed};

use wasmop::contract::{
    Action, ConditionStatus, Context, EventType, Gvk, KindObjects, Mapping, Operation, Propagation,
    ReconcileRequest, Trigger, ValidateRequest, ValidateResponse,
};
use wasmop::engine::{
    CallError, Engine, EngineConfig, Limits, MAX_CORE_INSTANCES_PER_MODULE, Module,
};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("js")
}

/// `bash scripts/js-module.sh`, its arguments to be added.
fn script() -> Command {
    common::script("js-module.sh")
}

/// The probe component, built once per test binary (skipped by the script when up to date).
fn probe_wasm() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build(
            script(),
            &root().join("tests/guests/js-probe"),
            "probe",
            tmp().join("probe.wasm"),
            "building the js-probe component",
        )
    })
}

/// One engine as the host builds it by default (its pool, its limits), with a compiled cache
/// that outlives the run, and the probe loaded into it under the default per-call limits.
fn probe() -> &'static Module {
    static LOADED: OnceLock<Module> = OnceLock::new();
    LOADED.get_or_init(|| {
        let bytes = std::fs::read(probe_wasm()).expect("the probe component");
        let engine = Engine::new(&EngineConfig {
            cache_dir: Some(tmp().join("compiled")),
            ..EngineConfig::default()
        })
        .expect("engine");
        engine
            .load(&bytes, &Limits::default())
            .unwrap_or_else(|e| panic!("the JavaScript component does not load: {e}"))
    })
}

fn request(name: &str, config: serde_json::Value, now_unix_ms: u64) -> ReconcileRequest {
    ReconcileRequest {
        primary: serde_json::json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "Probe",
            "metadata": {"name": name, "namespace": "ns", "uid": "u"},
            "spec": {"message": "hello", "secret": "hunter2"}
        })
        .to_string(),
        owned: vec![KindObjects {
            kind: Gvk::new("v1", "ConfigMap"),
            objects: vec![],
        }],
        related: vec![KindObjects {
            kind: Gvk::new("v1", "Secret"),
            objects: vec![
                serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}})
                    .to_string(),
            ],
        }],
        context: Context {
            reconciler: "js-probe".into(),
            trigger: Trigger::Resync,
            attempt: 1,
            config: config.to_string(),
            now_unix_ms,
        },
    }
}

fn mode(mode: &str) -> ReconcileRequest {
    request("p", serde_json::json!({ "mode": mode }), 1_700_000_000_123)
}

#[test]
fn the_js_sdk_passes_its_node_tests() {
    let out = script()
        .arg("test")
        .arg(root().join("guest-sdk/js"))
        .output()
        .expect("runs bash");
    let text = succeed("node --test guest-sdk/js", out);
    assert!(text.contains("# fail 0"), "{text}");
    assert!(!text.contains("# pass 0"), "{text}");
}

#[test]
fn the_js_component_fits_the_default_pool_and_limits_and_declares_its_metadata() {
    let module = probe();
    let needs = module.needs();
    assert!(
        needs.core_instances <= MAX_CORE_INSTANCES_PER_MODULE,
        "{needs:?}"
    );
    assert!(
        needs.largest_initial_memory_bytes <= Limits::default().memory_bytes,
        "{needs:?}"
    );
    eprintln!(
        "js-probe: {} bytes, needs {needs:?}, loaded in {:?} ({:?})",
        module.size(),
        module.load_time(),
        module.compiled()
    );
    let m = module.metadata();
    assert_eq!((m.name.as_str(), m.version.as_str()), ("js-probe", "0.1.0"));
    assert_eq!(m.primary, Gvk::new("example.wasmop.dev/v1", "Probe"));
    assert_eq!(m.owns, vec![Gvk::new("v1", "ConfigMap")]);
    assert_eq!(m.related.len(), 1);
    assert_eq!(m.related[0].kind, Gvk::new("v1", "Secret"));
    assert_eq!(m.related[0].maps_to, Mapping::SameName);
    assert_eq!(
        m.related[0]
            .selector
            .match_labels
            .get("probe")
            .map(String::as_str),
        Some("yes")
    );
    assert!(m.finalizes && m.validates);
}

#[test]
fn a_js_reconcile_answers_every_intent_in_a_fresh_instance_per_call() {
    let module = probe();
    let limits = Limits::default();
    for _ in 0..2 {
        let out = module.reconcile(mode("answer"), &limits);
        let stats = out.stats;
        let r = out.result.expect("the probe reconciles");
        eprintln!(
            "js-probe reconcile: instantiate {:?}, call {:?}, memory peak {} bytes",
            stats.instantiate, stats.call, stats.memory_peak
        );
        assert_eq!(r.children.len(), 1);
        assert_eq!(r.children[0].kind, Gvk::new("v1", "ConfigMap"));
        let cm = &r.children[0].objects[0];
        assert_eq!(cm["metadata"]["name"], "p-probe");
        assert_eq!(cm["data"]["message"], "hello from ns/p", "{cm}");
        assert_eq!(cm["data"]["secrets"], "p", "the related objects reach it");
        let status = r.status.expect("a status");
        // Module state starts afresh: every call is the module's first.
        assert_eq!(status.fields["calls"], 1, "{}", status.fields);
        assert_eq!(status.fields["trigger"], "resync");
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].type_, "Ready");
        assert_eq!(status.conditions[0].status, ConditionStatus::True);
        assert_eq!(status.conditions[0].reason, "Probed");
        assert_eq!(r.events.len(), 1);
        assert_eq!(r.events[0].type_, EventType::Normal);
        assert_eq!(
            r.events[0].regarding.as_ref().map(|o| o.name.as_str()),
            Some("p")
        );
        assert_eq!(r.requeue_after, Some(Duration::from_secs(90)));
    }
}

#[test]
fn js_time_and_randomness_come_from_the_request() {
    let module = probe();
    let limits = Limits::default();
    let status = |request: ReconcileRequest| {
        module
            .reconcile(request, &limits)
            .result
            .expect("the probe reconciles")
            .status
            .expect("a status")
            .fields
    };
    let first = status(mode("answer"));
    assert_eq!(first["contextNow"], 1_700_000_000_123u64);
    // Date.now() reads the sandbox's wall clock: the request's time (the clock ticks 1 µs per
    // reading, so it is still that millisecond).
    assert_eq!(first["dateNow"], 1_700_000_000_123u64, "{first}");
    let again = status(mode("answer"));
    assert_eq!(
        first["random"], again["random"],
        "Math.random() is seeded by the sandbox from the request"
    );
    let other = status(request(
        "q",
        serde_json::json!({ "mode": "answer" }),
        1_700_000_000_123,
    ));
    assert_ne!(
        first["random"], other["random"],
        "another object, other randomness"
    );
}

#[test]
fn js_failures_are_typed_errors_within_the_limits_and_the_engine_keeps_working() {
    let module = probe();
    let limits = Limits::default();
    let answers = || {
        module
            .reconcile(mode("answer"), &limits)
            .result
            .expect("the probe answers after a failure")
    };

    let err = module
        .reconcile(mode("fail"), &limits)
        .result
        .expect_err("fails");
    assert_eq!(
        err,
        CallError::Module {
            message: "probe p fails on purpose".into()
        }
    );

    // Any other exception is named with where it was thrown; its text (a value) is not shown.
    let err = module
        .reconcile(mode("crash"), &limits)
        .result
        .expect_err("fails");
    let CallError::Module { message } = &err else {
        panic!("expected the module's error, got {err:?}");
    };
    assert!(message.starts_with("TypeError at probe.js:"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    answers();

    let err = module
        .reconcile(mode("spin"), &limits)
        .result
        .expect_err("stopped");
    assert_eq!(
        err,
        CallError::Deadline {
            deadline: limits.deadline
        }
    );
    answers();

    // The default memory cap, with a deadline long enough that only the cap can stop the
    // allocation loop, however loaded the machine.
    let hog_limits = Limits {
        deadline: Duration::from_secs(60),
        ..limits
    };
    let err = module
        .reconcile(mode("hog"), &hog_limits)
        .result
        .expect_err("stopped");
    assert!(
        matches!(err, CallError::Memory { limit, requested } if limit == limits.memory_bytes && requested > limit),
        "{err:?}"
    );
    answers();
}

#[test]
fn js_log_lines_reach_the_host_within_the_budget() {
    let limits = Limits {
        log_lines: 2,
        ..Limits::default()
    };
    let out = probe().reconcile(mode("log"), &limits);
    out.result.expect("the probe reconciles");
    assert_eq!(
        out.stats.logs_dropped, 3,
        "5 lines through the host's log import, 2 within the budget"
    );
}

#[test]
fn js_validate_and_finalize_cross_the_contract() {
    let module = probe();
    let limits = Limits::default();
    let validate = |new: serde_json::Value| {
        module
            .validate(
                ValidateRequest {
                    operation: Operation::Create,
                    old: None,
                    new: new.to_string(),
                    config: "{}".into(),
                },
                &limits,
            )
            .result
            .expect("the probe validates")
    };
    let probe_object = |spec: serde_json::Value| serde_json::json!({"apiVersion": "example.wasmop.dev/v1", "kind": "Probe", "metadata": {"name": "p"}, "spec": spec});
    assert_eq!(
        validate(probe_object(serde_json::json!({"message": "hi"}))),
        ValidateResponse::Allowed {
            warnings: vec!["operation create".into()]
        }
    );
    assert_eq!(
        validate(probe_object(serde_json::json!({}))),
        ValidateResponse::Denied {
            message: "spec.message is required".into(),
            field: Some("spec.message".into())
        }
    );

    let f = module
        .finalize(mode("answer"), &limits)
        .result
        .expect("the probe finalizes");
    assert!(!f.done);
    assert_eq!(f.requeue_after, Some(Duration::from_secs(1)));
    match f.actions.as_slice() {
        [
            Action::Delete {
                target,
                propagation: Propagation::Background,
            },
        ] => assert_eq!(target.name, "p-probe"),
        other => panic!("expected one delete, got {other:?}"),
    }
}

/// `wasmop new --lang js`: the generated project passes its own `node --test` (`./build.sh
/// test`), and its module, built with the same pinned tools and build script
/// (`scripts/js-module.sh build`, cached by the hash of the project's sources, which are the
/// same at every run), passes `wasmop test` against the project's golden file. The project's
/// `./build.sh` runs the same `tools/build.mjs` with the same tools; it is not run here because
/// it always rebuilds (~12 s) and a JavaScript build is not byte-for-byte reproducible, so the
/// compiled-module cache would never be warm.
#[test]
fn a_js_project_from_wasmop_new_passes_its_tests_and_its_golden_test() {
    let work = tempfile::tempdir().expect("a temporary directory");
    let dir = work.path().join("hello-js");
    let wasmop = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmop"));
        cmd.env("WASMOP_CACHE", tmp().join("compiled-cli"))
            .env("RUST_LOG", "warn");
        cmd
    };
    let out = wasmop()
        .args(["new", "hello-js", "--lang", "js", "--dir"])
        .arg(&dir)
        .output()
        .expect("runs wasmop");
    succeed("wasmop new --lang js", out);
    for file in [
        "hello_js.js",
        "build.sh",
        "package.json",
        "tests/hello_js.test.js",
        "tools/package-lock.json",
        "tools/build.mjs",
        "wasmop-sdk/index.js",
        "wit/reconciler.wit",
        "fixtures/expected.yaml",
        "k8s/wasmreconciler.yaml",
    ] {
        assert!(
            dir.join(file).is_file(),
            "wasmop new --lang js wrote no {file}"
        );
    }
    // The same pins as wasmop's own JavaScript builds: the project shares their tools.
    assert_eq!(
        std::fs::read_to_string(dir.join("tools/package-lock.json")).ok(),
        std::fs::read_to_string(root().join("guest-sdk/js/tools/package-lock.json")).ok()
    );
    let tests = Command::new("bash")
        .arg(dir.join("build.sh"))
        .arg("test")
        .output()
        .expect("runs bash");
    let text = succeed("./build.sh test in the generated project", tests);
    assert!(
        text.contains("# pass 1") && text.contains("# fail 0"),
        "{text}"
    );

    let module = build(
        script(),
        &dir,
        "hello_js",
        tmp().join("hello_js.wasm"),
        "building the generated project",
    );
    let golden = wasmop()
        .arg("test")
        .arg(&module)
        .args(["--reconciler", "hello-js", "--object"])
        .arg(dir.join("fixtures/cr.yaml"))
        .arg("--expect")
        .arg(dir.join("fixtures/expected.yaml"))
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop test of the generated project", golden);
    assert!(text.contains("the intents match"), "{text}");
}

/// The feature-flags example's component, built once per test binary (skipped when up to date).
fn feature_flags_wasm() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build(
            script(),
            &root().join("examples/feature-flags"),
            "flags",
            tmp().join("feature_flags.wasm"),
            "building the feature-flags component",
        )
    })
}

#[test]
fn the_feature_flags_example_passes_its_node_tests() {
    let out = script()
        .arg("test")
        .arg(root().join("examples/feature-flags"))
        .output()
        .expect("runs bash");
    let text = succeed("node --test examples/feature-flags", out);
    assert!(
        text.contains("# fail 0") && !text.contains("# pass 0"),
        "{text}"
    );
}

#[test]
fn the_feature_flags_component_matches_its_golden_files() {
    let wasm = feature_flags_wasm();
    let wasmop = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmop"));
        cmd.env("WASMOP_CACHE", tmp().join("compiled-cli"))
            .env("RUST_LOG", "warn")
            .current_dir(root().join("examples/feature-flags"));
        cmd
    };
    let reconcile = wasmop()
        .arg("test")
        .arg(wasm)
        .args(["--object", "fixtures/cr.yaml"])
        .args(["--observed", "fixtures/observed/previous.yaml"])
        .args(["--reconciler", "feature-flags"])
        .args(["--expect", "fixtures/expected.yaml"])
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop test (reconcile)", reconcile);
    assert!(text.contains("the intents match"), "{text}");

    let validate = wasmop()
        .arg("test")
        .arg(wasm)
        .args([
            "--validate",
            "--object",
            "fixtures/validate/bad-rollout.yaml",
        ])
        .args(["--old", "fixtures/cr.yaml"])
        .args(["--expect", "fixtures/expected-validate.yaml"])
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop test --validate", validate);
    assert!(text.contains("rollout of new-checkout is 250"), "{text}");
}
