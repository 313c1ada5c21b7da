//! `make bench-scale`: N image-updater Apps on a fresh local control plane per contender
//! (wasmop, native kube-rs, controller-runtime, the write floor, wasmop sharded over 1, 2
//! and 3 replicas, and wasmop serving the logic as a Metacontroller hook); one table per N (and
//! one per replica for the sharded rows), then one line per N: `scale N=<n> wasmop/floor: X.XX
//! wasmop/kube-rs: Y.YY wasmop/controller-runtime: Z.ZZ` (and ` wasmop-metacontroller/wasmop:
//! R.RR` when that row ran) and one per sharded row: `scale-sharded N=<n> replicas=<k>
//! converge s: X rss MiB per replica: a,b,c`. Before those lines, `charts N=<n>: <converged.svg> <memory.svg>`: the SVG
//! charts of converged Apps and of memory over time, in `<target>/bench` (or
//! `WASMOP_BENCH_CHARTS`), redrawn after each row (a run stopped early keeps what it finished).
//! Settings: see `wasmop_bench_scale::settings` (`WASMOP_BENCH_N`, `WASMOP_BENCH_CONTENDERS`, ...).

use wasmop_bench_scale::contenders::{Binaries, Contender, Tuning};
use wasmop_bench_scale::run::measure;
use wasmop_bench_scale::settings::Settings;
use wasmop_bench_scale::{chart, report};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env("1000,10000")?;
    let binaries = Binaries {
        wasmop: wasmop_bench_scale::wasmop_binary().await?,
        module: wasmop_test_modules::IMAGE_UPDATER.into(),
        kube_rs: env!("CARGO_BIN_EXE_scale-kube-rs").into(),
        controller_runtime: if settings.contenders.contains(&Contender::ControllerRuntime) {
            tokio::task::spawn_blocking(wasmop_bench_scale::contenders::gobuild::operator).await??
        } else {
            Default::default()
        },
        floor: env!("CARGO_BIN_EXE_scale-floor").into(),
        hook: if settings
            .contenders
            .contains(&Contender::WasmopMetacontroller)
        {
            wasmop_bench_scale::contenders::metacontroller::build_hook(std::path::Path::new(env!(
                "CARGO_TARGET_TMPDIR"
            )))
            .await?
        } else {
            Default::default()
        },
    };
    println!(
        "bench-scale: N={:?}, contenders {:?}, resync {:?}, idle window {:?}, concurrency {}, floor concurrency {:?}, sharded replicas {:?} over {} namespaces",
        settings.sizes,
        settings
            .contenders
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>(),
        settings.resync,
        settings.idle,
        settings.concurrency,
        settings.floor_concurrency,
        settings.replicas,
        settings.namespaces
    );
    // `<target>/tmp` is cargo's CARGO_TARGET_TMPDIR for benches; its parent is the target dir.
    let charts = settings.charts.clone().unwrap_or_else(|| {
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        tmp.parent().unwrap_or(tmp).join("bench")
    });
    let mut lines = Vec::new();
    let mut chart_error = None;
    for &n in &settings.sizes {
        let mut rows = Vec::new();
        for &contender in &settings.contenders {
            let single = |concurrency| Tuning::single(concurrency, settings.resync);
            let tried: Vec<Tuning> = match contender {
                Contender::Floor => settings
                    .floor_concurrency
                    .iter()
                    .map(|c| single(*c))
                    .collect(),
                Contender::WasmopSharded => settings
                    .replicas
                    .iter()
                    .map(|&replicas| Tuning {
                        replicas,
                        layout: contender.layout(settings.namespaces),
                        ..single(settings.concurrency)
                    })
                    .collect(),
                _ => vec![single(settings.concurrency)],
            };
            for tuning in tried {
                let m = measure(
                    contender,
                    n,
                    tuning,
                    &binaries,
                    settings.idle,
                    settings.timeout(n),
                )
                .await?;
                eprintln!("{}", report::table(n, std::slice::from_ref(&m)));
                eprint!("{}", report::sharded_table(n, std::slice::from_ref(&m)));
                rows.push(m);
                // The charts of the rows so far, redrawn after each: a run stopped early
                // keeps the charts of what it finished.
                if let Err(e) = chart::write(&charts, n, &rows) {
                    eprintln!("[bench] charts N={n} so far: {e}");
                }
            }
        }
        println!("{}", report::table(n, &rows));
        print!("{}", report::sharded_table(n, &rows));
        // A chart that cannot be drawn fails the run, after the tables and the last lines.
        match chart::write(&charts, n, &rows) {
            Ok(paths) => println!(
                "\ncharts N={n}: {}",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Err(e) => {
                eprintln!("[bench] charts N={n}: {e}");
                chart_error.get_or_insert(e);
            }
        }
        lines.push(report::final_line(n, &rows));
        lines.extend(report::sharded_lines(n, &rows));
    }
    for line in lines {
        println!("{line}");
    }
    match chart_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
