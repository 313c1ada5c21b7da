//! `make bench-compile-settings`: what a compile setting of the engine costs or saves, per
//! compile: time, the compiling process's peak memory and the artifact's size, with the setting
//! as the engine had it before (`before`) and as it has it now (`now`).
//!
//! Setting measured: wasmtime's `generate_address_map` (the map from native code to Wasm
//! offsets, which only Wasm backtraces read; the engine captures none). Compiles:
//!
//! - Rust (image-updater, 1 MB), optimized (Cranelift, speed, one thread: the background tier);
//! - Rust, fast tier (Winch, trampolines unoptimized, parallel);
//! - Python (tenant, 18 MB), fast tier.
//!
//! Each compile runs in a child process (this binary again, `--one`), so its peak (`VmHWM`) is
//! its own. Rounds are interleaved and medians printed, since the machine's load moves;
//! `WASMOP_BENCH_ROUNDS` (default 3). The last line is
//! `compile settings python winch ms before: N now: M`.

use std::time::Instant;

#[path = "common/tenant.rs"]
mod tenant;

/// A compile to measure.
#[derive(Debug, Clone, Copy)]
enum Tier {
    Optimized,
    Winch,
}

/// What one child reports.
#[derive(Debug, Clone, Copy)]
struct Measured {
    ms: u64,
    peak_kib: u64,
    artifact_kib: u64,
}

/// The engine's configuration for `tier` (engine/src/lib.rs), with the address map on or off.
fn config(tier: Tier, address_map: bool) -> wasmtime::Config {
    let mut c = wasmtime::Config::new();
    c.epoch_interruption(true)
        .memory_init_cow(true)
        .wasm_backtrace_max_frames(None)
        .generate_address_map(address_map)
        .allocation_strategy(wasmtime::InstanceAllocationStrategy::OnDemand);
    match tier {
        Tier::Optimized => c
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .parallel_compilation(false),
        Tier::Winch => c
            .strategy(wasmtime::Strategy::Winch)
            .cranelift_opt_level(wasmtime::OptLevel::None)
            .parallel_compilation(true),
    };
    c
}

/// `VmHWM` of this process, in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// The child: compiles `path` once and prints `ms peak_kib artifact_kib`.
fn one(path: &str, tier: &str, address_map: &str) {
    let tier = if tier == "optimized" {
        Tier::Optimized
    } else {
        Tier::Winch
    };
    let bytes = std::fs::read(path).expect("the module");
    let engine = wasmtime::Engine::new(&config(tier, address_map == "on")).expect("engine");
    let started = Instant::now();
    let artifact = engine.precompile_component(&bytes).expect("compiles");
    let ms = started.elapsed().as_millis();
    println!("{ms} {} {}", peak_kib(), artifact.len() >> 10);
}

/// Runs the child for `path` and parses its line.
fn measure(path: &std::path::Path, tier: &str, address_map: &str) -> Measured {
    let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(["--one", &path.display().to_string(), tier, address_map])
        .output()
        .expect("runs the child");
    assert!(
        out.status.success(),
        "the child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    assert_eq!(v.len(), 3, "the child printed {line:?}");
    Measured {
        ms: v[0],
        peak_kib: v[1],
        artifact_kib: v[2],
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Prints one row per setting for `label`; returns the medians of time (before, now).
fn row(label: &str, path: &std::path::Path, tier: &str, rounds: usize) -> (u64, u64) {
    let mut runs: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, map) in ["on", "off"].iter().enumerate() {
            let m = measure(path, tier, map);
            eprintln!("  {label} round {}: address map {map}: {m:?}", round + 1);
            runs[i].push(m);
        }
    }
    let mut ms = [0; 2];
    for (i, name) in ["before (address map on)", "now (address map off)"]
        .iter()
        .enumerate()
    {
        let pick = |f: fn(&Measured) -> u64| median(runs[i].iter().map(f).collect());
        ms[i] = pick(|m| m.ms);
        println!(
            "| {label} | {name} | {} ms | {:.1} MiB | {} KiB |",
            ms[i],
            pick(|m| m.peak_kib) as f64 / 1024.0,
            pick(|m| m.artifact_kib)
        );
    }
    (ms[0], ms[1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        one(&args[i + 1], &args[i + 2], &args[i + 3]);
        return;
    }
    let rounds = std::env::var("WASMOP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(3);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rust = dir.path().join("image-updater.wasm");
    std::fs::write(
        &rust,
        wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER),
    )
    .expect("write the Rust module");
    let python = dir.path().join("tenant.wasm");
    std::fs::write(&python, tenant::tenant_builds().0).expect("write the Python module");
    println!(
        "compile settings, {rounds} rounds (medians of time, peak RSS of the compiling process, artifact)"
    );
    println!("| compile | setting | time | peak | artifact |");
    println!("| --- | --- | --- | --- | --- |");
    row("rust, optimized", &rust, "optimized", rounds);
    row("rust, winch", &rust, "winch", rounds);
    let (before, now) = row("python, winch", &python, "winch", rounds);
    println!();
    println!("compile settings python winch ms before: {before} now: {now}");
}
