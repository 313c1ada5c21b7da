//! The host at scale, on the real local control plane: what a converged host writes, counted
//! by the API server itself.
//!
//! The control plane belongs to this test binary (one per process), so the API server's
//! `apiserver_request_total` counters for the kinds the image-updater writes (Deployments,
//! Services, Apps and Events) move only through this test's host and the control plane's own
//! controllers, which are idle once every rollout has finished.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Client;
use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::json;
use support::*;
use wasmop_testenv::{TestEnv, eventually};

/// How many Apps the test converges.
const APPS: usize = 50;

/// The write verbs of `apiserver_request_total`.
const WRITES: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// The resources whose writes are counted: what the image-updater's reconciles write.
const WATCHED: [&str; 4] = ["deployments", "services", "apps", "events"];

fn app(name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
    }))?)
}

/// The value of a label in one Prometheus text line (`name{a="x",b="y"} 3`).
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &line[start..];
    Some(&rest[..rest.find('"')?])
}

/// The API server's write requests by `resource verb`, for the counted resources.
async fn api_writes(client: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut writes = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (Some(resource), Some(verb)) = (label(line, "resource"), label(line, "verb")) else {
            continue;
        };
        if !WATCHED.contains(&resource) || !WRITES.contains(&verb) {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("unparsable metrics line: {line}"))?;
        let subresource = label(line, "subresource").unwrap_or_default();
        *writes
            .entry(format!("{verb} {resource}/{subresource}"))
            .or_insert(0.0) += value;
    }
    Ok(writes)
}

/// The host's finished reconciles of `reconciler` (its own metrics, in this process).
fn reconciles(reconciler: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("wasmop_reconcile_total{"))
        .filter(|l| label(l, "reconciler") == Some(reconciler))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<String> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let was = before.get(k).copied().unwrap_or(0.0);
            (*v != was).then(|| format!("{k}: +{}", v - was))
        })
        .collect()
}

#[tokio::test]
async fn a_converged_host_writes_nothing_over_two_resync_periods() -> anyhow::Result<()> {
    let env = TestEnv::get("scale-idle").await?;
    let (wr, _) = image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"resyncPeriod": "10s", "limits": {"deadline": "2s", "memory": "64Mi", "concurrency": 4}}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    for i in 0..APPS {
        apps.create(&PostParams::default(), &app(&format!("app-{i}"))?)
            .await?;
    }

    // Converged: every App's status reports its generation, its ready replica and a finished
    // rollout (so the control plane's own controllers are idle too).
    eventually(
        "every App rolled out and its status at its generation",
        Duration::from_secs(300),
        || async {
            let list = apps.list(&ListParams::default()).await?;
            let done = list.items.len() == APPS
                && list.items.iter().all(|a| {
                    let s = &a.data["status"];
                    s["observedGeneration"] == json!(a.metadata.generation.unwrap_or(1))
                        && s["readyReplicas"] == json!(1)
                        && s["conditions"].as_array().is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "Progressing" && c["status"] == "False")
                        })
                });
            Ok(done.then_some(()))
        },
    )
    .await?;
    // The reconciles the last status writes caused have finished too: one more resync of every
    // App has run after convergence before the count starts.
    let converged = reconciles(&wr)?;
    eventually(
        "one resync of every App after convergence",
        Duration::from_secs(120),
        || async { Ok((reconciles(&wr)? >= converged + APPS as f64).then_some(())) },
    )
    .await?;

    let before = api_writes(&env.client).await?;
    let start = reconciles(&wr)?;
    // More than two resync periods of every App, counted by the host's own reconciles.
    eventually(
        "two more resyncs of every App",
        Duration::from_secs(180),
        || async { Ok((reconciles(&wr)? >= start + 2.0 * APPS as f64 + 1.0).then_some(())) },
    )
    .await?;
    let after = api_writes(&env.client).await?;
    let ran = reconciles(&wr)? - start;
    let writes = moved(&before, &after);
    assert!(
        writes.is_empty(),
        "a converged host wrote while {ran} reconciles of {APPS} unchanged Apps ran: {writes:?}"
    );
    host.shutdown().await?;
    Ok(())
}
