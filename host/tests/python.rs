//! Python modules: the Python SDK and the tenant example pass their pytest suites, and the tenant
//! component, built with the pinned componentize-py (scripts/python-module.sh), loads in the host
//! and matches its golden files under `wasmop test`, exactly as a Rust module does.
//!
//! The first run installs the pinned tools (network); later runs are offline. A missing Python
//! fails these tests with the script's message: they never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{build, root, succeed};

/// `bash scripts/python-module.sh`, its arguments to be added.
fn script() -> Command {
    common::script("python-module.sh")
}

/// The tenant component, built once per test binary (skipped by the script when up to date).
fn tenant_wasm() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build(
            script(),
            &root().join("examples/tenant"),
            "tenant",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("python/tenant.wasm"),
            "building the tenant component",
        )
    })
}

fn wasmop() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmop"));
    // A cache that outlives the run: compiling the 18 MB component takes tens of seconds.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python/compiled");
    cmd.env("WASMOP_CACHE", cache).env("RUST_LOG", "warn");
    cmd.current_dir(root().join("examples/tenant"));
    cmd
}

#[test]
fn the_python_sdk_passes_its_pytest_suite() {
    let out = script()
        .arg("pytest")
        .arg(root().join("guest-sdk/python"))
        .output()
        .expect("runs bash");
    let text = succeed("pytest guest-sdk/python", out);
    assert!(text.contains(" passed"), "{text}");
}

#[test]
fn the_tenant_example_passes_its_pytest_suite() {
    let out = script()
        .arg("pytest")
        .arg(root().join("examples/tenant"))
        .output()
        .expect("runs bash");
    let text = succeed("pytest examples/tenant", out);
    assert!(text.contains(" passed"), "{text}");
}

#[test]
fn the_tenant_component_matches_its_golden_files() {
    let wasm = tenant_wasm();
    let reconcile = wasmop()
        .arg("test")
        .arg(wasm)
        .args(["--object", "fixtures/cr.yaml"])
        .args(["--observed", "fixtures/observed/namespace.yaml"])
        .args(["--observed", "fixtures/observed/quota.yaml"])
        .args(["--reconciler", "tenant"])
        .args(["--expect", "fixtures/expected.yaml"])
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop test (reconcile)", reconcile);
    assert!(text.contains("the intents match"), "{text}");

    let validate = wasmop()
        .arg("test")
        .arg(wasm)
        .args(["--validate", "--object", "fixtures/validate/shrink.yaml"])
        .args(["--old", "fixtures/cr.yaml"])
        .args(["--expect", "fixtures/expected-validate.yaml"])
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop test --validate", validate);
    assert!(text.contains("below the current usage 6Gi"), "{text}");
}

#[test]
fn inspect_shows_what_the_python_component_needs_and_a_too_small_memory_cap_is_refused_at_load() {
    let wasm = tenant_wasm();
    let inspect = wasmop()
        .arg("inspect")
        .arg(wasm)
        .output()
        .expect("runs wasmop");
    let text = succeed("wasmop inspect", inspect);
    // componentize-py 0.25.1: CPython, libc, the WASI adapter and shims, one ~12.7 MiB memory.
    assert!(text.contains("needs:      14 core instances"), "{text}");
    assert!(text.contains("1 memories, 12.7 MiB initial"), "{text}");

    let refused = wasmop()
        .arg("test")
        .arg(wasm)
        .args(["--object", "fixtures/cr.yaml", "--memory-mib", "8"])
        .output()
        .expect("runs wasmop");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("bytes of initial linear memory") && stderr.contains("spec.limits.memory"),
        "{stderr}"
    );
}

/// The tenant example's fixture request: its Tenant, no observed children.
fn tenant_request(module: &wasmop::engine::Module) -> wasmop::contract::ReconcileRequest {
    use wasmop::contract::{Context, KindObjects, ReconcileRequest, Trigger};
    let text = std::fs::read_to_string(root().join("examples/tenant/fixtures/cr.yaml"))
        .expect("the tenant fixture");
    let primary: serde_json::Value = serde_saphyr::from_str(&text).expect("fixture YAML");
    ReconcileRequest {
        primary: primary.to_string(),
        owned: module
            .metadata()
            .owns
            .iter()
            .map(|kind| KindObjects {
                kind: kind.clone(),
                objects: vec![],
            })
            .collect(),
        related: vec![],
        context: Context {
            reconciler: "tenant".into(),
            trigger: Trigger::PrimaryChanged,
            attempt: 1,
            config: "{}".into(),
            now_unix_ms: 0,
        },
    }
}

/// The fast tier (Winch, its trampolines compiled by Cranelift without optimizations) runs the
/// whole of CPython: the fast build of the tenant component answers exactly as its optimized
/// build does.
#[test]
fn the_tenant_component_answers_alike_on_its_fast_and_optimized_builds() {
    use wasmop::engine::{Engine, EngineConfig, Limits, Tier};
    let bytes = std::fs::read(tenant_wasm()).expect("the tenant component");
    let engine = Engine::new(&EngineConfig {
        max_instances: 4,
        max_calls: 4,
        tiered: true,
        ..EngineConfig::default()
    })
    .expect("engine");
    let limits = Limits {
        deadline: std::time::Duration::from_secs(60),
        ..Limits::default()
    };
    let module = engine
        .load(&bytes, &limits)
        .expect("the tenant component loads");
    assert_eq!(module.tier(), Tier::Fast, "a never-seen module starts fast");
    let fast = module
        .reconcile(tenant_request(&module), &limits)
        .result
        .expect("the fast build reconciles the fixture");
    assert_eq!(fast.children.len(), 5, "the tenant's five child kinds");

    let started = std::time::Instant::now();
    while module.tier() != Tier::Optimized {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(600),
            "the optimized build did not replace the fast one within 600 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let optimized = module
        .reconcile(tenant_request(&module), &limits)
        .result
        .expect("the optimized build reconciles the fixture");
    assert_eq!(fast, optimized, "the same answer from either build");
}
