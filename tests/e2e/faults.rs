//! Faults of the cluster: the host (a real `wasmop run` process) rides out kube-apiserver
//! crashing and staying down for 20 s, etcd compacting its history under the host's watches,
//! being SIGKILLed itself in the middle of applying a 20-child set, and a competing writer
//! updating its primaries every 50 ms. In each case nothing is lost (children are neither
//! deleted nor duplicated: same uids, watch histories without DELETED), no finalizer is stuck,
//! the final status matches the last spec, and `/readyz` tells the truth meanwhile.
//!
//! Its faults (the API server down for 20 s, etcd compacted) would break any test sharing its
//! control plane: each test has a control plane of its own (`Plane::Fresh`), stopped when it
//! ends, and runs beside the other tests (`Turn::Shared`): what it asserts is what the objects
//! and the host's `/readyz` record, with waits generous enough for a loaded machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;
use wasmop_testenv::{HostProcess, Plane, TestEnv, Turn, eventually};

/// How long kube-apiserver stays down in the restart test.
const DOWN: Duration = Duration::from_secs(20);

/// A test's namespace on a control plane of its own.
async fn faults_env(prefix: &str) -> anyhow::Result<TestEnv> {
    TestEnv::with(prefix, Plane::Fresh, Turn::Shared).await
}

/// A host process serving `env`'s WasmReconcilers (with debug logs of the controller and of
/// kube's watchers, which the tests read), logging into `dir`.
async fn host(env: &TestEnv, dir: &Path) -> anyhow::Result<HostProcess> {
    host_with(env, dir, &[]).await
}

/// [`host`], with `extra` arguments of `wasmop run`.
async fn host_with(env: &TestEnv, dir: &Path, extra: &[&str]) -> anyhow::Result<HostProcess> {
    let bin = wasmop_binary().await?;
    let mut args = [
        "--log-format",
        "json",
        "run",
        "--kubeconfig",
        &env.kubeconfig().display().to_string(),
        "--selector",
        &format!("wasmop.dev/test={}", env.namespace),
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "127.0.0.1:0",
    ]
    .map(str::to_string)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    HostProcess::start(
        bin,
        args,
        "info,wasmop::controller=debug,kube_runtime::watcher=debug",
        dir,
    )
    .await
}

/// Waits until the host's `/readyz` answers `want` (200 or 503).
async fn readyz_becomes(host: &HostProcess, want: u16, within: Duration) -> anyhow::Result<()> {
    eventually(&format!("host /readyz answers {want}"), within, || async {
        let (status, _) = host.readyz().await?;
        Ok((status == want).then_some(()))
    })
    .await
}

fn app(name: &str, image: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": image, "replicas": 1, "port": 8080}
    }))?)
}

/// Creates App `name`, or (after a lost answer) finds it created.
async fn create_app(apps: &Api<DynamicObject>, name: &str, image: &str) -> anyhow::Result<()> {
    match apps
        .create(&PostParams::default(), &app(name, image)?)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets App `name`'s image (idempotent, so it can be retried after a lost answer).
async fn set_image(apps: &Api<DynamicObject>, name: &str, image: &str) -> anyhow::Result<()> {
    apps.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": image}})),
    )
    .await?;
    Ok(())
}

/// Every App converged to `want` (name -> image): its status reports the image, its Deployment
/// runs it, and it has exactly one Deployment and one Service, whose uids are returned.
/// How long convergence may take after a fault: watch backoff (up to 30 s), a relist, and the
/// reconciles of every primary, on a loaded 2-core machine. After an API server restart a
/// relist can meet 410 again (the restarted server's watch caches start at a later revision
/// than a list served before they are ready), each time after a backoff: 180 s was once not
/// enough in a cold `make test` (2026-11-27), while the test alone recovered within 165 s.
const RECOVER: Duration = Duration::from_secs(300);

async fn converged(
    client: &Client,
    ns: &str,
    want: &BTreeMap<String, String>,
) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let apps = apps(client, ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    // After an outage the watches come back on their own backoff (kube-runtime's, up to 30 s
    // between attempts) and then relist: allow for that, on a loaded machine.
    eventually("every App converged to its last spec", RECOVER, || async {
        let mut uids = BTreeMap::new();
        let ds = deployments.list(&ListParams::default()).await?.items;
        let ss = services.list(&ListParams::default()).await?.items;
        if ds.len() != want.len() || ss.len() != want.len() {
            return Ok(None);
        }
        for (name, image) in want {
            let a = apps.get(name).await?;
            if a.data["status"]["image"] != json!(image) {
                return Ok(None);
            }
            let Some(d) = ds.iter().find(|d| d.name_any() == *name) else {
                return Ok(None);
            };
            let running = d
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone());
            if running.as_deref() != Some(image.as_str()) {
                return Ok(None);
            }
            let Some(s) = ss.iter().find(|s| s.name_any() == *name) else {
                return Ok(None);
            };
            uids.insert(
                name.clone(),
                (d.uid().unwrap_or_default(), s.uid().unwrap_or_default()),
            );
        }
        Ok(Some(uids))
    })
    .await
}

/// Deletes every App and waits until they are gone (no finalizer stuck).
async fn delete_apps(client: &Client, ns: &str) -> anyhow::Result<()> {
    let apps = apps(client, ns);
    apps.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually("every App deleted (finalizers released)", WAIT, || async {
        Ok(apps
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Children created before a fault keep their uids: none was deleted and recreated.
fn same_uids(
    before: &BTreeMap<String, (String, String)>,
    after: &BTreeMap<String, (String, String)>,
) -> anyhow::Result<()> {
    for (name, uids) in before {
        anyhow::ensure!(
            after.get(name) == Some(uids),
            "the children of App {name} were replaced: before {uids:?}, after {:?}",
            after.get(name)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_down_for_20s_mid_run_every_primary_converges_to_its_last_spec()
-> anyhow::Result<()> {
    let env = faults_env("flt-api").await?;
    let ns = env.namespace.clone();
    updater(&env, "image-updater").await?;
    let dir = env.log_dir("host")?;
    let host = host(&env, &dir).await?;
    readyz_becomes(&host, 200, WAIT).await?;
    let apps = apps(&env.client, &ns);
    let mut want = BTreeMap::new();
    for i in 0..4 {
        create_app(&apps, &format!("app-{i}"), "nginx:1.0").await?;
        want.insert(format!("app-{i}"), "nginx:1.0".to_string());
    }
    let before = converged(&env.client, &ns, &want).await?;

    // A writer creating and editing Apps, before, during and after the outage: each write is
    // retried until it lands (creates and image edits are idempotent, so a write whose answer
    // was lost is retried safely), and the last image written to each App is recorded.
    let writer = {
        let apps = apps.clone();
        let mut want = want.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            for k in 1..=24u32 {
                let image = format!("nginx:1.{k}");
                let name = if k % 4 == 0 {
                    format!("app-{}", 3 + k / 4)
                } else {
                    format!("app-{}", k % 4)
                };
                loop {
                    let done = if want.contains_key(&name) {
                        set_image(&apps, &name, &image).await
                    } else {
                        create_app(&apps, &name, &image).await
                    };
                    match done {
                        Ok(()) => break,
                        Err(e) if started.elapsed() < 3 * WAIT => {
                            tracing::debug!(error = %e, "write failed; retrying");
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        Err(e) => return Err(e.context(format!("writing {name}"))),
                    }
                }
                want.insert(name, image);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok::<_, anyhow::Error>(want)
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let down = Instant::now();
    env.cp.stop_apiserver()?;
    // While the API server is down the host must say it is not ready.
    readyz_becomes(&host, 503, DOWN - Duration::from_secs(2))
        .await
        .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
    tokio::time::sleep(DOWN.saturating_sub(down.elapsed())).await;
    env.cp.start_apiserver().await?;
    readyz_becomes(&host, 200, WAIT).await?;
    let want = writer.await??;

    let after = converged(&env.client, &ns, &want)
        .await
        .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
    same_uids(&before, &after)?;
    delete_apps(&env.client, &ns).await?;
    env.passed()
}

/// The code of the first answer of a watch resuming from `rv` (an API server still
/// initialising its watch cache answers 429: asked again).
async fn watch_from(api: &Api<DynamicObject>, rv: &str) -> anyhow::Result<u16> {
    eventually(&format!("a watch from {rv} answers"), WAIT, || async {
        let code = watch_once(api, rv).await?;
        Ok((code != 429).then_some(code))
    })
    .await
}

/// The first event of a watch resuming from `rv`: Gone (410) after a compaction.
async fn watch_once(api: &Api<DynamicObject>, rv: &str) -> anyhow::Result<u16> {
    let mut stream = api
        .watch(&WatchParams::default(), rv)
        .await
        .map(|s| s.boxed());
    let first = match &mut stream {
        Ok(s) => s.try_next().await,
        Err(_) => Ok(None),
    };
    Ok(match (stream, first) {
        (Err(kube::Error::Api(e)), _) => e.code,
        (_, Ok(Some(WatchEvent::Error(e)))) => e.code,
        (_, Err(kube::Error::Api(e))) => e.code,
        (_, other) => anyhow::bail!("a watch from the compacted revision {rv} got {other:?}"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_forces_watches_to_relist_and_the_host_keeps_converging()
-> anyhow::Result<()> {
    let env = faults_env("flt-compact").await?;
    let ns = env.namespace.clone();
    updater(&env, "image-updater").await?;
    let dir = env.log_dir("host")?;
    let host = host(&env, &dir).await?;
    let apps = apps(&env.client, &ns);
    let mut want = BTreeMap::new();
    for i in 0..3 {
        create_app(&apps, &format!("app-{i}"), "nginx:1.0").await?;
        want.insert(format!("app-{i}"), "nginx:1.0".to_string());
    }
    let before = converged(&env.client, &ns, &want).await?;
    readyz_becomes(&host, 200, WAIT).await?;
    let old_rv = apps
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let watch_errors = |host: &HostProcess| {
        host.lines()
            .iter()
            .filter(|l| {
                l["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("kube_runtime::watcher"))
                    && l.to_string().contains("410")
            })
            .count()
    };
    let gone_before = watch_errors(&host);

    // The API server goes away (its watches with it), etcd's history is compacted past every
    // resourceVersion anyone has seen, and the API server comes back: every watch of the host
    // must resume from a compacted revision, get 410 Gone and relist.
    env.cp.stop_apiserver()?;
    let compacted = env.cp.compact_etcd().await?;
    env.cp.start_apiserver().await?;
    assert_eq!(
        watch_from(&apps, &old_rv).await?,
        410,
        "a watch from resourceVersion {old_rv} (compacted up to {compacted}) must be Gone"
    );
    eventually("the host's watchers saw 410 Gone", WAIT, || async {
        Ok((watch_errors(&host) > gone_before).then_some(()))
    })
    .await
    .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
    readyz_becomes(&host, 200, WAIT).await?;

    // New edits and a new App after the relist converge.
    for i in 0..3 {
        set_image(&apps, &format!("app-{i}"), "nginx:2.0").await?;
        want.insert(format!("app-{i}"), "nginx:2.0".to_string());
    }
    create_app(&apps, "app-3", "nginx:2.0").await?;
    want.insert("app-3".into(), "nginx:2.0".into());
    let after = converged(&env.client, &ns, &want)
        .await
        .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
    same_uids(&before, &after)?;
    delete_apps(&env.client, &ns).await?;
    env.passed()
}

/// What a watch saw happen to some objects: (event type, namespace/name, uid), in order.
type History = Arc<Mutex<Vec<(String, String, String)>>>;

/// Target namespaces of the SIGKILL test: applied 8 at a time, enough waves that a kill on the
/// first copy lands mid-apply.
const COPIES: usize = 60;

/// How many copies `selector` finds now.
async fn copies_now(client: &Client, selector: &str) -> anyhow::Result<usize> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .len())
}

/// Records every event of a watch on ConfigMaps labelled `selector`, in every namespace,
/// from the current resourceVersion, resumed whenever the server ends it; a watch error is
/// recorded as an event of type `ERROR`.
/// The receiver counts the ADDED events as they arrive.
async fn record(
    client: &Client,
    selector: &str,
) -> anyhow::Result<(History, tokio::sync::watch::Receiver<usize>)> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    let list = api.list(&ListParams::default().labels(selector)).await?;
    anyhow::ensure!(list.items.is_empty(), "copies exist before the test");
    let mut rv = list.metadata.resource_version.unwrap_or_default();
    let params = WatchParams::default().labels(selector).timeout(290);
    let history: History = Arc::default();
    let h = history.clone();
    let (added_tx, added_rx) = tokio::sync::watch::channel(0usize);
    let push = move |kind: &str, what: String, uid: String| {
        if let Ok(mut h) = h.lock() {
            h.push((kind.into(), what, uid));
        }
    };
    let mut stream = api.watch(&params, &rv).await?.boxed();
    tokio::spawn(async move {
        // A watch ends after its timeout: it is resumed where it stopped, so the history has
        // no gap; a resume that fails is recorded as an error.
        loop {
            while let Some(event) = stream.next().await {
                let (kind, o) = match event {
                    Ok(WatchEvent::Added(o)) => ("ADDED", o),
                    Ok(WatchEvent::Modified(o)) => ("MODIFIED", o),
                    Ok(WatchEvent::Deleted(o)) => ("DELETED", o),
                    Ok(WatchEvent::Bookmark(b)) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(e)) => {
                        push("ERROR", e.message, String::new());
                        continue;
                    }
                    Err(e) => {
                        push("ERROR", e.to_string(), String::new());
                        continue;
                    }
                };
                rv = o.resource_version().unwrap_or_default();
                if kind == "ADDED" {
                    added_tx.send_modify(|n| *n += 1);
                }
                let what = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
                push(kind, what, o.uid().unwrap_or_default());
            }
            match api.watch(&params, &rv).await {
                Ok(next) => stream = next.boxed(),
                Err(e) => {
                    push(
                        "ERROR",
                        format!("cannot resume the watch: {e}"),
                        String::new(),
                    );
                    return;
                }
            }
        }
    });
    Ok((history, added_rx))
}

/// Registers the configmap-propagator example for the test: CRD, module, a ServiceAccount with
/// the example's rights (cluster-scoped objects suffixed with the namespace), and the
/// WasmReconciler. Returns the WasmReconciler's name.
async fn configmap_propagator(env: &TestEnv) -> anyhow::Result<String> {
    let ns = env.namespace.as_str();
    let c = &env.client;
    install_crds(c).await?;
    apply_crds(
        c,
        yaml_docs(&repo().join("examples/configmap-propagator/k8s/crd.yaml"))?,
    )
    .await?;
    push_module(
        c,
        ns,
        "configmap-propagator",
        wasmop_test_modules::CONFIGMAP_PROPAGATOR,
    )
    .await?;
    let pp = PatchParams::apply("wasmop-e2e").force();
    let sa = "configmap-propagator";
    let name = format!("{sa}-{ns}");
    let subjects = json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}]);
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}
    }))?;
    Api::<ServiceAccount>::namespaced(c.clone(), ns)
        .patch(sa, &pp, &Patch::Apply(&account))
        .await?;
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["example.wasmop.dev"], "resources": ["configmappropagations"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch", "delete"]},
            {"apiGroups": ["example.wasmop.dev"], "resources": ["configmappropagations/status"], "verbs": ["update", "patch"]},
            {"apiGroups": ["example.wasmop.dev"], "resources": ["configmappropagations/finalizers"], "verbs": ["update"]}
        ]
    }))?;
    Api::<ClusterRole>::all(c.clone())
        .patch(&name, &pp, &Patch::Apply(&role))
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects
    }))?;
    Api::<ClusterRoleBinding>::all(c.clone())
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await?;
    let events: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": "default"},
        "rules": [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    }))?;
    Api::<Role>::namespaced(c.clone(), "default")
        .patch(&name, &pp, &Patch::Apply(&events))
        .await?;
    let events_binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects
    }))?;
    Api::<RoleBinding>::namespaced(c.clone(), "default")
        .patch(&name, &pp, &Patch::Apply(&events_binding))
        .await?;
    let mut wr = yaml_docs(&repo().join("examples/configmap-propagator/k8s/wasmreconciler.yaml"))?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the example's wasmreconciler.yaml is empty"))?;
    let wr_name = format!("{ns}-configmap-propagator");
    wr["metadata"] = json!({"name": wr_name, "labels": {"wasmop.dev/test": ns}});
    wr["spec"]["module"]["configMap"]["namespace"] = json!(ns);
    wr["spec"]["serviceAccount"] = json!({"namespace": ns, "name": sa});
    apply_reconciler(c, &wr).await?;
    Ok(wr_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_sigkilled_mid_apply_of_60_children_leaves_each_exactly_once_none_deleted()
-> anyhow::Result<()> {
    let env = faults_env("flt-kill").await?;
    let ns = env.namespace.clone();
    configmap_propagator(&env).await?;
    let key = "e2e.wasmop.dev/config";
    let targets: Vec<String> = (0..COPIES).map(|i| format!("{ns}-t{i:02}")).collect();
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    for t in &targets {
        let n: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": t, "labels": {key: ns}}
        }))?;
        namespaces.create(&PostParams::default(), &n).await?;
    }
    let source: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"example.wasmop.dev/propagate": "true"}},
        "data": {"log-level": "info"}
    }))?;
    env.api::<ConfigMap>()
        .create(&PostParams::default(), &source)
        .await?;
    let prop_name = format!("{ns}-settings");
    let selector = format!("example.wasmop.dev/propagation={prop_name}");
    let (history, mut added) = record(&env.client, &selector).await?;

    let dir = env.log_dir("host")?;
    // Five requests a second: the 60 copies take the host about 12 s, so the kill below, on the
    // first copy the watch delivers, lands mid-set however slowly this test is scheduled.
    let mut host = host_with(&env, &dir, &["--kube-qps", "5", "--kube-burst", "5"]).await?;
    readyz_becomes(&host, 200, WAIT).await?;
    let props: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.wasmop.dev", "v1", "ConfigMapPropagation"),
            "configmappropagations",
        ),
    );
    let prop: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "ConfigMapPropagation",
        "metadata": {"name": prop_name},
        "spec": {
            "source": {"namespace": ns, "name": "settings"},
            "namespaceSelector": {"matchLabels": {key: ns}},
        }
    }))?;
    props.create(&PostParams::default(), &prop).await?;

    // SIGKILL as soon as the watch delivers the first copy: the host is applying the set.
    tokio::time::timeout(WAIT, added.wait_for(|n| *n > 0))
        .await
        .map_err(|_| anyhow::anyhow!("no copy was created within {WAIT:?}"))??;
    host.kill().await?;
    let at_kill = copies_now(&env.client, &selector).await?;
    eprintln!("[faults] host SIGKILLed with {at_kill} of {COPIES} copies made");
    anyhow::ensure!(
        at_kill < COPIES,
        "the host was killed after the whole set was applied: the test proved nothing"
    );

    // Restarted, the host finishes the set; twice, to also restart from a complete set.
    for round in 0..2 {
        host.restart().await?;
        readyz_becomes(&host, 200, WAIT).await?;
        eventually("status: every target up to date, Ready", WAIT, || async {
            let p = props.get(&prop_name).await?;
            let s = &p.data["status"];
            let ready = s["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            Ok((s["targetCount"] == COPIES && s["upToDate"] == COPIES && ready).then_some(()))
        })
        .await
        .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
        if round == 0 {
            host.kill().await?;
        }
    }

    let copies: Api<ConfigMap> = Api::all(env.client.clone());
    let listed = copies
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let now: BTreeSet<String> = listed
        .iter()
        .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
        .collect();
    let expected: BTreeSet<String> = targets.iter().map(|t| format!("{t}/settings")).collect();
    assert_eq!(now, expected, "one copy in each target namespace");
    // The watch has delivered every event up to the copies listed once it holds each one's
    // creation: a copy deleted and made again would be listed with the uid of its second
    // creation, which comes after the deletion.
    let listed: BTreeSet<String> = listed.iter().filter_map(|c| c.uid()).collect();
    let history = eventually(
        "the watch caught up with the copies listed",
        WAIT,
        || async {
            let history = history.lock().map(|h| h.clone()).unwrap_or_default();
            let uids: BTreeSet<&String> = history.iter().map(|e| &e.2).collect();
            Ok(listed.iter().all(|u| uids.contains(u)).then_some(history))
        },
    )
    .await?;
    let bad: Vec<_> = history
        .iter()
        .filter(|e| e.0 == "DELETED" || e.0 == "ERROR")
        .collect();
    assert!(
        bad.is_empty(),
        "copies deleted (or the watch broke): {bad:?}"
    );
    let mut adds: BTreeMap<&str, usize> = BTreeMap::new();
    for e in history.iter().filter(|e| e.0 == "ADDED") {
        *adds.entry(e.1.as_str()).or_default() += 1;
    }
    assert!(
        adds.len() == COPIES && adds.values().all(|n| *n == 1),
        "each copy created exactly once: {adds:?}"
    );
    let uids: BTreeSet<&str> = history.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(
        uids.len(),
        COPIES,
        "one uid per copy over the whole history: {history:?}"
    );

    props.delete(&prop_name, &DeleteParams::default()).await?;
    for t in &targets {
        namespaces.delete(t, &DeleteParams::default()).await?;
    }
    env.passed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_writer_every_50ms_during_a_reconcile_storm_final_status_matches_last_spec()
-> anyhow::Result<()> {
    let env = faults_env("flt-race").await?;
    let ns = env.namespace.clone();
    updater(&env, "image-updater").await?;
    let dir = env.log_dir("host")?;
    // Every status written as computed (`--status-debounce 0s`): the storm is there to make
    // the host's writes conflict with the competing writer's, which held-back statuses (the
    // default debounce while a rollout is in flux) only make rarer.
    let host = host_with(&env, &dir, &["--status-debounce", "0s"]).await?;
    let apps = apps(&env.client, &ns);
    let mut want = BTreeMap::new();
    for i in 0..4 {
        create_app(&apps, &format!("app-{i}"), "nginx:1.0").await?;
        want.insert(format!("app-{i}"), "nginx:1.0".to_string());
    }
    let before = converged(&env.client, &ns, &want).await?;

    // For 10 s, every 50 ms, another writer changes one App (its image and an annotation),
    // and creates two more Apps midway: the host's status and finalizer writes, made on
    // resourceVersions that keep going stale, meet 409 Conflicts.
    let storm = Instant::now();
    let mut k = 0u32;
    while storm.elapsed() < Duration::from_secs(10) {
        k += 1;
        if k == 60 || k == 120 {
            let name = format!("app-{}", 3 + k / 60);
            create_app(&apps, &name, &format!("nginx:1.{k}")).await?;
            want.insert(name, format!("nginx:1.{k}"));
        }
        let i = k as usize % want.len();
        let name = want.keys().nth(i).cloned().unwrap_or_default();
        let image = format!("nginx:1.{k}");
        apps.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"e2e.wasmop.dev/write": k.to_string()}},
                "spec": {"image": image}
            })),
        )
        .await?;
        want.insert(name, image);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let after = converged(&env.client, &ns, &want)
        .await
        .map_err(|e| e.context(format!("host log:\n{}", host.log_text())))?;
    same_uids(&before, &after)?;
    let conflicts = host
        .lines()
        .iter()
        .filter(|l| {
            l["fields"]["message"] == "backing off"
                && l["fields"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("conflict"))
        })
        .count();
    assert!(
        conflicts > 0,
        "the storm caused no 409 Conflict in the host; the test proves nothing:\n{}",
        host.log_text()
    );
    readyz_becomes(&host, 200, WAIT).await?;
    delete_apps(&env.client, &ns).await?;
    env.passed()
}
