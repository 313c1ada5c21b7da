//! The image-updater logic as a native kube-runtime operator: what a Rust author would write
//! without wasmop. `Controller::new(Apps).owns(Deployments).owns(Services)`, the logic called
//! through `wasmop_sdk::Reconciler`, children and status by server-side apply with wasmop's field
//! manager, the module's Events through kube's `Recorder`, a resync by `Action::requeue`.
//!
//! Usage: `scale-kube-rs <namespace> <concurrency> <resync-seconds>` with `KUBECONFIG` set.
//! Prints `READY` on stdout once the API server answers a list of Apps. The client has no client-side rate
//! limit (kube-rs has none).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use wasmop_bench_scale::converge::app_resource;
use wasmop_bench_scale::native::{self, FIELD_MANAGER, FINALIZER};

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Logic(#[from] wasmop_bench_scale::Error),
}

struct Ctx {
    client: Client,
    deployments: Store<Deployment>,
    recorder: Recorder,
    resync: Duration,
}

async fn reconcile(app: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let apps: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &app_resource());
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    if app.metadata.deletion_timestamp.is_some() {
        // Finalize: the Service goes first, then the finalizer; the Deployment is collected.
        match services.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        let rest: Vec<String> = app
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": app.resource_version()}});
        apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Action::await_change());
    }
    if !app.finalizers().iter().any(|f| f == FINALIZER) {
        let mut all = app.finalizers().to_vec();
        all.push(FINALIZER.to_string());
        let patch =
            json!({"metadata": {"finalizers": all, "resourceVersion": app.resource_version()}});
        apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let observed = ctx
        .deployments
        .get(&ObjectRef::new(&name).within(&ns))
        .filter(|d| {
            d.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == app.uid().as_ref())
        });
    let value = serde_json::to_value(app.as_ref())
        .map_err(|e| wasmop_bench_scale::Error::Other(format!("serializing App {name}: {e}")))?;
    let outcome = native::reconcile(&value, observed.as_deref())?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
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
        result?;
    }
    if let Some(status) = &outcome.status {
        let current = app.data.get("status");
        let wanted = native::status_object(
            status,
            current,
            app.metadata.generation.unwrap_or(0),
            &native::now_rfc3339(),
        );
        if !native::status_unchanged(current, &wanted) {
            let body =
                json!({"apiVersion": "example.wasmop.dev/v1", "kind": "App", "status": wanted});
            apps.patch_status(&name, &apply, &Patch::Apply(&body))
                .await?;
        }
    }
    let reference = app.object_ref(&app_resource());
    for (reason, message, action) in &outcome.events {
        let event = Event {
            type_: EventType::Normal,
            reason: reason.clone(),
            note: Some(message.clone()),
            action: action.clone(),
            secondary: None,
        };
        ctx.recorder.publish(&event, &reference).await?;
    }
    Ok(Action::requeue(
        outcome.requeue.map_or(ctx.resync, |r| r.min(ctx.resync)),
    ))
}

fn error_policy(_app: Arc<DynamicObject>, error: &Error, _ctx: Arc<Ctx>) -> Action {
    eprintln!("reconcile failed: {error}");
    Action::requeue(Duration::from_secs(1))
}

fn arg(args: &[String], i: usize, what: &str) -> Result<String, String> {
    args.get(i)
        .cloned()
        .ok_or_else(|| format!("missing argument {i}: {what}"))
}

async fn run() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let ns = arg(&args, 1, "namespace")?;
    let concurrency: u16 = arg(&args, 2, "concurrency")?
        .parse()
        .map_err(|e| format!("concurrency: {e}"))?;
    let resync: f64 = arg(&args, 3, "resync seconds")?
        .parse()
        .map_err(|e| format!("resync seconds: {e}"))?;
    // Linked with the host's crates, rustls has two providers: pick ring before any client.
    wasmop_testenv::controlplane::install_crypto_provider();
    let client = Client::try_default()
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &app_resource());
    let (deployments, writer) = reflector::store::<Deployment>();
    let deployment_events = reflector::reflector(
        writer,
        watcher(
            Api::<Deployment>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        deployments,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "image-updater".into(),
                instance: None,
            },
        ),
        resync: Duration::from_secs_f64(resync.max(0.001)),
    });
    let controller = Controller::new_with(apps, watcher::Config::default(), app_resource())
        .owns_stream(deployment_events)
        .owns(
            Api::<Service>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .with_config(Config::default().concurrency(concurrency));
    // Ready once the API answers a list of Apps; the controller's own initial list follows at
    // once and catches every App created after this.
    let probe: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &app_resource());
    probe
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(|e| format!("listing Apps: {e}"))?;
    println!("READY");
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!("reconcile: {e}");
            }
        })
        .await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale-kube-rs: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
