//! The example reconcilers end to end, on the real local control plane, each registered with its
//! own `k8s/` files (CRD, RBAC, WasmReconciler) rewritten for the test's namespace. The host
//! impersonates the example's ServiceAccount, so these tests also prove the example's RBAC is
//! enough.
//!
//! - primary-replica: a 3-member Database with volumes (statically provisioned PersistentVolumes:
//!   the test cluster has no provisioner; the controller-manager's binder binds the claims),
//!   an upgrade that rolls the replicas before the primary, a downgrade refused by reconcile,
//!   and a deletion whose finalizer removes the volume claims.
//! - configmap-propagator: a cluster-scoped propagation copying a ConfigMap into labelled
//!   namespaces; relabelling prunes a copy, a source change reaches every copy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use crate::support::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Service,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop_testenv::{TestEnv, eventually};

/// Rollouts replace pods one at a time; give them longer than a single object.
const ROLLOUT: Duration = Duration::from_secs(120);

/// Registers an example with its own wasmreconciler.yaml, rewritten for the test: named and
/// labelled for the test's host, module and ServiceAccount in the test's namespace, and (for a
/// namespaced primary) serving only the test's namespace.
async fn register(env: &TestEnv, example_name: &str, module: &str) -> anyhow::Result<String> {
    let ns = env.namespace.as_str();
    install_crds(&env.client).await?;
    apply_crds(&env.client, example(example_name, "crd.yaml")?).await?;
    push_module(&env.client, ns, example_name, module).await?;
    let sa = apply_rbac(env, example_name).await?;
    let mut wr = example(example_name, "wasmreconciler.yaml")?.remove(0);
    let name = format!("{ns}-{example_name}");
    wr["metadata"] = json!({"name": name, "labels": {"wasmop.dev/test": ns}});
    wr["spec"]["module"]["configMap"]["namespace"] = json!(ns);
    wr["spec"]["serviceAccount"] = json!({"namespace": ns, "name": sa});
    if wr["spec"].get("namespaces").is_some() {
        wr["spec"]["namespaces"] = json!([ns]);
    }
    apply_reconciler(&env.client, &wr).await?;
    Ok(name)
}

fn custom(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.wasmop.dev", "v1", kind),
        plural,
    );
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn image(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

fn partition(sts: &StatefulSet) -> Option<i32> {
    sts.spec
        .update_strategy
        .as_ref()?
        .rolling_update
        .as_ref()?
        .partition
}

fn pod_image(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.containers.first()?.image.clone()
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The objects a watch delivered, in order (deletions included, as their last state).
struct History<K> {
    seen: Arc<Mutex<Vec<K>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: Clone> History<K> {
    fn seen(&self) -> Vec<K> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn stop(&self) {
        self.task.abort();
    }
}

/// Records every change `api` delivers from `from` (a resourceVersion, or the object whose
/// resourceVersion to start at) for objects matching the field and label selectors. A watch
/// the server ends is resumed from the last resourceVersion seen, so nothing is skipped.
fn record<K>(api: Api<K>, fields: &str, labels: &str, from: impl Into<StartAt>) -> History<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut params = WatchParams::default();
    if !fields.is_empty() {
        params = params.fields(fields);
    }
    if !labels.is_empty() {
        params = params.labels(labels);
    }
    let mut version = from.into().0;
    let out = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok(stream) = api.watch(&params, &version).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                let object = match event {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
                    WatchEvent::Bookmark(b) => {
                        version = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) => {
                        eprintln!("watch error: {e:?}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        break;
                    }
                };
                if let Some(rv) = object.resource_version() {
                    version = rv;
                }
                if let Ok(mut s) = out.lock() {
                    s.push(object);
                }
            }
        }
    });
    History { seen, task }
}

/// Where a watch starts: a resourceVersion.
struct StartAt(String);

impl From<String> for StartAt {
    fn from(rv: String) -> Self {
        StartAt(rv)
    }
}

impl From<StatefulSet> for StartAt {
    fn from(o: StatefulSet) -> Self {
        StartAt(o.resource_version().unwrap_or_default())
    }
}

/// The partitions a StatefulSet history went through on the 15.3 template, without repeats.
fn partition_history(seen: &[StatefulSet]) -> Vec<i32> {
    let mut out: Vec<i32> = Vec::new();
    for sts in seen {
        if image(sts).as_deref() == Some("postgres:15.3")
            && let Some(p) = partition(sts)
            && out.last() != Some(&p)
        {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn primary_replica_creates_upgrades_replicas_first_refuses_a_downgrade_and_cleans_volumes()
-> anyhow::Result<()> {
    let env = TestEnv::get("ex-db").await?;
    let ns = env.namespace.clone();
    register(
        &env,
        "primary-replica",
        wasmop_test_modules::PRIMARY_REPLICA,
    )
    .await?;

    // Three volumes for the three members' claims, in a class of this test's own.
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    for i in 0..3 {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("{ns}-{i}")},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": ns, "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": format!("/tmp/wasmop-e2e/{ns}/{i}")}
            }
        }))?;
        pvs.create(&PostParams::default(), &pv).await?;
    }

    let host = start_host(&env, None).await?;
    let dbs = custom(&env.client, Some(&ns), "Database", "databases");
    let mut db = example("primary-replica", "database.yaml")?.remove(0);
    db["metadata"]["namespace"] = json!(ns);
    db["spec"]["storage"]["storageClassName"] = json!(ns);
    let db: DynamicObject = serde_json::from_value(db)?;
    dbs.create(&PostParams::default(), &db).await?;

    let sets: Api<StatefulSet> = env.api();
    let services: Api<Service> = env.api();
    let cms: Api<ConfigMap> = env.api();
    let pods: Api<Pod> = env.api();
    let claims: Api<PersistentVolumeClaim> = env.api();

    let sts = eventually("the StatefulSet", WAIT, || async {
        Ok(sets.get_opt("orders").await?)
    })
    .await?;
    assert_eq!(
        sts.spec.pod_management_policy.as_deref(),
        Some("OrderedReady")
    );
    assert_eq!(partition(&sts), Some(0));
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.2"));
    let svc = eventually("the headless Service", WAIT, || async {
        Ok(services.get_opt("orders").await?)
    })
    .await?;
    assert_eq!(svc.spec.and_then(|s| s.cluster_ip).as_deref(), Some("None"));
    let roles = eventually("the roles ConfigMap", WAIT, || async {
        Ok(cms.get_opt("orders-roles").await?)
    })
    .await?;
    let data = roles.data.unwrap_or_default();
    assert_eq!(data.get("orders-0").map(String::as_str), Some("primary"));
    assert_eq!(data.get("orders-2").map(String::as_str), Some("replica"));

    let ready = |version: &'static str| {
        let dbs = dbs.clone();
        move || {
            let dbs = dbs.clone();
            async move {
                let d = dbs.get("orders").await?;
                let s = &d.data["status"];
                let ok = s["primary"] == "orders-0"
                    && s["readyReplicas"] == 3
                    && s["currentVersion"] == version
                    && s["phase"] == "Ready"
                    && s["observedGeneration"].as_i64() == d.metadata.generation;
                Ok(ok.then_some(d))
            }
        }
    };
    eventually(
        "3 Ready members on 15.2 in the status",
        ROLLOUT,
        ready("15.2"),
    )
    .await?;
    let bound = claims
        .list(&ListParams::default().labels("example.wasmop.dev/database=orders"))
        .await?
        .items;
    assert_eq!(bound.len(), 3, "a claim per member");

    // Upgrade. The order is read from what the cluster records: the StatefulSet's and the pods'
    // watch histories from just before the change (a watch delivers every change in the order
    // the API server committed them), never from which poll saw what first.
    let sts_history = record(
        sets.clone(),
        "metadata.name=orders",
        "",
        sets.get("orders").await?,
    );
    let members = "example.wasmop.dev/database=orders";
    let listed = pods.list(&ListParams::default().labels(members)).await?;
    let pod_history = record(
        pods.clone(),
        "",
        members,
        listed.metadata.resource_version.unwrap_or_default(),
    );
    dbs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"version": "15.3"}})),
    )
    .await?;
    eventually(
        "3 Ready members on 15.3 in the status",
        ROLLOUT,
        ready("15.3"),
    )
    .await?;
    // The rollout is done; wait until the watches have delivered its last steps.
    let partitions = eventually("the partition back at 0 on 15.3", WAIT, || async {
        let partitions = partition_history(&sts_history.seen());
        Ok((partitions.last() == Some(&0)).then_some(partitions))
    })
    .await?;
    let upgraded = eventually("every member Ready on 15.3", WAIT, || async {
        let seen = pod_history.seen();
        let upgraded: BTreeMap<String, usize> = ["orders-0", "orders-1", "orders-2"]
            .into_iter()
            .filter_map(|m| {
                let at = seen.iter().position(|p| {
                    p.name_any() == m
                        && pod_image(p).as_deref() == Some("postgres:15.3")
                        && pod_ready(p)
                })?;
                Some((m.to_string(), at))
            })
            .collect();
        Ok((upgraded.len() == 3).then_some((upgraded, seen)))
    })
    .await;
    let (upgraded, seen) = upgraded?;
    sts_history.stop();
    pod_history.stop();
    assert_eq!(
        partitions,
        [1, 0],
        "partition 1 (replicas) first, then 0 (the primary)"
    );
    let primary = upgraded["orders-0"];
    for replica in ["orders-1", "orders-2"] {
        assert!(
            upgraded[replica] < primary,
            "{replica} Ready on 15.3 before the primary, in the pods' watch history: {upgraded:?}"
        );
    }
    // Until both replicas were Ready on 15.3, the primary's pod kept 15.2.
    let replicas_done = upgraded["orders-1"].max(upgraded["orders-2"]);
    let early: Vec<Option<String>> = seen[..replicas_done]
        .iter()
        .filter(|p| p.name_any() == "orders-0")
        .map(pod_image)
        .collect();
    assert!(
        early.iter().all(|i| i.as_deref() == Some("postgres:15.2")),
        "the primary kept 15.2 while the replicas upgraded: {early:?}"
    );
    // Events are published off the reconcile's path, after the writes they tell of: waited for.
    for reason in ["UpgradingReplicas", "UpgradingPrimary"] {
        ns_event(&env.client, &ns, reason, |_| true).await?;
    }

    // A downgrade: the module refuses it (the host does not serve validate at admission yet),
    // the members keep 15.3 and the status says why.
    dbs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"version": "15.1"}})),
    )
    .await?;
    eventually("DowngradeRefused in the status", WAIT, || async {
        let d = dbs.get("orders").await?;
        let refused = d.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["reason"] == "DowngradeRefused")
        });
        Ok(refused.then_some(()))
    })
    .await?;
    ns_event(&env.client, &ns, "DowngradeRefused", |e| {
        e.type_.as_deref() == Some("Warning")
    })
    .await?;
    let sts = sets.get("orders").await?;
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.3"));

    // Deleting: finalize deletes the StatefulSet and the claims, then lets the Database go.
    dbs.delete("orders", &DeleteParams::default()).await?;
    eventually("the Database gone", ROLLOUT, || async {
        Ok(dbs.get_opt("orders").await?.is_none().then_some(()))
    })
    .await?;
    let left = claims
        .list(&ListParams::default().labels("example.wasmop.dev/database=orders"))
        .await?
        .items;
    assert!(left.is_empty(), "finalize removed the claims: {left:?}");
    // VolumesDeleted is published after the finalizer is released: it may trail the deletion.
    for reason in ["DeletingVolumes", "VolumesDeleted"] {
        ns_event(&env.client, &ns, reason, |_| true).await?;
    }
    eventually("the children garbage-collected", WAIT, || async {
        Ok((sets.get_opt("orders").await?.is_none()
            && services.get_opt("orders").await?.is_none()
            && cms.get_opt("orders-roles").await?.is_none())
        .then_some(()))
    })
    .await?;
    for i in 0..3 {
        pvs.delete(&format!("{ns}-{i}"), &DeleteParams::default())
            .await?;
    }
    host.shutdown().await?;
    env.passed()
}

fn namespace(name: &str, labels: Value) -> anyhow::Result<Namespace> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels}
    }))?)
}

/// The namespaces holding a copy of `name`.
async fn copies(client: &Client, name: &str, label: &str) -> anyhow::Result<Vec<String>> {
    let all: Api<ConfigMap> = Api::all(client.clone());
    let mut out: Vec<String> = all
        .list(&ListParams::default().labels(&format!("example.wasmop.dev/propagation={label}")))
        .await?
        .items
        .into_iter()
        .filter(|c| c.name_any() == name)
        .filter_map(|c| c.namespace())
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test]
async fn configmap_propagator_copies_into_matching_namespaces_prunes_and_follows_the_source()
-> anyhow::Result<()> {
    let _propagator = propagator_turn().await;
    let env = TestEnv::get("ex-cmp").await?;
    let ns = env.namespace.clone();
    let wr = register(
        &env,
        "configmap-propagator",
        wasmop_test_modules::CONFIGMAP_PROPAGATOR,
    )
    .await?;
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let key = "e2e.wasmop.dev/config";
    let (a, b, c) = (format!("{ns}-a"), format!("{ns}-b"), format!("{ns}-c"));
    for (name, value) in [(&a, ns.as_str()), (&b, ns.as_str()), (&c, "other")] {
        namespaces
            .create(
                &PostParams::default(),
                &namespace(name, json!({key: value}))?,
            )
            .await?;
    }
    let cms: Api<ConfigMap> = env.api();
    let source: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"example.wasmop.dev/propagate": "true"}},
        "data": {"log-level": "info", "region": "us-east-1"}
    }))?;
    cms.create(&PostParams::default(), &source).await?;

    let host = start_host(&env, None).await?;
    let props = custom(
        &env.client,
        None,
        "ConfigMapPropagation",
        "configmappropagations",
    );
    let prop_name = format!("{ns}-settings");
    let prop: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "ConfigMapPropagation",
        "metadata": {"name": prop_name},
        "spec": {
            "source": {"namespace": ns, "name": "settings"},
            "namespaceSelector": {"matchLabels": {key: ns}},
            "data": {"region": "eu-west-1"}
        }
    }))?;
    let created = props.create(&PostParams::default(), &prop).await?;

    let want_copies = |want: Vec<String>| {
        let client = env.client.clone();
        let prop_name = prop_name.clone();
        move || {
            let (client, want, prop_name) = (client.clone(), want.clone(), prop_name.clone());
            async move {
                let have = copies(&client, "settings", &prop_name).await?;
                Ok((have == want).then_some(()))
            }
        }
    };
    eventually(
        "copies in exactly the two labelled namespaces",
        WAIT,
        want_copies(vec![a.clone(), b.clone()]),
    )
    .await?;
    let in_a: Api<ConfigMap> = Api::namespaced(env.client.clone(), &a);
    let copy = in_a.get("settings").await?;
    let data = copy.data.clone().unwrap_or_default();
    assert_eq!(data.get("region").map(String::as_str), Some("eu-west-1"));
    assert_eq!(data.get("log-level").map(String::as_str), Some("info"));
    let owner = copy.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.first().map(|o| o.uid.clone()), created.uid());
    eventually("status: 2 targets, Ready", WAIT, || async {
        let p = props.get(&prop_name).await?;
        let s = &p.data["status"];
        let ready = s["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        Ok((s["targetCount"] == 2
            && s["targetNamespaces"] == json!([a, b])
            && s["upToDate"] == 2
            && ready)
            .then_some(()))
    })
    .await?;

    // b stops matching: its copy is pruned; c starts matching: it gets one.
    namespaces
        .patch(
            &b,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: "other"}}})),
        )
        .await?;
    eventually("b's copy pruned", WAIT, want_copies(vec![a.clone()])).await?;
    namespaces
        .patch(
            &c,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: ns}}})),
        )
        .await?;
    eventually(
        "c gets a copy",
        WAIT,
        want_copies(vec![a.clone(), c.clone()]),
    )
    .await?;

    // The source changes: every copy follows.
    cms.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"log-level": "debug"}})),
    )
    .await?;
    for target in [&a, &c] {
        let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), target);
        eventually(
            &format!("the copy in {target} follows the source"),
            WAIT,
            || async {
                let cm = api.get("settings").await?;
                Ok((cm
                    .data
                    .unwrap_or_default()
                    .get("log-level")
                    .map(String::as_str)
                    == Some("debug"))
                .then_some(()))
            },
        )
        .await?;
    }

    // The source goes: the copies stay and the status says why.
    cms.delete("settings", &DeleteParams::default()).await?;
    eventually("SourceFound=False", WAIT, || async {
        let p = props.get(&prop_name).await?;
        let missing = p.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "SourceFound"
                    && c["status"] == "False"
                    && c["reason"] == "SourceMissing"
            })
        });
        Ok(missing.then_some(()))
    })
    .await?;
    assert_eq!(
        copies(&env.client, "settings", &prop_name).await?,
        [a.clone(), c.clone()]
    );
    let (ready, _, _) = wr_condition(&env.client, &wr, "Ready")
        .await?
        .unwrap_or_default();
    assert_eq!(ready, "True", "the WasmReconciler serves");
    let (degraded, _, message) = wr_condition(&env.client, &wr, "Degraded")
        .await?
        .unwrap_or_default();
    assert_ne!(degraded, "True", "no forbidden write: {message}");

    // Deleting the propagation: the garbage collector deletes the copies (namespaced dependents
    // of a cluster-scoped owner).
    props.delete(&prop_name, &DeleteParams::default()).await?;
    eventually("the copies garbage-collected", WAIT, want_copies(vec![])).await?;
    for name in [&a, &b, &c] {
        namespaces.delete(name, &DeleteParams::default()).await?;
    }
    host.shutdown().await?;
    retire(&env, &wr).await?;
    env.passed()
}
