//! `make bench-compile-settings`: what a compile setting of the engine costs or saves, per
//! compile: time, the compiling process's peak memory and the artifact's size, with the setting
//! as the engine had it before (`before`) and as it has it now (`now`).
//!
//! Setting measured: wasmtime's `native_unwind_info` on the fast tier (the `.eh_frame` that only
//! outside unwinders read; the optimized build, which replaces the fast one, keeps it). The
//! setting before it, `generate_address_map` (off on both tiers), is in
//! docs/benchmarks-history.md. Compiles:
//!
//! - Rust (image-updater, 1 MB), fast tier (Winch, trampolines unoptimized, parallel);
//! - Python (tenant, 18 MB), fast tier.
//!
//! Each compile runs in a child process (this binary again, `--one`), so its peak (`VmHWM`) is
//! its own. Rounds are interleaved and medians printed, since the machine's load moves;
//! `WASMOP_BENCH_ROUNDS` (default 3). The last line is
//! `compile settings python winch ms before: N now: M`.
//!
//! A second table answers what the Python build's function table costs its fast compile (the
//! `now` setting): the build as it is, then compile-only variants whose libpython no longer
//! fills the table at start-up (its functions still escape) and no longer lists any function
//! in it (see `common/elements.rs`). Its line is
//! `compile python table winch ms built: A declared: B removed: C`.

use std::time::Instant;

#[path = "common/elements.rs"]
mod elements;
#[path = "common/tenant.rs"]
mod tenant;

/// What one child reports.
#[derive(Debug, Clone, Copy)]
struct Measured {
    ms: u64,
    peak_kib: u64,
    artifact_kib: u64,
}

/// The engine's fast tier configuration (engine/src/lib.rs), with native unwind info on
/// (`before`) or off (`now`).
fn config(now: bool) -> wasmtime::Config {
    let mut c = wasmtime::Config::new();
    c.strategy(wasmtime::Strategy::Winch)
        .cranelift_opt_level(wasmtime::OptLevel::None)
        .epoch_interruption(true)
        .memory_init_cow(true)
        .wasm_backtrace_max_frames(None)
        .generate_address_map(false)
        .native_unwind_info(!now)
        .parallel_compilation(true)
        .allocation_strategy(wasmtime::InstanceAllocationStrategy::OnDemand);
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
fn one(path: &str, setting: &str) {
    let bytes = std::fs::read(path).expect("the module");
    let engine = wasmtime::Engine::new(&config(setting == "now")).expect("engine");
    let started = Instant::now();
    let artifact = engine.precompile_component(&bytes).expect("compiles");
    let ms = started.elapsed().as_millis();
    println!("{ms} {} {}", peak_kib(), artifact.len() >> 10);
}

/// Runs the child for `path` and parses its line.
fn measure(path: &std::path::Path, setting: &str) -> Measured {
    let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(["--one", &path.display().to_string(), setting])
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

/// The medians of `runs`, formatted as the tables' last three cells (time, peak, artifact), and
/// the median time.
fn cells(runs: &[Measured]) -> (String, u64) {
    let pick = |f: fn(&Measured) -> u64| median(runs.iter().map(f).collect());
    let ms = pick(|m| m.ms);
    let text = format!(
        "{ms} ms | {:.1} MiB | {} KiB",
        pick(|m| m.peak_kib) as f64 / 1024.0,
        pick(|m| m.artifact_kib)
    );
    (text, ms)
}

/// Prints one row per setting for `label`; returns the medians of time (before, now).
fn row(label: &str, path: &std::path::Path, rounds: usize) -> (u64, u64) {
    let mut runs: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, setting) in ["before", "now"].iter().enumerate() {
            let m = measure(path, setting);
            eprintln!("  {label} round {}: {setting}: {m:?}", round + 1);
            runs[i].push(m);
        }
    }
    let mut ms = [0; 2];
    for (i, name) in ["before (unwind info on)", "now (unwind info off)"]
        .iter()
        .enumerate()
    {
        let (text, median_ms) = cells(&runs[i]);
        ms[i] = median_ms;
        println!("| {label} | {name} | {text} |");
    }
    (ms[0], ms[1])
}

/// The second table: the Python build and its two compile-only variants, `now` setting, rounds
/// interleaved; returns the medians of time in that order.
fn table_rows(dir: &std::path::Path, python: &[u8], rounds: usize) -> [u64; 3] {
    let variants = [
        ("as built", python.to_vec()),
        (
            "table entries declared, not set",
            elements::rewrite(python, elements::Variant::Declared),
        ),
        (
            "table entries removed",
            elements::rewrite(python, elements::Variant::Removed),
        ),
    ];
    let paths: Vec<_> = variants
        .iter()
        .enumerate()
        .map(|(i, (_, bytes))| {
            let path = dir.join(format!("tenant-variant-{i}.wasm"));
            std::fs::write(&path, bytes).expect("write a variant");
            path
        })
        .collect();
    let mut runs: [Vec<Measured>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, path) in paths.iter().enumerate() {
            let m = measure(path, "now");
            eprintln!(
                "  python table round {}: {}: {m:?}",
                round + 1,
                variants[i].0
            );
            runs[i].push(m);
        }
    }
    println!("| python, winch (now) | time | peak | artifact |");
    println!("| --- | --- | --- | --- |");
    let mut ms = [0; 3];
    for (i, (label, _)) in variants.iter().enumerate() {
        let (text, median_ms) = cells(&runs[i]);
        ms[i] = median_ms;
        println!("| {label} | {text} |");
    }
    ms
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        one(&args[i + 1], &args[i + 2]);
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
    row("rust, winch", &rust, rounds);
    let (before, now) = row("python, winch", &python, rounds);
    println!();
    let [built, declared, removed] = table_rows(
        dir.path(),
        &std::fs::read(&python).expect("the Python module"),
        rounds,
    );
    println!();
    println!(
        "compile python table winch ms built: {built} declared: {declared} removed: {removed}"
    );
    println!("compile settings python winch ms before: {before} now: {now}");
}
