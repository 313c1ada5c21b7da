//! `make bench-idle-host`: the memory of an idle `wasmop run` serving M WasmReconcilers (default
//! 20, `WASMOP_BENCH_MODULES`), each with its own module and no objects, on a fresh local control
//! plane. Last line: `idle host modules=<m> rss MiB: X.X peak MiB: Y.Y`.
//!
//! `WASMOP_BENCH_HOST_ARGS` adds arguments to `wasmop run` (split on whitespace; to compare
//! flags), `WASMOP_BENCH_HOLD` (seconds) keeps the idle host running after the reading so that
//! its `/proc/<pid>/smaps` can be read; the host inherits the environment (`MALLOC_ARENA_MAX`).

use wasmop_bench_scale::idle;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let modules = match std::env::var("WASMOP_BENCH_MODULES") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|m| (1..=200).contains(m))
            .ok_or_else(|| {
                anyhow::anyhow!("WASMOP_BENCH_MODULES={v:?}: not a number from 1 to 200")
            })?,
        _ => 20,
    };
    let hold = match std::env::var("WASMOP_BENCH_HOLD") {
        Ok(v) if !v.trim().is_empty() => Some(std::time::Duration::from_secs(
            v.trim().parse::<u64>().map_err(|e| {
                anyhow::anyhow!("WASMOP_BENCH_HOLD={v:?}: not a number of seconds: {e}")
            })?,
        )),
        _ => None,
    };
    let options = idle::Options {
        host_args: std::env::var("WASMOP_BENCH_HOST_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        hold,
    };
    let wasmop = wasmop_bench_scale::wasmop_binary().await?;
    let dir = std::env::temp_dir().join(format!("wasmop-bench-idle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = idle::measure(
        &wasmop,
        std::path::Path::new(wasmop_test_modules::IMAGE_UPDATER),
        modules,
        &dir,
        &options,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let m = m?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "idle host: {} WasmReconcilers, each its own module (image-updater variants), no objects; every optimized build serving after {:.1} s",
        m.modules,
        m.load.as_secs_f64()
    );
    println!(
        "idle host: RssAnon {:.1} MiB, RssFile {:.1} MiB; wasmop run args {:?}",
        mib(m.rss_anon),
        mib(m.rss_file),
        options.host_args
    );
    println!(
        "idle host modules={} rss MiB: {:.1} peak MiB: {:.1}",
        m.modules,
        mib(m.rss),
        mib(m.peak_rss)
    );
    Ok(())
}
