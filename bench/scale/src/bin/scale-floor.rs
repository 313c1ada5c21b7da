//! The API server's write floor for the benchmark's work: a bare client that, for every App it
//! sees once, server-side applies its Deployment and Service (the image-updater logic's objects,
//! with wasmop's field manager, label and ownerReference) and writes its status once. No cache,
//! no re-reconcile, no resync: only the writes convergence needs.
//!
//! Usage: `scale-floor <namespace> <concurrency>` with `KUBECONFIG` set. Prints `READY` once the
//! App watch has listed, then stays up (idle) until killed. No client-side rate limit.

use std::collections::HashSet;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use wasmop_bench_scale::converge::app_resource;
use wasmop_bench_scale::native::{self, FIELD_MANAGER};

async fn write(client: Client, app: DynamicObject) -> Result<(), String> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let value = serde_json::to_value(&app).map_err(|e| e.to_string())?;
    let outcome = native::reconcile(&value, None).map_err(|e| e.to_string())?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let writes = outcome.children.iter().map(|child| {
        let (deployments, services, apply) = (&deployments, &services, &apply);
        async move {
            let child_name = child["metadata"]["name"].as_str().unwrap_or_default();
            if child["kind"] == "Deployment" {
                deployments
                    .patch(child_name, apply, &Patch::Apply(child))
                    .await
                    .map(|_| ())
            } else {
                services
                    .patch(child_name, apply, &Patch::Apply(child))
                    .await
                    .map(|_| ())
            }
        }
    });
    for result in futures::future::join_all(writes).await {
        result.map_err(|e| format!("applying a child of {name}: {e}"))?;
    }
    if let Some(status) = &outcome.status {
        let wanted = native::status_object(
            status,
            None,
            app.metadata.generation.unwrap_or(0),
            &native::now_rfc3339(),
        );
        let body = json!({"apiVersion": "example.wasmop.dev/v1", "kind": "App", "status": wanted});
        let apps: Api<DynamicObject> = Api::namespaced_with(client, &ns, &app_resource());
        apps.patch_status(&name, &apply, &Patch::Apply(&body))
            .await
            .map_err(|e| format!("status of {name}: {e}"))?;
    }
    Ok(())
}

async fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let ns = args
        .get(1)
        .cloned()
        .ok_or("missing argument 1: namespace")?;
    let concurrency: usize = args
        .get(2)
        .ok_or("missing argument 2: concurrency")?
        .parse()
        .map_err(|e| format!("concurrency: {e}"))?;
    // Linked with the host's crates, rustls has two providers: pick ring before any client.
    wasmop_testenv::controlplane::install_crypto_provider();
    let client = Client::try_default()
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &app_resource());
    let mut seen = HashSet::new();
    let events = watcher(apps, watcher::Config::default()).default_backoff();
    let mut ready = false;
    let work = events
        .filter_map(|e| {
            let out = match e {
                Ok(watcher::Event::InitDone) if !ready => {
                    ready = true;
                    println!("READY");
                    None
                }
                Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => {
                    seen.insert(app.uid().unwrap_or_default()).then_some(app)
                }
                Ok(_) => None,
                Err(e) => {
                    eprintln!("watch: {e}");
                    None
                }
            };
            futures::future::ready(out)
        })
        .map(|app| write(client.clone(), app))
        .buffer_unordered(concurrency.max(1));
    futures::pin_mut!(work);
    while let Some(result) = work.next().await {
        if let Err(e) = result {
            eprintln!("{e}");
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale-floor: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
