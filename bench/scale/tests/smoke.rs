//! The N = 50 smoke run of `make bench-scale` (part of `make test`): every contender converges
//! 50 Apps on its own fresh control plane, and every measurement is obtained. No timing is
//! asserted; the figures are printed.

use std::time::Duration;

use wasmop_bench_scale::contenders::{Binaries, Contender, Tuning};
use wasmop_bench_scale::report;
use wasmop_bench_scale::run::{Measurement, measure};

const N: usize = 50;

async fn binaries() -> anyhow::Result<Binaries> {
    Ok(Binaries {
        wasmop: wasmop_bench_scale::wasmop_binary().await?,
        module: wasmop_test_modules::IMAGE_UPDATER.into(),
        kube_rs: env!("CARGO_BIN_EXE_scale-kube-rs").into(),
        controller_runtime: tokio::task::spawn_blocking(
            wasmop_bench_scale::contenders::gobuild::operator,
        )
        .await??,
        floor: env!("CARGO_BIN_EXE_scale-floor").into(),
    })
}

fn check(m: &Measurement) {
    let name = m.contender.name();
    assert!(m.converge > Duration::ZERO, "{name}: no convergence time");
    assert!(m.at_end.peak_rss > 0, "{name}: no peak RSS");
    assert!(
        m.at_end.cpu_seconds >= m.at_converge.cpu_seconds
            && m.at_converge.cpu_seconds >= m.at_start.cpu_seconds
            && m.at_end.cpu_seconds > 0.0,
        "{name}: CPU readings {:?} {:?} {:?}",
        m.at_start,
        m.at_converge,
        m.at_end
    );
    // Each App needs its Deployment and Service written and its status set.
    assert!(
        m.converge_writes >= (3 * N) as f64,
        "{name}: only {} controller writes counted during convergence: {:?}",
        m.converge_writes,
        m.converge_requests.controller_writes_by_kind()
    );
    assert!(
        !m.idle_requests.0.is_empty(),
        "{name}: no API request counted in the idle window"
    );
    assert!(m.idle_writes_per_min.is_finite(), "{name}: idle writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_contender_converges_50_apps_and_is_measured() -> anyhow::Result<()> {
    let binaries = binaries().await?;
    let resync = Duration::from_secs(5);
    let mut rows = Vec::new();
    for contender in Contender::ALL {
        let tuning = Tuning {
            concurrency: 16,
            resync,
        };
        // Two resync periods of idle.
        let m = measure(
            contender,
            N,
            tuning,
            &binaries,
            resync * 2,
            Duration::from_secs(300),
        )
        .await?;
        check(&m);
        rows.push(m);
    }
    println!("{}", report::table(N, &rows));
    let line = report::final_line(N, &rows);
    println!("{line}");
    assert!(!line.contains("n/a"), "a ratio is missing: {line}");
    Ok(())
}
