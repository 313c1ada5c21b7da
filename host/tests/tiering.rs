//! Tiered compilation and the compiled cache's bound, against real modules: a load serves a fast
//! build at once, the optimized build replaces it in the background (every clone of the module
//! sees it), both builds land in the cache, and a later load finds the optimized one. The cache
//! evicts its least recently used entries beyond its size bound.

use std::time::{Duration, Instant};

use wasmop::contract::{Context, Gvk, KindObjects, ReconcileRequest, Trigger};
use wasmop::engine::{Compiled, Engine, EngineConfig, Limits, Module, Tier};
use wasmop_test_modules as modules;

/// Generous: the optimized compile of a small module on a loaded 2-core machine.
const OPTIMIZED_WITHIN: Duration = Duration::from_secs(300);

fn tiered(cache: &std::path::Path, max_bytes: u64) -> Engine {
    Engine::new(&EngineConfig {
        cache_dir: Some(cache.to_path_buf()),
        max_instances: 8,
        max_calls: 8,
        tiered: true,
        cache_max_bytes: max_bytes,
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn widget() -> ReconcileRequest {
    ReconcileRequest {
        primary: serde_json::json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u"},
            "spec": {"mode": "good"}
        })
        .to_string(),
        owned: vec![KindObjects {
            kind: Gvk::new("v1", "ConfigMap"),
            objects: vec![],
        }],
        related: vec![],
        context: Context {
            reconciler: "r".into(),
            trigger: Trigger::PrimaryChanged,
            attempt: 1,
            config: "{}".into(),
            now_unix_ms: 0,
        },
    }
}

fn reconciles(module: &Module) {
    let out = module.reconcile(widget(), &Limits::default());
    let response = out.result.expect("the good widget reconciles");
    assert_eq!(
        response.children[0].objects[0]["metadata"]["name"], "w-out",
        "the same answer whichever build serves"
    );
}

/// Waits for the state the module reports (the swap happens on another thread).
fn optimized(module: &Module) {
    let started = Instant::now();
    while module.tier() != Tier::Optimized {
        assert!(
            started.elapsed() < OPTIMIZED_WITHIN,
            "the optimized build did not replace the fast one within {OPTIMIZED_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("cache dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".cwasm"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_new_module_serves_a_fast_build_until_the_optimized_one_replaces_it() {
    let cache = tempfile::tempdir().expect("tempdir");
    let engine = tiered(cache.path(), u64::MAX);
    let bytes = modules::bytes(modules::MISBEHAVE);
    let module = engine.load(&bytes, &Limits::default()).expect("loads");
    assert_eq!(module.tier(), Tier::Fast, "a never-seen module starts fast");
    assert_eq!(module.compiled(), Compiled::Fresh);
    let clone = module.clone();
    reconciles(&module);

    optimized(&module);
    assert_eq!(clone.tier(), Tier::Optimized, "every clone sees the swap");
    reconciles(&clone);
    assert_eq!(
        entries(cache.path()).len(),
        2,
        "both builds are cached by digest: {:?}",
        entries(cache.path())
    );

    // A host restart (a new engine on the same cache) serves the optimized build at once.
    let again = tiered(cache.path(), u64::MAX)
        .load(&bytes, &Limits::default())
        .expect("loads");
    assert_eq!(again.tier(), Tier::Optimized);
    assert_eq!(again.compiled(), Compiled::FromCache);
    reconciles(&again);
}

#[test]
fn the_compiled_cache_evicts_the_least_recently_used_entries_beyond_its_bound() {
    let cache = tempfile::tempdir().expect("tempdir");
    let untiered = |max_bytes| {
        Engine::new(&EngineConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            max_instances: 8,
            max_calls: 8,
            tiered: false,
            cache_max_bytes: max_bytes,
            ..EngineConfig::default()
        })
        .expect("engine")
    };
    let first = untiered(u64::MAX)
        .load(&modules::bytes(modules::MISBEHAVE), &Limits::default())
        .expect("loads");
    let one = entries(cache.path());
    assert_eq!(one.len(), 1);
    let size = untiered(u64::MAX).cache().expect("a cache").size_bytes();
    // Room for one entry only: the second load evicts the first, never itself.
    let engine = untiered(size + size / 2);
    let second = engine
        .load(
            &modules::bytes(modules::MISBEHAVE_FRAGILE),
            &Limits::default(),
        )
        .expect("loads");
    assert_eq!(second.compiled(), Compiled::Fresh);
    drop((first, second));
    let left = entries(cache.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(left, one, "the older entry went, the new one stayed");
}

#[test]
fn two_loads_of_one_module_at_once_compile_it_once() {
    let cache = tempfile::tempdir().expect("tempdir");
    let engine = Engine::new(&EngineConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        max_instances: 8,
        max_calls: 8,
        tiered: false,
        ..EngineConfig::default()
    })
    .expect("engine");
    let bytes = modules::bytes(modules::MISBEHAVE);
    let barrier = std::sync::Barrier::new(2);
    let compiled: Vec<Compiled> = std::thread::scope(|scope| {
        let loads: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    engine
                        .load(&bytes, &Limits::default())
                        .expect("loads")
                        .compiled()
                })
            })
            .collect();
        loads
            .into_iter()
            .map(|l| l.join().expect("no panic"))
            .collect()
    });
    let fresh = compiled.iter().filter(|c| **c == Compiled::Fresh).count();
    assert_eq!(
        fresh, 1,
        "{compiled:?}: the second load compiled beside the first"
    );
}
