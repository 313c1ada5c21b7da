//! `make bench-hotswap`: how long from a module update to the first reconcile by the new
//! module, on the real local control plane with an in-process host (tiered compilation on, as
//! `wasmop run` has it).
//!
//! **Rust, through a ConfigMap.** One App is reconciled by image-updater. Each swap pushes the
//! other of two builds (v1 leaves its Deployment unannotated, v2 annotates it), so the first
//! reconcile by the new module is visible as a change of the Deployment, seen through a watch.
//! Two series:
//!
//! - `known build`: the two builds alternate unchanged, so the host finds them in its compiled
//!   cache (a rollback, or a re-push of an earlier version).
//! - `new build`: every push is a module the host has never seen (a custom section with the
//!   swap's number makes its sha256 unique), so it is read, checked, compiled, self-checked and
//!   swapped: what shipping a new version costs.
//!
//! **Python, through an OCI registry.** One Tenant is reconciled by the tenant example (18 MB
//! component). Each swap pushes a never-seen build (the first or the second build of the example,
//! which differ in the LimitRange's default memory request, made unique as above) to the test
//! registry (not timed), then repins `spec.module.oci.reference` to its digest (the clock starts
//! there) and waits for the LimitRange written by the new module: pull, check, compile,
//! self-check, swap and the first reconcile.
//!
//! Before each new-build swap the bench waits until the serving module's optimized build is in
//! (the background compile of the previous swap is done), so every push meets an idle host, as
//! pushes minutes apart do.
//!
//! Environment: `WASMOP_BENCH_SWAPS` (default 20 per Rust series), `WASMOP_BENCH_PYTHON_SWAPS`
//! (default 10); `RUST_LOG` for the in-process host's log on stderr (off when unset), for
//! example `RUST_LOG=wasmop::manager=info` for each swap's `read_ms`, `load_ms` and
//! `self_check_ms`. The last two lines are `hotswap new-build rust p50 ms: N` and
//! `hotswap new-build python p50 ms: N`.

#[path = "../e2e/support.rs"]
#[allow(dead_code)] // the bench uses a part of what the e2e tests share
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use support::*;
use wasmop::crd::WasmReconciler;
use wasmop::engine::Tier;
use wasmop_testenv::{Registry, TestEnv, eventually};

const ANNOTATION: &str = "example.wasmop.dev/module-revision";

/// How long one swap may take before the bench gives up.
const SWAP_WITHIN: Duration = Duration::from_secs(300);

/// Appends a custom section (id 0) named `wasmop-bench` holding `n` to a component: still the same
/// program, but a different sha256.
fn unique(module: &[u8], n: u32) -> Vec<u8> {
    use wasmop_test_modules::leb;
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

/// Waits until the module serving `wr` in this process runs its optimized build (the
/// background compile of the last swap is done), so the next push meets an idle host.
async fn settle(wr: &str) -> anyhow::Result<()> {
    eventually(
        &format!("{wr}'s optimized build in"),
        SWAP_WITHIN,
        || async {
            Ok(wasmop::admission::slots()
                .module(wr)
                .filter(|m| m.tier() == Tier::Optimized)
                .map(|_| ()))
        },
    )
    .await
}

/// A watch of `api` (field selector `fields`) that has delivered the current state.
async fn watch_from_now<K>(
    api: Api<K>,
    fields: &str,
) -> anyhow::Result<futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut changes = watcher(api, watcher::Config::default().fields(fields)).boxed();
    while let Some(event) = changes.next().await {
        if matches!(event?, watcher::Event::InitDone) {
            break;
        }
    }
    Ok(changes)
}

/// Waits for the first object from `changes` that `done` accepts.
async fn first_change<K>(
    changes: &mut futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    done: impl Fn(&K) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::sleep(SWAP_WITHIN);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => anyhow::bail!("no reconcile by the new module within {SWAP_WITHIN:?}"),
            event = changes.next() => {
                let Some(event) = event else { anyhow::bail!("the watch ended") };
                if let watcher::Event::Apply(o) = event?
                    && done(&o)
                {
                    return Ok(());
                }
            }
        }
    }
}

/// One ConfigMap swap: from the update of the module ConfigMap to the Deployment changed by the
/// new module.
async fn swap_config_map(
    client: &Client,
    ns: &str,
    cm: &ConfigMap,
    want_annotated: bool,
) -> anyhow::Result<Duration> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    // Watch before pushing, so no change is missed.
    let mut changes = watch_from_now(deployments, "metadata.name=app").await?;
    let start = Instant::now();
    cms.patch(
        "image-updater",
        &PatchParams::apply("wasmop-bench").force(),
        &Patch::Apply(cm),
    )
    .await?;
    first_change(&mut changes, |d: &Deployment| {
        d.annotations().contains_key(ANNOTATION) == want_annotated
    })
    .await?;
    Ok(start.elapsed())
}

async fn rust_series(
    env: &TestEnv,
    wr: &str,
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
        settle(wr).await?;
        let took = swap_config_map(&env.client, &env.namespace, &cm, next == 1).await?;
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
        "{label:<20} swaps {:>3}  p50 {:>7.1} ms  p95 {:>7.1} ms  min {:>7.1} ms  max {:>7.1} ms",
        sorted.len(),
        p50,
        percentile(&sorted, 0.95),
        sorted[0],
        sorted[sorted.len() - 1]
    );
    p50
}

/// The Rust series; returns the new-build p50.
async fn rust(env: &TestEnv, swaps: u32) -> anyhow::Result<f64> {
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    // Rollback watches must not hold a swap back.
    let (wr, _) = image_updater(
        env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"rollout": {"watchReconciles": 1}}),
    )
    .await?;
    let apps = apps(&env.client, &env.namespace);
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "metadata": {"name": "app"},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps.create(&PostParams::default(), &app).await?;
    let deployments: Api<Deployment> = env.api();
    eventually("the App's Deployment", SWAP_WITHIN, || async {
        Ok(deployments.get_opt("app").await?)
    })
    .await?;

    let builds = [v1, v2];
    println!(
        "Rust (image-updater, {} KiB) through a ConfigMap: ConfigMap update -> first reconcile by the new module, {swaps} swaps per series",
        builds[0].len() / 1024
    );
    // Both builds compiled once and cached, before anything is timed.
    rust_series(env, &wr, "warm-up", 2, &builds, false).await?;
    let known = rust_series(env, &wr, "known build", swaps, &builds, false).await?;
    let fresh = rust_series(env, &wr, "new build", swaps, &builds, true).await?;
    summary("rust known build", &known);
    Ok(summary("rust new build", &fresh))
}

/// The Python series; returns the new-build p50.
async fn python(env: &TestEnv, swaps: u32) -> anyhow::Result<f64> {
    let registry = Registry::start().await?;
    let builds = [
        std::fs::read(tenant_module(TenantBuild::First).await?)?,
        std::fs::read(tenant_module(TenantBuild::Second).await?)?,
    ];
    let ns = env.namespace.clone();
    oci_pull_secret(env, &registry, "registry").await?;
    let repo = format!("{}/mods/tenant", registry.host);
    let first = oci_push(&registry, "mods/tenant:first", builds[0].clone()).await?;
    let wr = register_tenant(
        env,
        oci_module(&registry, &format!("{repo}@{first}"), "registry"),
    )
    .await?;
    let tenant = format!("{ns}-bench");
    let created: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "Tenant", "metadata": {"name": tenant},
        "spec": {"quota": {"cpu": "8", "memory": "16Gi", "pods": "40"}}
    }))?;
    tenants(&env.client)
        .create(&PostParams::default(), &created)
        .await?;
    let limits: Api<LimitRange> = Api::namespaced(env.client.clone(), &tenant);
    eventually("the Tenant's LimitRange", SWAP_WITHIN, || async {
        Ok(limits.get_opt("tenant-defaults").await?)
    })
    .await?;
    println!(
        "Python (tenant, {} KiB) through an OCI registry: reference update -> first reconcile by the new module, {swaps} swaps",
        builds[0].len() / 1024
    );
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    let mut times = Vec::new();
    for i in 0..swaps {
        // The first build is active: start with the second.
        let next = 1 - (i % 2) as usize;
        let want = if next == 1 { "256Mi" } else { "128Mi" };
        let digest = oci_push(
            &registry,
            &format!("mods/tenant:swap-{i}"),
            unique(&builds[next], i + 1),
        )
        .await?;
        settle(&wr).await?;
        let mut changes = watch_from_now(limits.clone(), "metadata.name=tenant-defaults").await?;
        let start = Instant::now();
        wrs.patch(
            &wr,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"module": oci_module(&registry, &format!("{repo}@{digest}"), "registry")}})),
        )
        .await?;
        first_change(&mut changes, |lr: &LimitRange| {
            lr.spec
                .as_ref()
                .and_then(|s| s.limits.first())
                .and_then(|l| l.default_request.as_ref())
                .and_then(|d| d.get("memory"))
                .is_some_and(|q| q.0 == want)
        })
        .await?;
        let took = start.elapsed().as_secs_f64() * 1000.0;
        times.push(took);
        eprintln!("  python new build swap {:>2}: {took:>7.1} ms", i + 1);
    }
    // The last swap's optimized build is written to the cache when its compile ends: wait for
    // it, or it lands after the cache directory is removed (45 MiB left in /tmp each run).
    settle(&wr).await?;
    Ok(summary("python new build", &times))
}

fn swaps(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rust_swaps = swaps("WASMOP_BENCH_SWAPS", 20);
    let python_swaps = swaps("WASMOP_BENCH_PYTHON_SWAPS", 10);
    let env = TestEnv::get("bench-hotswap").await?;
    let cache = std::env::temp_dir().join(format!("wasmop-bench-hotswap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let ns = env.namespace.clone();
    let host = start_host_with(&env, |o| {
        o.cache_dir = Some(cache.clone());
        o.oci.namespace = Some(ns);
    })
    .await?;
    let rust = rust(&env, rust_swaps).await;
    let python = match rust {
        Ok(_) => python(&env, python_swaps).await,
        Err(_) => Ok(0.0),
    };
    host.shutdown().await?;
    let _ = std::fs::remove_dir_all(&cache);
    let (rust, python) = (rust?, python?);
    println!("hotswap new-build rust p50 ms: {}", rust.round() as u64);
    println!("hotswap new-build python p50 ms: {}", python.round() as u64);
    // Without it the plane's directory was kept and the run reported as a failed test.
    env.passed()
}
