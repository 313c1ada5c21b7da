//! `make bench-idle-host`: the memory of an idle `wasmop run` serving M WasmReconcilers (default
//! 20, `WASMOP_BENCH_MODULES`), each with its own module and no objects, on a fresh local control
//! plane. Last line: `idle host modules=<m> rss MiB: X.X peak MiB: Y.Y`.

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
    let wasmop = wasmop_bench_scale::wasmop_binary().await?;
    let dir = std::env::temp_dir().join(format!("wasmop-bench-idle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = idle::measure(
        &wasmop,
        std::path::Path::new(wasmop_test_modules::IMAGE_UPDATER),
        modules,
        &dir,
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
        "idle host modules={} rss MiB: {:.1} peak MiB: {:.1}",
        m.modules,
        mib(m.rss),
        mib(m.peak_rss)
    );
    Ok(())
}
