//! A real Metacontroller hook module (a component of the `hook` world) named by a plain
//! WasmReconciler, one without `spec.hook`: the host refuses to serve it, saying it is a hook,
//! rather than failing on the missing `guest` interface at the first reconcile. The same module
//! is served once the spec names the controller, so the refusal is the spec's, not the module's.
//!
//! The hook is the JavaScript SDK's sample `guest-sdk/js/tests/hooks/probe.js`, built unchanged
//! with `scripts/js-module.sh hook` (the pinned componentize-js; ~12 s the first time, skipped
//! when its inputs are unchanged). A missing node, npm or toolchain fails this test with the
//! script's message: it never skips.

#[allow(dead_code)] // `build` is for `build DIR APP OUT`; a hook is built with `hook FILE OUT`
mod common;

use std::path::{Path, PathBuf};

use common::{root, succeed};

use wasmop::crd::{HookSpec, WasmReconcilerSpec};
use wasmop::engine::{Engine, EngineConfig, Limits, LoadError, Module};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hook-world")
}

/// The JavaScript hook sample, built into a component and loaded by an engine as the host's.
fn hook_module() -> Module {
    let out = tmp().join("probe.wasm");
    let built = common::script("js-module.sh")
        .arg("hook")
        .arg(root().join("guest-sdk/js/tests/hooks/probe.js"))
        .arg(&out)
        .output()
        .expect("runs bash");
    succeed("building the JavaScript hook probe.js", built);
    let bytes = std::fs::read(&out).expect("the hook component");
    let engine = Engine::new(&EngineConfig {
        cache_dir: Some(tmp().join("compiled")),
        ..EngineConfig::default()
    })
    .expect("engine");
    engine
        .load(&bytes, &Limits::default())
        .unwrap_or_else(|e| panic!("the hook component does not load: {e}"))
}

fn spec(hook: Option<serde_json::Value>) -> WasmReconcilerSpec {
    let mut spec: WasmReconcilerSpec = serde_json::from_value(serde_json::json!({
        "module": {"configMap": {"namespace": "ns", "name": "probe"}},
        "primary": {"apiVersion": "example.com/v1", "kind": "Probe"},
        "owns": [{"apiVersion": "v1", "kind": "ConfigMap"}],
        "serviceAccount": {"namespace": "ns", "name": "probe"}
    }))
    .expect("a WasmReconciler spec");
    spec.hook = hook.map(|h| serde_json::from_value::<HookSpec>(h).expect("a hook spec"));
    spec
}

#[test]
fn a_hook_module_is_refused_for_a_wasm_reconciler_without_spec_hook() {
    let module = hook_module();
    assert!(
        module.is_hook(),
        "probe.js did not build into a hook-world component"
    );

    match wasmop::metacontroller::serve(module.clone(), &spec(None)) {
        Err(LoadError::Metadata(message)) => assert!(
            message.starts_with("is a Metacontroller hook (world `hook`): it serves only a CompositeController whose spec.wasmop names it"),
            "{message}"
        ),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a hook module was served by a WasmReconciler without spec.hook"),
    }

    let controller = serde_json::json!({
        "controller": {"metadata": {"name": "probe"}}, "sync": "/sync"
    });
    let served = wasmop::metacontroller::serve(module, &spec(Some(controller)))
        .unwrap_or_else(|e| panic!("the hook module with spec.hook: {e}"));
    assert_eq!(served.metadata().primary.kind, "Probe");
}
