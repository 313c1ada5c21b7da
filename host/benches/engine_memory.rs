//! `make bench-engine-memory`: what the sandbox engine alone holds once M modules are loaded and
//! idle, without a control plane: the engine configured as `wasmop run` configures it (tiered
//! compilation, the host's pool size), M variants of the image-updater example (each its own
//! digest, so each is compiled and held on its own), loaded one after the other, then waited on
//! until every optimized build serves. Prints VmRSS, RssAnon and RssFile after the engine is
//! built, after the loads, and once every optimized build serves (and again after the modules are
//! dropped), so that the engine's share of an idle host's memory can be told from the rest.
//!
//! `WASMOP_BENCH_MODULES` (default 20), `WASMOP_BENCH_TIERED` (`on`/`off`, default on),
//! `WASMOP_BENCH_MAX_INSTANCES` (default 256, as `--max-module-calls`), `WASMOP_BENCH_HOLD`
//! (seconds to stay alive at the end, to read `/proc/<pid>/smaps`), `WASMOP_BENCH_CACHE_DIR`
//! (the compiled cache to use and keep; default a temporary one: a second run on the same
//! directory loads every module from the cache, as a restarted host does),
//! `WASMOP_BENCH_CALLS` (default 0: after the idle figure, call `reconcile` on every module
//! round-robin this many rounds, one call at a time, and print the per-call instantiate time
//! and the memory after: what keeping warm sandbox slots for fewer modules than are called
//! costs), `WASMOP_BENCH_WARM_SLOTS` (default the engine's, `EngineConfig::warm_slots`). The host inherits the environment, so `MALLOC_ARENA_MAX` applies. Last line:
//! `engine memory modules=<m> rss MiB: X.X anon MiB: Y.Y`.

use std::time::{Duration, Instant};

use wasmop::contract::{Context, ReconcileRequest, Trigger};
use wasmop::engine::{Compiled, Engine, EngineConfig, Limits, Module, Tier};

/// (VmRSS, RssAnon, RssFile) in MiB.
fn rss() -> (f64, f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
            / 1024.0
    };
    (kib("VmRSS:"), kib("RssAnon:"), kib("RssFile:"))
}

fn report(step: &str) -> (f64, f64, f64) {
    let (all, anon, file) = rss();
    println!("engine memory {step}: rss {all:.1} MiB (anon {anon:.1}, file {file:.1})");
    (all, anon, file)
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number")),
        _ => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let modules: usize = env_number("WASMOP_BENCH_MODULES", 20)?;
    let max_instances: u32 = env_number("WASMOP_BENCH_MAX_INSTANCES", 256)?;
    let hold: u64 = env_number("WASMOP_BENCH_HOLD", 0)?;
    let tiered = match std::env::var("WASMOP_BENCH_TIERED").as_deref() {
        Ok("off") => false,
        Ok("on") | Err(_) => true,
        Ok(other) => anyhow::bail!("WASMOP_BENCH_TIERED={other:?}: on or off"),
    };
    let calls: usize = env_number("WASMOP_BENCH_CALLS", 0)?;
    let warm_slots: u32 = env_number(
        "WASMOP_BENCH_WARM_SLOTS",
        EngineConfig::default().warm_slots,
    )?;
    let tmp = tempfile::tempdir()?;
    let cache_dir = match std::env::var("WASMOP_BENCH_CACHE_DIR") {
        Ok(dir) if !dir.trim().is_empty() => std::path::PathBuf::from(dir),
        _ => tmp.path().join("compiled"),
    };
    report("at start");
    let engine = Engine::new(&EngineConfig {
        cache_dir: Some(cache_dir),
        max_instances,
        max_calls: max_instances,
        warm_slots,
        tiered,
        ..EngineConfig::default()
    })?;
    report("engine built");
    let component = std::fs::read(wasmop_test_modules::IMAGE_UPDATER)?;
    let limits = Limits::default();
    let started = Instant::now();
    let mut loaded = Vec::with_capacity(modules);
    for i in 0..modules {
        loaded.push(engine.load(&wasmop_test_modules::variant(&component, i), &limits)?);
    }
    let cached = loaded
        .iter()
        .filter(|m| m.compiled() == Compiled::FromCache)
        .count();
    report(&format!(
        "{modules} modules loaded ({cached} from the compiled cache)"
    ));
    while loaded.iter().any(|m| m.tier() != Tier::Optimized) {
        if started.elapsed() > Duration::from_secs(1800) {
            anyhow::bail!("the optimized builds did not all serve within 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The last swap's compile thread may still be unwinding.
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "engine memory: every optimized build serves after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (all, anon, _) = report("idle");
    if calls > 0 {
        call_round_robin(&loaded, calls, &limits)?;
    }
    if hold > 0 {
        println!(
            "engine memory: pid {} held for {hold} s (WASMOP_BENCH_HOLD)",
            std::process::id()
        );
        std::thread::sleep(Duration::from_secs(hold));
    }
    drop(loaded);
    report("modules dropped");
    println!("engine memory modules={modules} rss MiB: {all:.1} anon MiB: {anon:.1}");
    Ok(())
}

/// Calls `reconcile` on every module in turn, `rounds` times, and prints the instantiate times.
fn call_round_robin(modules: &[Module], rounds: usize, limits: &Limits) -> anyhow::Result<()> {
    let mut instantiate = Vec::with_capacity(modules.len() * rounds);
    for _ in 0..rounds {
        for module in modules {
            let out = module.reconcile(request(), limits);
            out.result
                .map_err(|e| anyhow::anyhow!("reconcile of {}: {e}", module.sha256()))?;
            instantiate.push(out.stats.instantiate);
        }
    }
    instantiate.sort();
    let at = |q: f64| instantiate[((instantiate.len() - 1) as f64 * q) as usize];
    println!(
        "engine memory: {} calls round-robin over {} modules, instantiate p50 {:?} p90 {:?}",
        instantiate.len(),
        modules.len(),
        at(0.5),
        at(0.9)
    );
    report("after the calls");
    Ok(())
}

/// A small App with no children: the image-updater creates its Deployment and Service.
fn request() -> ReconcileRequest {
    ReconcileRequest {
        primary: serde_json::json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App",
            "metadata": {"name": "web", "namespace": "demo", "uid": "0f1e2d3c", "generation": 1},
            "spec": {"image": "nginx:1.28", "replicas": 1, "port": 8080}
        })
        .to_string(),
        owned: vec![],
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
