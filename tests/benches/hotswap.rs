//! `make bench-hotswap`: how long from a module ConfigMap update to the first reconcile by the
//! new module, on the real local control plane with an in-process host.
//!
//! One App is reconciled by image-updater. Each swap pushes the other of two builds (v1 leaves
//! its Deployment unannotated, v2 annotates it), so the first reconcile by the new module is
//! visible as a change of the Deployment, seen through a watch. Two series:
//!
//! - `new build`: every push is a module the host has never seen (a custom section with the
//!   swap's number makes its sha256 unique), so it is read, checked, compiled, self-checked and
//!   swapped: what shipping a new version costs.
//! - `known build`: the two builds alternate unchanged, so the host finds them in its compiled
//!   cache (a rollback, or a re-push of an earlier version).
//!
//! Environment: `WASMOP_BENCH_SWAPS` (default 20 per series). The last line is
//! `hotswap p50 ms: N` for the new-build series, the case users meet.

#[path = "../e2e/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use support::*;
use wasmop_testenv::{TestEnv, eventually};

const ANNOTATION: &str = "example.wasmop.dev/module-revision";

/// Appends a custom section (id 0) named `wasmop-bench` holding `n` to a component: still the same
/// program, but a different sha256.
fn unique(module: &[u8], n: u32) -> Vec<u8> {
    fn leb(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"wasmop-bench";
    let payload = n.to_le_bytes();
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name);
    body.extend_from_slice(&payload);
    let mut out = module.to_vec();
    out.push(0);
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn swap_once(
    client: &Client,
    ns: &str,
    cm: &ConfigMap,
    want_annotated: bool,
) -> anyhow::Result<Duration> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    // Watch before pushing, so no change is missed.
    let mut changes = watcher(
        deployments,
        watcher::Config::default().fields("metadata.name=app"),
    )
    .boxed();
    // The watch starts with the current state: wait until it has been delivered.
    while let Some(event) = changes.next().await {
        if matches!(event?, watcher::Event::InitDone) {
            break;
        }
    }
    let start = Instant::now();
    cms.patch(
        "image-updater",
        &PatchParams::apply("wasmop-bench").force(),
        &Patch::Apply(cm),
    )
    .await?;
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => anyhow::bail!("no reconcile by the new module within 60 s"),
            event = changes.next() => {
                let Some(event) = event else { anyhow::bail!("the watch ended") };
                if let watcher::Event::Apply(d) = event?
                    && d.annotations().contains_key(ANNOTATION) == want_annotated
                {
                    return Ok(start.elapsed());
                }
            }
        }
    }
}

async fn series(
    env: &TestEnv,
    label: &str,
    swaps: u32,
    builds: &[Vec<u8>; 2],
    fresh: bool,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::new();
    for i in 0..swaps {
        let which = (i % 2) as usize;
        // builds[0] is v1 (no annotation), builds[1] is v2. Start on v2 since v1 is active.
        let next = 1 - which;
        let bytes = if fresh {
            unique(&builds[next], i + 1)
        } else {
            builds[next].clone()
        };
        let sha = wasmop::engine::sha256_hex(&bytes);
        let cm = wasmop::modules::source::to_config_map(
            "image-updater",
            &env.namespace,
            &bytes,
            "image-updater",
            "bench",
            &sha,
        )?;
        let took = swap_once(&env.client, &env.namespace, &cm, next == 1).await?;
        times.push(took.as_secs_f64() * 1000.0);
        eprintln!(
            "  {label} swap {:>2}: {:>7.1} ms",
            i + 1,
            took.as_secs_f64() * 1000.0
        );
    }
    Ok(times)
}

fn summary(label: &str, times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p50 = percentile(&sorted, 0.5);
    println!(
        "{label:<12} swaps {:>3}  p50 {:>7.1} ms  p95 {:>7.1} ms  min {:>7.1} ms  max {:>7.1} ms",
        sorted.len(),
        p50,
        percentile(&sorted, 0.95),
        sorted[0],
        sorted[sorted.len() - 1]
    );
    p50
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let swaps: u32 = std::env::var("WASMOP_BENCH_SWAPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(2);
    let env = TestEnv::get("bench-hotswap").await?;
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    // Rollback watches must not hold a swap back.
    image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"rollout": {"watchReconciles": 1}}),
    )
    .await?;
    let cache = std::env::temp_dir().join(format!("wasmop-bench-hotswap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let host = start_host(&env, Some(&cache)).await?;
    let apps = apps(&env.client, &env.namespace);
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "metadata": {"name": "app"},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps.create(&PostParams::default(), &app).await?;
    let deployments: Api<Deployment> = env.api();
    eventually("the App's Deployment", WAIT, || async {
        Ok(deployments.get_opt("app").await?)
    })
    .await?;

    let builds = [v1, v2];
    println!(
        "hot swap: ConfigMap update -> first reconcile by the new module ({} KiB module, {swaps} swaps per series)",
        builds[0].len() / 1024
    );
    // Both builds compiled once and cached, before anything is timed.
    series(&env, "warm-up", 2, &builds, false).await?;
    let known = series(&env, "known build", swaps, &builds, false).await?;
    let fresh = series(&env, "new build", swaps, &builds, true).await?;
    summary("known build", &known);
    let p50 = summary("new build", &fresh);
    host.shutdown().await?;
    let _ = std::fs::remove_dir_all(&cache);
    println!("hotswap p50 ms: {}", p50.round() as u64);
    Ok(())
}
