//! The N = 50 smoke run of `make bench-scale` (part of `make test`): every contender converges
//! 50 Apps on its own fresh control plane, and every measurement is obtained; the sharded row
//! runs 2 replicas (Apps in 50 namespaces, `ShardedListAndWatch` on), each measured, and their
//! slices partition the Apps; the Metacontroller row builds its JavaScript hook (node and the
//! pinned JavaScript tools, as the e2e tests of Metacontroller mode). No timing is asserted; the figures are printed. The contenders
//! run [`AT_ONCE`] at a time.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use wasmop_bench_scale::contenders::{Binaries, Contender, Tuning};
use wasmop_bench_scale::report;
use wasmop_bench_scale::run::{Measurement, measure};

const N: usize = 50;
/// Replicas of the sharded row.
const REPLICAS: usize = 2;

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
        hook: wasmop_bench_scale::contenders::metacontroller::build_hook(std::path::Path::new(
            env!("CARGO_TARGET_TMPDIR"),
        ))
        .await?,
    })
}

fn check(m: &Measurement) {
    let name = m.contender.name();
    assert!(
        m.finished(),
        "{name}: only {} of {N} Apps converged in {:?}",
        m.converged,
        m.converge
    );
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
    assert_eq!(
        m.processes.len(),
        m.tuning.replicas,
        "{name}: one set of figures per process"
    );
    assert!(
        m.processes.iter().all(|p| p.at_end.peak_rss > 0),
        "{name}: {:?}",
        m.processes
    );
}

/// The sharded replicas' slices (the primaries each caches, from its own metrics) sum to the
/// Apps: every App in exactly one replica's slice.
fn check_sharded(m: &Measurement) {
    let primaries: Vec<Option<f64>> = m
        .processes
        .iter()
        .map(|p| p.report.as_ref().and_then(|r| r.primaries))
        .collect();
    assert_eq!(
        primaries.iter().flatten().sum::<f64>(),
        N as f64,
        "the replicas' slices {primaries:?} partition the {N} Apps"
    );
    assert!(
        m.processes.iter().all(|p| p
            .report
            .as_ref()
            .is_some_and(|r| r.members == Some(REPLICAS as f64))),
        "every replica sees {REPLICAS} members: {:?}",
        m.processes
    );
}

/// How many contenders run at once, each on its own control plane. The smoke run asserts no
/// timing, so they need not run alone as `make bench-scale`'s do; most of a contender's time is
/// waiting (its control plane starting, the settle and the idle windows), which overlaps.
const AT_ONCE: usize = 2;

/// Measures `contender` at N Apps and checks every figure was obtained.
async fn measured(contender: Contender, binaries: &Binaries) -> anyhow::Result<Measurement> {
    let resync = Duration::from_secs(5);
    let tuning = match contender {
        Contender::WasmopSharded => Tuning {
            replicas: REPLICAS,
            layout: contender.layout(N),
            ..Tuning::single(16, resync)
        },
        _ => Tuning::single(16, resync),
    };
    // Two resync periods of idle.
    let m = measure(
        contender,
        N,
        tuning,
        binaries,
        resync * 2,
        Duration::from_secs(300),
    )
    .await?;
    check(&m);
    if contender == Contender::WasmopSharded {
        check_sharded(&m);
    }
    Ok(m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_contender_converges_50_apps_and_is_measured() -> anyhow::Result<()> {
    let binaries = binaries().await?;
    let rows: Vec<Measurement> = futures::stream::iter(Contender::ALL)
        .map(|contender| measured(contender, &binaries))
        .buffered(AT_ONCE)
        .try_collect()
        .await?;
    println!("{}", report::table(N, &rows));
    print!("{}", report::sharded_table(N, &rows));
    let line = report::final_line(N, &rows);
    println!("{line}");
    for sharded in report::sharded_lines(N, &rows) {
        println!("{sharded}");
    }
    assert!(!line.contains("n/a"), "a ratio is missing: {line}");
    Ok(())
}
