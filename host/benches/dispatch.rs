//! `make bench-dispatch`: the same reconcile logic (the image-updater example) called natively
//! and through Wasm with a fresh sandbox per call, side by side in one run, on a ~6 KB primary
//! with 8 observed children. Both start from the host's request (JSON text) and end with the
//! host's parsed response, so the difference is what the sandbox costs.
//!
//! Prints p50/p99 of both, instantiate time, compile time and load-from-cache time; then the
//! per-call cost of a Python module (the tenant example, built with the pinned componentize-py by
//! scripts/python-module.sh) on its fixtures, beside the Rust module's; the last line is
//! `dispatch wasm/native p50 ratio: X.XX`. `WASMOP_BENCH_CALLS` sets the calls each way (default
//! 3000; more to profile the loop).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::contract::{self as c, Context, Gvk, KindObjects, ReconcileRequest, Trigger};
use wasmop::engine::{Engine, EngineConfig, FastCompiler, Limits};
use wasmop_sdk::Reconciler;

/// Calls each way; `WASMOP_BENCH_CALLS` sets another count (more, to profile the loop).
fn iterations() -> usize {
    std::env::var("WASMOP_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(3000)
}
const WARMUP: usize = 200;

fn primary() -> String {
    // A realistic App: the last-applied annotation and labels bring it to ~6 KB.
    let filler: String = (0..300)
        .map(|i| format!("key-{i:03}=value-{i:03};"))
        .collect();
    let app = json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {
            "name": "web", "namespace": "demo", "uid": "5b2f6c1e-3d4a-4f7b-9a8e-1c2d3e4f5a6b",
            "generation": 7, "resourceVersion": "123456",
            "labels": {"team": "storefront", "tier": "frontend", "env": "prod"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": filler}
        },
        "spec": {"image": "nginx:1.28", "replicas": 3, "port": 8080, "track": "stable"},
        "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 6}
    });
    app.to_string()
}

fn deployment(i: usize) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": if i == 0 { "web".to_string() } else { format!("web-{i}") }, "namespace": "demo",
            "uid": format!("uid-{i}"), "generation": 4, "resourceVersion": "777",
            "labels": {"app.kubernetes.io/name": "web", "wasmop.dev/reconciler": "image-updater"}},
        "spec": {"replicas": 3,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "web", "example.wasmop.dev/track": "stable"}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": "web", "example.wasmop.dev/track": "stable"}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.28", "ports": [{"containerPort": 8080, "name": "http"}]}]}}},
        "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
            "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                           {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}
    })
    .to_string()
}

fn service(i: usize) -> String {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": if i == 0 { "web".to_string() } else { format!("web-{i}") }, "namespace": "demo", "uid": format!("s-{i}")},
        "spec": {"selector": {"app.kubernetes.io/name": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            "clusterIP": "10.96.0.10", "type": "ClusterIP"}
    })
    .to_string()
}

fn request() -> ReconcileRequest {
    ReconcileRequest {
        primary: primary(),
        owned: vec![
            KindObjects {
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: (0..4).map(deployment).collect(),
            },
            KindObjects {
                kind: Gvk::new("v1", "Service"),
                objects: (0..4).map(service).collect(),
            },
        ],
        related: vec![],
        context: Context {
            reconciler: "image-updater".into(),
            trigger: Trigger::PrimaryChanged,
            attempt: 1,
            config: "{}".into(),
            now_unix_ms: 0,
        },
    }
}

/// The native path: the same function the module exports, with the same conversions at both ends
/// (JSON text in; parsed children, status and events out).
fn native(request: ReconcileRequest) -> c::ReconcileResponse {
    let gvk = |k: &Gvk| wasmop_sdk::Gvk::new(k.api_version.clone(), k.kind.clone());
    let sdk_request = wasmop_sdk::Request::from_parts(
        request.primary,
        request
            .owned
            .into_iter()
            .map(|k| (gvk(&k.kind), k.objects))
            .collect(),
        request
            .related
            .into_iter()
            .map(|k| (gvk(&k.kind), k.objects))
            .collect(),
        wasmop_sdk::Context {
            reconciler: request.context.reconciler,
            trigger: wasmop_sdk::Trigger::PrimaryChanged,
            attempt: request.context.attempt,
            config: request.context.config,
            now_unix_ms: request.context.now_unix_ms,
        },
    );
    let response = image_updater::ImageUpdater::reconcile(&sdk_request).expect("native reconcile");
    c::ReconcileResponse {
        children: response
            .child_sets()
            .iter()
            .map(|(k, objects)| c::ChildSet {
                keep: Vec::new(),
                kind: Gvk::new(k.api_version.clone(), k.kind.clone()),
                objects: objects
                    .iter()
                    .map(|o| serde_json::from_str::<Value>(o).expect("json"))
                    .collect(),
            })
            .collect(),
        actions: Vec::new(),
        status: response.status_ref().map(|s| c::Status {
            fields: serde_json::from_str(&s.fields.to_string()).expect("json"),
            conditions: s
                .conditions
                .iter()
                .map(|x| c::Condition {
                    type_: x.type_.clone(),
                    status: match x.status {
                        wasmop_sdk::ConditionStatus::True => c::ConditionStatus::True,
                        wasmop_sdk::ConditionStatus::False => c::ConditionStatus::False,
                        wasmop_sdk::ConditionStatus::Unknown => c::ConditionStatus::Unknown,
                    },
                    reason: x.reason.clone(),
                    message: x.message.clone(),
                })
                .collect(),
        }),
        events: response
            .events()
            .iter()
            .map(|e| c::Event {
                type_: c::EventType::Normal,
                reason: e.reason.clone(),
                message: e.message.clone(),
                action: e.action.clone(),
                regarding: None,
            })
            .collect(),
        requeue_after: response.requeue(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    // As the `wasmop` binary does, so the sandbox costs here what it costs in the host.
    // SAFETY: first thing in `main`, before any thread starts.
    #[allow(unsafe_code)]
    unsafe {
        wasmop::engine::skip_error_backtraces();
    }
    let bytes = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let limits = Limits::default();
    let cache = std::env::temp_dir().join(format!("wasmop-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);

    // Compile (no cache), then load from the disk cache with a fresh engine, three times each.
    let mut compile = Vec::new();
    let mut from_cache = Vec::new();
    for _ in 0..3 {
        let _ = std::fs::remove_dir_all(&cache);
        let engine = Engine::new(&EngineConfig {
            cache_dir: Some(cache.clone()),
            tiered: false,
            ..EngineConfig::default()
        })
        .expect("engine");
        let t = Instant::now();
        engine.load(&bytes, &limits).expect("compile");
        compile.push(t.elapsed());
        let engine = Engine::new(&EngineConfig {
            cache_dir: Some(cache.clone()),
            tiered: false,
            ..EngineConfig::default()
        })
        .expect("engine");
        let t = Instant::now();
        let m = engine.load(&bytes, &limits).expect("from cache");
        from_cache.push(t.elapsed());
        assert_eq!(m.compiled(), wasmop::engine::Compiled::FromCache);
    }
    let _ = std::fs::remove_dir_all(&cache);
    compile.sort();
    from_cache.sort();
    let fast: Vec<Duration> = (0..3)
        .map(|_| fast_load(&bytes, &limits, FastCompiler::CraneliftNone))
        .collect();
    let mut winch: Vec<Duration> = (0..3)
        .map(|_| fast_load(&bytes, &limits, FastCompiler::Winch))
        .collect();
    winch.sort();

    let config = EngineConfig {
        memory_keep_resident: std::env::var("WASMOP_BENCH_KEEP_RESIDENT_KIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(EngineConfig::default().memory_keep_resident, |k| k << 10),
        tiered: false,
        ..EngineConfig::default()
    };
    let engine = Engine::new(&config).expect("engine");
    let module = engine.load(&bytes, &limits).expect("load");
    let request = request();
    let size = request.primary.len();
    let children: usize = request.owned.iter().map(|k| k.objects.len()).sum();

    // Same answer both ways.
    let wasm_answer = module
        .reconcile(request.clone(), &limits)
        .result
        .expect("wasm reconcile");
    let native_answer = native(request.clone());
    assert_eq!(
        wasm_answer.children, native_answer.children,
        "native and Wasm disagree"
    );
    assert_eq!(
        wasm_answer.status, native_answer.status,
        "native and Wasm disagree"
    );

    let (mut n, mut w, mut inst, mut call) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut peak = 0;
    let calls = iterations();
    for i in 0..WARMUP + calls {
        // Interleaved, so drift and noise hit both sides alike.
        let (r1, r2) = (request.clone(), request.clone());
        let t = Instant::now();
        std::hint::black_box(native(r1));
        let native_time = t.elapsed();
        let t = Instant::now();
        let out = module.reconcile(r2, &limits);
        let wasm_time = t.elapsed();
        std::hint::black_box(out.result.expect("wasm reconcile"));
        if i >= WARMUP {
            n.push(native_time);
            w.push(wasm_time);
            inst.push(out.stats.instantiate);
            call.push(out.stats.call);
            peak = peak.max(out.stats.memory_peak);
        }
    }
    n.sort();
    w.sort();
    inst.sort();
    call.sort();
    let (n50, w50) = (percentile(&n, 0.5), percentile(&w, 0.5));
    println!(
        "dispatch benchmark: image-updater reconcile, primary {size} bytes, {children} observed children, {calls} calls each, interleaved"
    );
    println!("module: {} bytes, sha256 {}", bytes.len(), module.sha256());
    println!("| path | p50 | p99 |");
    println!("| --- | --- | --- |");
    println!(
        "| native (same Rust code, in-process) | {} | {} |",
        us(n50),
        us(percentile(&n, 0.99))
    );
    println!(
        "| Wasm, fresh sandbox per call | {} | {} |",
        us(w50),
        us(percentile(&w, 0.99))
    );
    println!(
        "| of which: instantiate (Store + instance) | {} | {} |",
        us(percentile(&inst, 0.5)),
        us(percentile(&inst, 0.99))
    );
    println!(
        "| of which: the call (guest code and conversions) | {} | {} |",
        us(percentile(&call, 0.5)),
        us(percentile(&call, 0.99))
    );
    println!(
        "guest linear memory high-water mark: {} KiB (keep-resident {} KiB)",
        peak >> 10,
        config.memory_keep_resident >> 10
    );
    println!("compile with Cranelift (median of 3): {}", ms(compile[1]));
    let mut fast = fast;
    fast.sort();
    println!(
        "compile the fast tier, Cranelift without optimizations (median of 3): {}",
        ms(fast[1])
    );
    println!(
        "compile the fast tier, Winch (median of 3): {}",
        ms(winch[1])
    );
    println!(
        "load from the compiled-module cache (median of 3): {}",
        ms(from_cache[1])
    );
    python_rows(&engine, &limits, w50);
    println!(
        "dispatch wasm/native p50 ratio: {:.2}",
        w50.as_secs_f64() / n50.as_secs_f64()
    );
}

const PYTHON_CALLS: usize = 300;

/// How long a tiered engine with no cache takes to load `bytes`: the fast build (Cranelift
/// without optimizations) plus the metadata call. Then waits for the background optimized
/// build to be swapped in, so it does not compete with later measurements.
fn fast_load(bytes: &[u8], limits: &Limits, compiler: FastCompiler) -> Duration {
    let engine = Engine::new(&EngineConfig {
        tiered: true,
        max_background_compiles: 1,
        fast_compiler: compiler,
        ..EngineConfig::default()
    })
    .expect("engine");
    let t = Instant::now();
    let module = engine.load(bytes, limits).expect("fast load");
    let took = t.elapsed();
    assert_eq!(module.tier(), wasmop::engine::Tier::Fast);
    let waiting = Instant::now();
    while module.tier() != wasmop::engine::Tier::Optimized {
        assert!(
            waiting.elapsed() < Duration::from_secs(600),
            "the optimized build did not arrive in 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "  fast tier in {}, optimized build swapped in {} later",
        ms(took),
        ms(waiting.elapsed())
    );
    took
}

/// Builds (or finds up to date) the tenant example's component.
fn tenant_component() -> Vec<u8> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python/tenant.wasm");
    let status = std::process::Command::new("bash")
        .arg(root.join("scripts/python-module.sh"))
        .arg("build")
        .arg(root.join("examples/tenant"))
        .arg("tenant")
        .arg(&out)
        .status()
        .expect("runs bash");
    assert!(
        status.success(),
        "building the tenant component failed (see above)"
    );
    std::fs::read(&out).expect("the built tenant component")
}

fn yaml_objects(path: &str) -> Vec<Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tenant");
    let text = std::fs::read_to_string(root.join(path)).expect("a tenant fixture");
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).expect("fixture YAML")
}

/// The request `wasmop test` builds from the tenant example's fixtures.
fn tenant_request(module: &wasmop::engine::Module) -> ReconcileRequest {
    let observed: Vec<Value> = [
        "fixtures/observed/namespace.yaml",
        "fixtures/observed/quota.yaml",
    ]
    .iter()
    .flat_map(|p| yaml_objects(p))
    .collect();
    let owned = module
        .metadata()
        .owns
        .iter()
        .map(|kind| KindObjects {
            kind: kind.clone(),
            objects: observed
                .iter()
                .filter(|o| o["kind"] == kind.kind.as_str())
                .map(Value::to_string)
                .collect(),
        })
        .collect();
    ReconcileRequest {
        primary: yaml_objects("fixtures/cr.yaml").remove(0).to_string(),
        owned,
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

/// The Python module's per-call cost, fresh sandbox per call, beside the Rust module's p50.
fn python_rows(engine: &Engine, limits: &Limits, rust_p50: Duration) {
    let bytes = tenant_component();
    let limits = Limits {
        memory_bytes: 128 << 20,
        ..*limits
    };
    let fast = fast_load(&bytes, &limits, FastCompiler::CraneliftNone);
    let winch = fast_load(&bytes, &limits, FastCompiler::Winch);
    let t = Instant::now();
    let module = engine
        .load(&bytes, &limits)
        .expect("load the tenant component");
    let compile = t.elapsed();
    let request = tenant_request(&module);
    let (mut w, mut inst, mut call) = (Vec::new(), Vec::new(), Vec::new());
    let mut peak = 0;
    for i in 0..PYTHON_CALLS + 20 {
        let t = Instant::now();
        let out = module.reconcile(request.clone(), &limits);
        let took = t.elapsed();
        let response = out.result.expect("python reconcile");
        assert_eq!(response.children.len(), 5, "the tenant's five child kinds");
        if i >= 20 {
            w.push(took);
            inst.push(out.stats.instantiate);
            call.push(out.stats.call);
            peak = peak.max(out.stats.memory_peak);
        }
    }
    w.sort();
    inst.sort();
    call.sort();
    let needs = module.needs();
    println!(
        "python module: tenant reconcile on its fixtures, {} bytes, {} core instances, {PYTHON_CALLS} calls",
        bytes.len(),
        needs.core_instances
    );
    println!("| module | p50 | p99 |");
    println!("| --- | --- | --- |");
    println!(
        "| Rust (image-updater), fresh sandbox per call | {} | - |",
        us(rust_p50)
    );
    println!(
        "| Python (tenant), fresh sandbox per call | {} | {} |",
        us(percentile(&w, 0.5)),
        us(percentile(&w, 0.99))
    );
    println!(
        "| of which: instantiate (Store + instance) | {} | {} |",
        us(percentile(&inst, 0.5)),
        us(percentile(&inst, 0.99))
    );
    println!(
        "| of which: the call (CPython and conversions) | {} | {} |",
        us(percentile(&call, 0.5)),
        us(percentile(&call, 0.99))
    );
    println!(
        "python linear memory high-water mark: {} KiB; compile optimized: {}; fast tier: Cranelift without optimizations {}, Winch {}",
        peak >> 10,
        ms(compile),
        ms(fast),
        ms(winch)
    );
    println!(
        "dispatch python/rust p50 ratio: {:.1}",
        percentile(&w, 0.5).as_secs_f64() / rust_p50.as_secs_f64()
    );
}
