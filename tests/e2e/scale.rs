//! The host at scale, on the real local control plane: what a converged host writes, counted
//! by the API server itself.
//!
//! Each test counts on a control plane of its own (`Plane::Fresh`, stopped when the test ends),
//! since the API server counts cluster-wide: in the idle test, its `apiserver_request_total`
//! counters for the kinds the image-updater writes (Deployments, Services, Apps and Events)
//! move only through this test's host and the control plane's own controllers, which are idle
//! once every rollout has finished; in the scope test, the namespaced Widget watches open are
//! only its host's. No other test of the e2e binary writes or watches there.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use wasmop::crd::finalizer_for;
use wasmop::host::WebhookOptions;
use wasmop_testenv::controlplane::ChildRead;
use wasmop_testenv::{Plane, TestEnv, Turn, eventually};

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
    host_counter("wasmop_reconcile_total{", reconciler)
}

/// The sum of the host's `metric` lines (`name{` prefix) for `reconciler`.
fn host_counter(metric: &str, reconciler: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(metric))
        .filter(|l| label(l, "reconciler") == Some(reconciler))
        .filter(|l| label(l, "function").is_none_or(|f| f == "reconcile"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The host's calls of `reconciler`'s module `reconcile`.
fn module_calls(reconciler: &str) -> anyhow::Result<f64> {
    host_counter("wasmop_module_call_duration_seconds_count{", reconciler)
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
    let env = TestEnv::with("scale-idle", Plane::Fresh, Turn::Shared).await?;
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

    events_published(&wr).await?;
    let before = api_writes(&env.client).await?;
    let start = reconciles(&wr)?;
    let calls = module_calls(&wr)?;
    // More than two resync periods of every App, counted by the host's own reconciles.
    eventually(
        "two more resyncs of every App",
        Duration::from_secs(180),
        || async { Ok((reconciles(&wr)? >= start + 2.0 * APPS as f64 + 1.0).then_some(())) },
    )
    .await?;
    let after = api_writes(&env.client).await?;
    let ran = reconciles(&wr)? - start;
    let called = module_calls(&wr)? - calls;
    let writes = moved(&before, &after);
    assert!(
        writes.is_empty(),
        "a converged host wrote while {ran} reconciles of {APPS} unchanged Apps ran: {writes:?}"
    );
    // A reconcile whose inputs did not change since a call that asked for no requeue does not
    // call the module: each App's module is called at most once more (the first resync after
    // its last status write sees that write), however many resyncs run.
    println!("[scale] idle: {ran} reconciles of {APPS} converged Apps, {called} module calls");
    assert!(
        called <= APPS as f64,
        "{called} module calls in {ran} reconciles of {APPS} unchanged Apps (at most one per App)"
    );
    host.shutdown().await?;
    env.passed()
}

/// The value of `wasmop_cache_objects` for `reconciler`'s `kind` (`apiVersion/kind`), if set.
fn cache_objects(reconciler: &str, kind: &str) -> anyhow::Result<Option<f64>> {
    let text = wasmop::operations::metrics::encode()?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("wasmop_cache_objects{"))
        .filter(|l| label(l, "reconciler") == Some(reconciler) && label(l, "kind") == Some(kind))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()))
}

/// The API server's long-running WATCH requests open now on `resource`, by scope
/// (`namespace` or `cluster`).
async fn open_watches(client: &Client, resource: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut open = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| label(l, "resource") == Some(resource) && label(l, "verb") == Some("WATCH"))
    {
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("unparsable metrics line: {line}"))?;
        let scope = label(line, "scope").unwrap_or_default().to_string();
        *open.entry(scope).or_insert(0.0) += value;
    }
    Ok(open)
}

fn widget(name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {}
    }))?)
}

/// A reconciler whose `spec.namespaces` lists two namespaces watches exactly those two: the
/// API server serves its Widget watches per namespace, and the Widgets of a third namespace
/// (created before the host started, so a cluster-wide list would have returned them) never
/// reach its cache, counted by the host's own `wasmop_cache_objects` once the Widgets of both
/// namespaces are reconciled (which happens only after every cache finished its first list).
#[tokio::test]
async fn a_reconciler_with_two_namespaces_watches_exactly_those() -> anyhow::Result<()> {
    let env = TestEnv::with("scale-scope", Plane::Fresh, Turn::Shared).await?;
    let second = env.another("scale-scope-second").await?;
    let third = env.another("scale-scope-third").await?;
    let namespaces = [env.namespace.clone(), second.namespace.clone()];
    // The module's ServiceAccount may read and write Widgets and ConfigMaps in the second
    // namespace too (the host checks its reads in every namespace of the scope).
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "misbehave", "namespace": second.namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "misbehave"},
        "subjects": [{"kind": "ServiceAccount", "name": "misbehave", "namespace": env.namespace}]
    }))?;
    // (A Role with the rules in the second namespace, bound to the first namespace's account.)
    service_account(&env.client, &second.namespace, "misbehave", widget_rules()).await?;
    kube::Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(
        env.client.clone(),
        &second.namespace,
    )
    .patch(
        "misbehave",
        &kube::api::PatchParams::apply("wasmop-e2e").force(),
        &kube::api::Patch::Apply(&binding),
    )
    .await?;
    install_crds(&env.client).await?;
    // Widgets everywhere before the host starts: one in each namespace in scope, two outside.
    for (ns, names) in [
        (&env.namespace, vec!["in-first"]),
        (&second.namespace, vec!["in-second"]),
        (&third.namespace, vec!["outside-1", "outside-2"]),
    ] {
        for name in names {
            widgets(&env.client, ns)
                .create(&PostParams::default(), &widget(name)?)
                .await?;
        }
    }
    let (wr, _) = widget_reconciler(
        &env,
        "misbehave",
        wasmop_test_modules::MISBEHAVE,
        json!({"namespaces": namespaces}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    wait_wr_ready(&env.client, &wr).await?;
    for (ns, name) in [
        (&env.namespace, "in-first"),
        (&second.namespace, "in-second"),
    ] {
        let api = widgets(&env.client, ns);
        eventually(&format!("Widget {ns}/{name} reconciled"), WAIT, || async {
            let w = api.get(name).await?;
            Ok((w.data["status"]["reconciled"] == true).then_some(()))
        })
        .await?;
    }
    // The API server serves the reconciler's Widget watch as one watch per namespace.
    eventually("two namespaced Widget watches open", WAIT, || async {
        let open = open_watches(&env.client, "widgets").await?;
        Ok((open.get("namespace").copied().unwrap_or(0.0) >= 2.0).then_some(open))
    })
    .await?;
    // Both reconciles ran after the first lists of both namespaces completed: the cache holds
    // the two Widgets in scope, not the two outside.
    assert_eq!(
        cache_objects(&wr, "test.wasmop.dev/v1/Widget")?,
        Some(2.0),
        "the Widget cache of {wr} (namespaces {namespaces:?}) holds other namespaces' Widgets"
    );
    let outside = widgets(&env.client, &third.namespace)
        .get("outside-1")
        .await?;
    assert!(
        outside.data["status"].is_null(),
        "a Widget outside the scope was reconciled: {:?}",
        outside.data["status"]
    );
    host.shutdown().await?;
    env.passed()
}

/// The API server's requests by `verb resource/subresource`, for the counted resources, reads
/// (GET) included.
async fn api_requests(client: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut requests = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (Some(resource), Some(verb)) = (label(line, "resource"), label(line, "verb")) else {
            continue;
        };
        if !WATCHED.contains(&resource) || !(WRITES.contains(&verb) || verb == "GET") {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("unparsable metrics line: {line}"))?;
        let subresource = label(line, "subresource").unwrap_or_default();
        *requests
            .entry(format!("{verb} {resource}/{subresource}"))
            .or_insert(0.0) += value;
    }
    Ok(requests)
}

/// The reasons of every status the Apps were seen with, by App (a watch from before the first
/// App exists: every version the API server stored).
type Seen = std::sync::Arc<std::sync::Mutex<BTreeMap<String, Vec<String>>>>;

fn watch_statuses(api: kube::Api<DynamicObject>) -> (Seen, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    let seen: Seen = Seen::default();
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream =
            kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let Ok(kube::runtime::watcher::Event::Apply(app)) = event else {
                continue;
            };
            let reasons: Vec<String> = app.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["reason"].as_str().map(str::to_string))
                .collect();
            if let Ok(mut seen) = into.lock() {
                seen.entry(app.metadata.name.clone().unwrap_or_default())
                    .or_default()
                    .extend(reasons);
            }
        }
    });
    (seen, task)
}

/// What converging new Apps costs, counted by the API server (writes and reads of the kinds the
/// image-updater touches) and, for Events, by the Event objects (one create, then one patch per
/// repetition in a series): no GET before a child's first apply (the apply itself carries the
/// check that nobody else holds the name), one apply per child, one finalizer write per App
/// (the module finalizes), one Event per change the module reports, no status computed
/// before the App's children were seen (the `DeploymentCreating` status of a reconcile that
/// created them is not written: the next reconcile, which sees them, writes the status), and
/// one status write per App: the rollout's steps, reported while the module asks for a
/// requeue, are held back within the debounce, and the finished rollout's status is written.
#[tokio::test]
async fn converging_apps_reads_nothing_and_writes_each_child_once() -> anyhow::Result<()> {
    let env = TestEnv::with("scale-requests", Plane::Fresh, Turn::Shared).await?;
    const N: usize = 20;
    let (reconciler, _) = image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"limits": {"deadline": "2s", "memory": "64Mi", "concurrency": 4}}),
    )
    .await?;
    let apps = apps(&env.client, &env.namespace);
    let (seen, watch) = watch_statuses(apps.clone());
    // A debounce longer than any rollout here, so that the count does not depend on how fast
    // this machine rolls out (with the default 5 s, a rollout slower than that writes a step).
    // The image-updater finalizes: the host serving webhooks makes the API server add its
    // finalizer in the create.
    let host = start_host_with(&env, |o| {
        o.status_debounce = Duration::from_secs(120);
        o.webhook = Some(WebhookOptions::new(([127, 0, 0, 1], 0).into()));
    })
    .await?;
    // Its module serving: until then the validating webhook, registered before, refuses the
    // creates below by its failure policy (a fresh clone's `make test` on a loaded machine:
    // "its module is still being read (not ready within 4s)").
    wait_wr_ready(&env.client, &reconciler).await?;
    let finalizer = finalizer_for(&reconciler);
    finalizer_added_on_create(&apps, &finalizer).await?;
    // The API server adds it itself (Kubernetes 1.37 serves MutatingAdmissionPolicies): the
    // finalizer policy and its binding are there, the finalizer webhook is not.
    let config = format!("wasmop-{reconciler}");
    let policies: Api<MutatingAdmissionPolicy> = Api::all(env.client.clone());
    let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(env.client.clone());
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    assert!(
        policies.get_opt(&config).await?.is_some(),
        "no finalizer policy"
    );
    assert!(
        bindings.get_opt(&config).await?.is_some(),
        "no finalizer policy binding"
    );
    assert!(
        webhooks.get_opt(&config).await?.is_none(),
        "a finalizer webhook beside the policy"
    );
    let before = api_requests(&env.client).await?;
    let reads_before = env.cp.child_reads()?.len();
    for i in 0..N {
        apps.create(&PostParams::default(), &app(&format!("app-{i}"))?)
            .await?;
    }
    eventually(
        "every App rolled out and its status at its generation",
        Duration::from_secs(300),
        || async {
            let list = apps.list(&ListParams::default()).await?;
            let done = list.items.len() == N
                && list.items.iter().all(|a| {
                    let s = &a.data["status"];
                    s["observedGeneration"] == json!(a.metadata.generation.unwrap_or(1))
                        && s["readyReplicas"] == json!(1)
                        && s["conditions"].as_array().is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "Progressing" && c["status"] == "False")
                        })
                })
                && seen.lock().is_ok_and(|s| s.len() == N);
            Ok(done.then_some(()))
        },
    )
    .await?;
    events_published(&reconciler).await?;
    let after = api_requests(&env.client).await?;
    let reads = host_reads(env.cp.child_reads()?.split_off(reads_before));
    // The audit log is live (else "no reads" would hold vacuously): this read shows in it.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(env.client.clone(), &env.namespace);
    services.get("app-0").await?;
    // The API server logs a request once it has answered: waited for (a bounded wait; a log
    // that never shows it fails below).
    let read_logged = || async {
        let logged = env.cp.child_reads()?.iter().any(|r| {
            r.uri.starts_with(&format!(
                "/api/v1/namespaces/{}/services/app-0",
                env.namespace
            ))
        });
        Ok(logged.then_some(()))
    };
    let logged = eventually("the test's own read in the audit log", WAIT, read_logged)
        .await
        .is_ok();
    host.shutdown().await?;
    watch.abort();
    let requests: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let count = |key: &str| requests.get(key).copied().unwrap_or(0.0);
    // The module's Events on the Apps: one request per Event object and per repetition.
    let module_events: f64 = events_of(&env.client, &env.namespace)
        .await?
        .iter()
        .filter(|e| {
            e.reporting_controller
                .as_deref()
                .is_some_and(|c| c.starts_with("wasmop/"))
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("App")
        })
        .map(|e| f64::from(e.series.as_ref().map_or(1, |s| s.count)))
        .sum();
    let n = N as f64;
    let per_app = |v: f64| v / n;
    println!(
        "[scale] converging {N} Apps: requests {requests:?}; module Events {module_events}; per App: child applies {:.2}, reads {:.2}, finalizer {:.2}, status {:.2}, Events {:.2}",
        per_app(count("APPLY deployments/") + count("APPLY services/")),
        per_app(reads.len() as f64),
        per_app(count("PATCH apps/")),
        per_app(count("APPLY apps/status")),
        per_app(module_events),
    );
    println!(
        "[scale] converging {N} Apps: {:.2} requests per App (child applies, reads, finalizer, status, Events)",
        per_app(
            count("APPLY deployments/")
                + count("APPLY services/")
                + reads.len() as f64
                + count("PATCH apps/")
                + count("APPLY apps/status")
                + module_events
        ),
    );
    let early: Vec<String> = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("the status watch panicked"))?
        .iter()
        .filter(|(_, reasons)| reasons.iter().any(|r| r == "DeploymentCreating"))
        .map(|(name, _)| name.clone())
        .collect();
    // Every broken expectation at once (a failure shows all of them).
    let mut problems = Vec::new();
    if !logged {
        problems.push("the audit log missed a read of app-0's Service".to_string());
    }
    if !reads.is_empty() {
        problems.push(format!(
            "{} reads of children (a new child's first apply needs none): {reads:?}",
            reads.len()
        ));
    }
    for (key, what, per_app) in [
        ("APPLY deployments/", "Deployment applies", 1.0),
        ("APPLY services/", "Service applies", 1.0),
        // The finalizer policy added it as each App was created.
        ("PATCH apps/", "finalizer writes", 0.0),
        ("APPLY apps/status", "status writes", 1.0),
    ] {
        if count(key) != n * per_app {
            problems.push(format!("{} {what}, not {per_app} per App", count(key)));
        }
    }
    let without: Vec<String> = apps
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|a| {
            !a.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| *f == finalizer)
        })
        .map(|a| a.metadata.name.clone().unwrap_or_default())
        .collect();
    if !without.is_empty() {
        problems.push(format!(
            "Apps without the finalizer {finalizer}: {without:?}"
        ));
    }
    if module_events != n {
        problems.push(format!("{module_events} Event requests, not one per App"));
    }
    if !early.is_empty() {
        problems.push(format!(
            "a status computed before the children were seen was written for {} Apps: {early:?}",
            early.len()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}\nrequests: {requests:?}");
    without_the_host(&env, &apps, &reconciler, &finalizer).await?;
    env.passed()
}

/// With no host running (the one above has shut down): an App created now still gets
/// `reconciler`'s finalizer, which the API server adds by itself; once the WasmReconciler is
/// being deleted (nothing removes its own finalizer without a host), a created App does not.
async fn without_the_host(
    env: &TestEnv,
    apps: &Api<DynamicObject>,
    reconciler: &str,
    finalizer: &str,
) -> anyhow::Result<()> {
    let holds = |o: &DynamicObject| {
        o.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == finalizer)
    };
    let down = apps
        .create(&PostParams::default(), &app("created-while-no-host-runs")?)
        .await?;
    assert!(
        holds(&down),
        "an App created while no host runs lacks {finalizer}: {:?}",
        down.metadata.finalizers
    );
    let reconcilers: Api<wasmop::crd::WasmReconciler> = Api::all(env.client.clone());
    reconcilers
        .delete(reconciler, &kube::api::DeleteParams::default())
        .await?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // The API server's view of its parameter follows the deletion within moments.
    eventually(
        "a created App without the finalizer of a WasmReconciler being deleted",
        WAIT,
        || async {
            let probe = apps.create(&dry_run, &app("after-the-reconciler")?).await?;
            Ok((!holds(&probe)).then_some(()))
        },
    )
    .await
}

/// Waits until the API server adds the finalizer on creates of Apps: a server-side dry-run
/// create (admission policies run on those, as mutating webhooks with `sideEffects: None`) comes back
/// holding `finalizer`. The host applies the configuration once its module is active; the API
/// server then picks it up from its watch.
async fn finalizer_added_on_create(
    apps: &Api<DynamicObject>,
    finalizer: &str,
) -> anyhow::Result<()> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    eventually(
        "a dry-run create of an App comes back with the finalizer",
        Duration::from_secs(120),
        || async {
            let probe = apps.create(&dry_run, &app("finalizer-probe")?).await?;
            let has = probe
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == finalizer);
            Ok(has.then_some(()))
        },
    )
    .await
}

/// The reads of children (Deployments, Services) by anyone but the control plane's own
/// components, whose users are `system:` ones. A fresh clone's `make test` counted 5 `GET
/// services` for 20 Apps with exactly one apply per child, so none was the host's (it reads a
/// child only after a create-only apply met a conflict). The likeliest reader is the
/// controller-manager's garbage collector, which reads an owner it has not observed yet: under
/// load, a new EndpointSlice's Service.
fn host_reads(reads: Vec<ChildRead>) -> Vec<ChildRead> {
    reads
        .into_iter()
        .filter(|r| !r.user.starts_with("system:"))
        .collect()
}

/// Every Event (events.k8s.io/v1) in namespace `ns`.
async fn events_of(
    client: &Client,
    ns: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default()).await?.items)
}
