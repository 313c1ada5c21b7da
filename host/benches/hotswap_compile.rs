//! `make bench-hotswap-compile`: which compiler should build the fast tier of a NEW build of a
//! module, the build a hot swap waits for? Two different builds of each example are compiled, as
//! consecutive pushes would be:
//!
//! - Rust: image-updater v1, then v2 (a code change; 1 MB each);
//! - Python: the tenant example, then its second build (the same Python code but one default:
//!   what changes between two componentize-py builds is the pre-initialized memory snapshot; every
//!   core module's code section is byte-identical, CPython included).
//!
//! Candidates, each on a fresh wasmtime engine configured like the engine's fast tier:
//!
//! - `winch, trampolines optimized`: Winch as the engine had it before (Cranelift, which
//!   compiles the trampolines next to Winch, at its default opt level);
//! - `winch, trampolines unoptimized`: what the engine's fast tier now is;
//! - `cranelift none + incremental cache` and `cranelift speed + incremental cache`: Cranelift's
//!   per-function compilation cache (wasmtime feature `incremental-cache`), warmed by the first
//!   build; the second build's compile is the figure that counts, with its cache hits.
//!
//! This bench talks to wasmtime directly (the engine does not use the incremental cache: it
//! lost). Rounds are interleaved and medians printed, since the machine's load moves;
//! `WASMOP_BENCH_ROUNDS` (default 3). The last line is
//! `hotswap compile python second build winch ms: N`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use wasmtime::component::Component;

#[path = "common/tenant.rs"]
mod tenant;
use tenant::tenant_builds;

/// An in-memory incremental cache that counts its hits and misses.
#[derive(Debug, Default)]
struct MemoryCache {
    entries: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

impl wasmtime::CacheStore for MemoryCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let found = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_vec(), value);
        true
    }
}

impl MemoryCache {
    fn counts(&self) -> (usize, usize) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    fn bytes(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    WinchOptimizedTrampolines,
    WinchUnoptimizedTrampolines,
    CraneliftNoneCached,
    CraneliftSpeedCached,
}

impl Candidate {
    const ALL: [Candidate; 4] = [
        Candidate::WinchOptimizedTrampolines,
        Candidate::WinchUnoptimizedTrampolines,
        Candidate::CraneliftNoneCached,
        Candidate::CraneliftSpeedCached,
    ];

    fn name(self) -> &'static str {
        match self {
            Candidate::WinchOptimizedTrampolines => "winch, trampolines optimized (before)",
            Candidate::WinchUnoptimizedTrampolines => "winch, trampolines unoptimized (now)",
            Candidate::CraneliftNoneCached => "cranelift none + incremental cache",
            Candidate::CraneliftSpeedCached => "cranelift speed + incremental cache",
        }
    }

    /// The fast tier's settings (engine/src/lib.rs) with this candidate's compiler.
    fn engine(self, cache: Option<Arc<MemoryCache>>) -> wasmtime::Engine {
        let mut config = wasmtime::Config::new();
        match self {
            Candidate::WinchOptimizedTrampolines => {
                config.strategy(wasmtime::Strategy::Winch);
            }
            Candidate::WinchUnoptimizedTrampolines => {
                config
                    .strategy(wasmtime::Strategy::Winch)
                    .cranelift_opt_level(wasmtime::OptLevel::None);
            }
            Candidate::CraneliftNoneCached => {
                config.cranelift_opt_level(wasmtime::OptLevel::None);
            }
            Candidate::CraneliftSpeedCached => {
                config.cranelift_opt_level(wasmtime::OptLevel::Speed);
            }
        }
        config
            .epoch_interruption(true)
            .memory_init_cow(true)
            .wasm_backtrace_max_frames(None)
            .parallel_compilation(true);
        if let Some(cache) = cache {
            config
                .enable_incremental_compilation(cache)
                .expect("the incremental cache on a Cranelift config");
        }
        wasmtime::Engine::new(&config).expect("a wasmtime engine")
    }
}

/// One candidate on two builds: (first build, second build, second build's hits and misses).
struct Run {
    first: Duration,
    second: Duration,
    hits: usize,
    misses: usize,
    cache_bytes: usize,
}

fn compile(engine: &wasmtime::Engine, bytes: &[u8]) -> Duration {
    let started = Instant::now();
    let component = Component::new(engine, bytes).expect("the module compiles");
    let took = started.elapsed();
    drop(component);
    took
}

fn run(candidate: Candidate, first: &[u8], second: &[u8]) -> Run {
    let cache = match candidate {
        Candidate::CraneliftNoneCached | Candidate::CraneliftSpeedCached => {
            Some(Arc::new(MemoryCache::default()))
        }
        _ => None,
    };
    let engine = candidate.engine(cache.clone());
    let first = compile(&engine, first);
    let before = cache.as_ref().map(|c| c.counts()).unwrap_or_default();
    let second = compile(&engine, second);
    let after = cache.as_ref().map(|c| c.counts()).unwrap_or_default();
    Run {
        first,
        second,
        hits: after.0 - before.0,
        misses: after.1 - before.1,
        cache_bytes: cache.map(|c| c.bytes()).unwrap_or_default(),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Prints one table; returns the second build's median per candidate.
fn bench(label: &str, first: &[u8], second: &[u8], rounds: usize) -> Vec<(Candidate, Duration)> {
    let mut runs: Vec<(Candidate, Vec<Run>)> =
        Candidate::ALL.iter().map(|c| (*c, Vec::new())).collect();
    for round in 0..rounds {
        for (candidate, results) in &mut runs {
            let r = run(*candidate, first, second);
            eprintln!(
                "  {label} round {}: {}: first {}, second {}",
                round + 1,
                candidate.name(),
                ms(r.first),
                ms(r.second)
            );
            results.push(r);
        }
    }
    println!(
        "\n{label}: first build {} KiB, second build {} KiB, {rounds} rounds (medians)",
        first.len() >> 10,
        second.len() >> 10
    );
    println!(
        "| fast-tier candidate | first build | second build | second build's cache hits / misses |"
    );
    println!("| --- | --- | --- | --- |");
    let mut seconds = Vec::new();
    for (candidate, results) in runs {
        let cached = results
            .iter()
            .map(|r| (r.hits, r.misses, r.cache_bytes))
            .next_back();
        let first_ms = median(results.iter().map(|r| r.first).collect());
        let second_ms = median(results.iter().map(|r| r.second).collect());
        let cache = match cached {
            Some((hits, misses, bytes)) if hits + misses > 0 => {
                format!("{hits} / {misses} ({} MiB cached)", bytes >> 20)
            }
            _ => "-".to_string(),
        };
        println!(
            "| {} | {} | {} | {cache} |",
            candidate.name(),
            ms(first_ms),
            ms(second_ms)
        );
        seconds.push((candidate, second_ms));
    }
    seconds
}

fn main() {
    let rounds = std::env::var("WASMOP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(3);
    let rust = bench(
        "rust (image-updater v1 -> v2)",
        &wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER),
        &wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2),
        rounds,
    );
    let (first, second) = tenant_builds();
    let python = bench(
        "python (tenant first -> second build)",
        &first,
        &second,
        rounds,
    );
    let now = |seconds: &[(Candidate, Duration)]| {
        seconds
            .iter()
            .find(|(c, _)| *c == Candidate::WinchUnoptimizedTrampolines)
            .map(|(_, d)| d.as_millis())
            .unwrap_or_default()
    };
    println!();
    println!("hotswap compile rust second build winch ms: {}", now(&rust));
    println!(
        "hotswap compile python second build winch ms: {}",
        now(&python)
    );
}
