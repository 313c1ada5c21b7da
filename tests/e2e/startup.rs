//! Start-up, restarts and per-object bookkeeping, end to end on the real local control plane.
//!
//! - No reconcile before every watch has listed: configmap-propagator's copies survive abrupt
//!   host restarts, and a host that may not list Namespaces reports it on the WasmReconciler
//!   (`Ready=False`, reason `WatchFailed`, a Warning Event) and reconciles nothing until it may.
//! - Requests for primaries that no longer exist finish: after 50 Apps come and go, the work
//!   queue is empty and no per-object state is left.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::support::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop::host::{Host, HostOptions};
use wasmop_testenv::{TestEnv, eventually};

/// How many namespaces get a copy.
const COPIES: usize = 20;
/// How many abrupt restarts the copies must survive.
const RESTARTS: usize = 5;

fn apply() -> PatchParams {
    PatchParams::apply("wasmop-e2e").force()
}

/// Registers configmap-propagator with its own k8s/ files, rewritten for the test.
async fn register_propagator(env: &TestEnv) -> anyhow::Result<String> {
    let ns = env.namespace.as_str();
    install_crds(&env.client).await?;
    apply_crds(&env.client, example("configmap-propagator", "crd.yaml")?).await?;
    push_module(
        &env.client,
        ns,
        "configmap-propagator",
        wasmop_test_modules::CONFIGMAP_PROPAGATOR,
    )
    .await?;
    let sa = apply_rbac(env, "configmap-propagator").await?;
    let mut wr = example("configmap-propagator", "wasmreconciler.yaml")?.remove(0);
    let name = format!("{ns}-configmap-propagator");
    wr["metadata"] = json!({"name": name, "labels": {"wasmop.dev/test": ns}});
    wr["spec"]["module"]["configMap"]["namespace"] = json!(ns);
    wr["spec"]["serviceAccount"] = json!({"namespace": ns, "name": sa});
    apply_reconciler(&env.client, &wr).await?;
    Ok(name)
}

fn propagations(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.wasmop.dev", "v1", "ConfigMapPropagation"),
        "configmappropagations",
    );
    Api::all_with(client.clone(), &ar)
}

/// The copies of propagation `prop`: namespace -> uid.
async fn copies(client: &Client, prop: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let all: Api<ConfigMap> = Api::all(client.clone());
    Ok(all
        .list(&ListParams::default().labels(&format!("example.wasmop.dev/propagation={prop}")))
        .await?
        .items
        .into_iter()
        .filter_map(|c| Some((c.namespace()?, c.uid()?)))
        .collect())
}

/// The copies' DELETED events, recorded by a watch from now on.
fn record_deletions(client: &Client, prop: &str) -> Arc<Mutex<Vec<String>>> {
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let api: Api<ConfigMap> = Api::all(client.clone());
    let config =
        watcher::Config::default().labels(&format!("example.wasmop.dev/propagation={prop}"));
    let sink = deleted.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Delete(cm)) = event
                && let Ok(mut d) = sink.lock()
            {
                d.push(format!(
                    "{}/{}",
                    cm.namespace().unwrap_or_default(),
                    cm.name_any()
                ));
            }
        }
    });
    deleted
}

/// Creates COPIES namespaces labelled for the test, the source ConfigMap and the propagation.
async fn propagate(env: &TestEnv, prop: &str) -> anyhow::Result<()> {
    let ns = env.namespace.as_str();
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    for i in 0..COPIES {
        let n: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("{ns}-{i}"), "labels": {"e2e.wasmop.dev/startup": ns}}
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
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "ConfigMapPropagation",
        "metadata": {"name": prop},
        "spec": {
            "source": {"namespace": ns, "name": "settings"},
            "namespaceSelector": {"matchLabels": {"e2e.wasmop.dev/startup": ns}}
        }
    }))?;
    propagations(&env.client)
        .create(&PostParams::default(), &p)
        .await?;
    Ok(())
}

async fn cleanup(env: &TestEnv, prop: &str) -> anyhow::Result<()> {
    propagations(&env.client)
        .delete(prop, &DeleteParams::default())
        .await?;
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    for i in 0..COPIES {
        namespaces
            .delete(&format!("{}-{i}", env.namespace), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

async fn wait_for_copies(env: &TestEnv, prop: &str) -> anyhow::Result<BTreeMap<String, String>> {
    eventually(&format!("{COPIES} copies"), WAIT, || async {
        let have = copies(&env.client, prop).await?;
        Ok((have.len() == COPIES).then_some(have))
    })
    .await
}

#[tokio::test]
async fn copies_survive_abrupt_host_restarts() -> anyhow::Result<()> {
    let _serial = propagator_turn().await;
    let env = TestEnv::get("startup-restart").await?;
    let wr = register_propagator(&env).await?;
    let prop = format!("{}-settings", env.namespace);
    propagate(&env, &prop).await?;
    // A compiled-module cache, as a real host has: restarts load the module in milliseconds
    // instead of compiling it again on a loaded machine.
    let cache = tempfile::tempdir()?;
    let host = start_host(&env, Some(cache.path())).await?;
    let before = wait_for_copies(&env, &prop).await?;
    let deleted = record_deletions(&env.client, &prop);

    let mut host = Some(host);
    for round in 0..RESTARTS {
        // Abruptly: dropping the host aborts its manager (no graceful hand-over), and the next
        // host starts with empty caches.
        drop(host.take());
        // The dropped host's supervisor ends on its own (its stop channel closed), after its
        // running reconciles: the series it removes as it ends says no reconcile of that host
        // can start or finish any more, so the count taken then grows only by the next host's.
        eventually(
            &format!("the host dropped in round {round} stopped reconciling"),
            WAIT,
            || async {
                let serving = reconciler_metric("wasmop_module_info", &wr)?;
                let active = reconciler_metric("wasmop_reconcile_active", &wr)?;
                Ok((serving == 0.0 && active == 0.0).then_some(()))
            },
        )
        .await?;
        let reconciles = reconciler_metric("wasmop_reconcile_total", &wr)?;
        host = Some(start_host(&env, Some(cache.path())).await?);
        // The new host reconciled the propagation (its first reconcile is where an empty cache
        // would have pruned every copy).
        eventually(
            &format!("a reconcile after restart {round}"),
            WAIT * 2,
            || async {
                Ok((reconciler_metric("wasmop_reconcile_total", &wr)? > reconciles).then_some(()))
            },
        )
        .await?;
    }
    let after = copies(&env.client, &prop).await?;
    assert_eq!(
        after, before,
        "every copy kept its uid (none was deleted and recreated)"
    );
    let deleted = deleted.lock().map(|d| d.clone()).unwrap_or_default();
    assert!(deleted.is_empty(), "copies were deleted: {deleted:?}");
    if let Some(h) = host.take() {
        h.shutdown().await?;
    }
    cleanup(&env, &prop).await?;
    retire(&env, &wr).await?;
    env.passed()
}

/// A kubeconfig for the admin impersonating `user` (only `user`'s RBAC applies).
fn impersonating_kubeconfig(
    env: &TestEnv,
    user: &str,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let mut config = kube::config::Kubeconfig::read_from(env.kubeconfig())?;
    for auth in &mut config.auth_infos {
        if let Some(info) = auth.auth_info.as_mut() {
            info.impersonate = Some(user.to_string());
        }
    }
    std::fs::write(path, serde_json::to_vec(&config)?)?;
    Ok(())
}

/// What a host serving configmap-propagator needs, with or without reading Namespaces.
fn host_rules(namespaces: bool) -> Value {
    let mut rules = vec![
        json!({"apiGroups": ["wasmop.dev"], "resources": ["wasmreconcilers"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["wasmop.dev"], "resources": ["wasmreconcilers/status"], "verbs": ["get", "update", "patch"]}),
        json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}),
        json!({"apiGroups": ["example.wasmop.dev"], "resources": ["configmappropagations"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}),
    ];
    if namespaces {
        rules.push(json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}));
    }
    Value::Array(rules)
}

async fn grant_host(env: &TestEnv, user: &str, namespaces: bool) -> anyhow::Result<()> {
    let name = user.to_string();
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": host_rules(namespaces)
    }))?;
    Api::<ClusterRole>::all(env.client.clone())
        .patch(&name, &apply(), &Patch::Apply(&role))
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .patch(&name, &apply(), &Patch::Apply(&binding))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_host_that_may_not_list_namespaces_says_so_and_prunes_nothing() -> anyhow::Result<()> {
    let _serial = propagator_turn().await;
    let env = TestEnv::get("startup-denied").await?;
    let wr = register_propagator(&env).await?;
    let prop = format!("{}-settings", env.namespace);
    propagate(&env, &prop).await?;
    // A host with every right first makes the copies.
    let host = start_host(&env, None).await?;
    let before = wait_for_copies(&env, &prop).await?;
    // Gracefully: no reconcile of this host may finish after the count below is taken.
    host.shutdown().await?;
    let deleted = record_deletions(&env.client, &prop);

    // Then a host whose own identity may not list Namespaces.
    let user = format!("e2e-host-{}", env.namespace);
    grant_host(&env, &user, false).await?;
    let kubeconfig = std::env::temp_dir().join(format!("wasmop-e2e-{user}.kubeconfig"));
    impersonating_kubeconfig(&env, &user, &kubeconfig)?;
    let reconciles = reconciler_metric("wasmop_reconcile_total", &wr)?;
    let host = Host::start(HostOptions {
        kubeconfig: Some(kubeconfig.clone()),
        selector: Some(format!("wasmop.dev/test={}", env.namespace)),
        instance: format!("e2e-{}", env.namespace),
        ..HostOptions::default()
    })
    .await?;
    let (_, _, message) = eventually("Ready=False, WatchFailed", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(status, reason, _)| status == "False" && reason == "WatchFailed"))
    })
    .await?;
    assert!(
        message.contains("v1/Namespace") && message.contains("Forbidden"),
        "{message}"
    );
    eventually("a Warning Event WatchFailed", WAIT, || async {
        Ok(cluster_events(&env.client, &wr)
            .await?
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("WatchFailed")
            })
            .map(|_| ()))
    })
    .await?;
    // The owned ConfigMaps and the primaries are listed by now, yet no reconcile ran.
    assert_eq!(
        reconciler_metric("wasmop_reconcile_total", &wr)?,
        reconciles,
        "no reconcile while the Namespace watch cannot list"
    );

    // Granted: the watch recovers, the reconciler is Ready and reconciles, nothing is lost.
    grant_host(&env, &user, true).await?;
    wait_wr_ready(&env.client, &wr).await?;
    eventually("a reconcile once the watch recovered", WAIT, || async {
        Ok((reconciler_metric("wasmop_reconcile_total", &wr)? > reconciles).then_some(()))
    })
    .await?;
    assert_eq!(
        copies(&env.client, &prop).await?,
        before,
        "no copy was replaced"
    );
    let deleted = deleted.lock().map(|d| d.clone()).unwrap_or_default();
    assert!(deleted.is_empty(), "copies were deleted: {deleted:?}");
    host.shutdown().await?;
    let _ = std::fs::remove_file(&kubeconfig);
    cleanup(&env, &prop).await?;
    retire(&env, &wr).await?;
    env.passed()
}

fn app(name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
    }))?)
}

#[tokio::test]
async fn requests_for_deleted_primaries_finish_and_free_their_state() -> anyhow::Result<()> {
    let env = TestEnv::get("startup-gone").await?;
    let (wr, _) = updater(&env, "gone").await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = env.api();
    let n = 50;
    for i in 0..n {
        apps.create(&PostParams::default(), &app(&format!("app-{i}"))?)
            .await?;
    }
    // 50 objects on a loaded machine: longer than the one-object wait.
    eventually(&format!("{n} Deployments"), WAIT * 3, || async {
        let count = deployments.list(&ListParams::default()).await?.items.len();
        Ok((count == n).then_some(()))
    })
    .await?;
    for i in 0..n {
        apps.delete(&format!("app-{i}"), &DeleteParams::default())
            .await?;
    }
    // The Apps go (finalize drains them), then the garbage collector deletes their
    // Deployments, whose events request reconciles of Apps that no longer exist.
    eventually("every App and Deployment gone", WAIT * 3, || async {
        let a = apps.list(&ListParams::default()).await?.items.len();
        let d = deployments.list(&ListParams::default()).await?.items.len();
        Ok((a == 0 && d == 0).then_some(()))
    })
    .await?;
    eventually("the work queue empty", WAIT, || async {
        Ok((reconciler_metric("wasmop_workqueue_depth", &wr)? == 0.0).then_some(()))
    })
    .await?;
    eventually("no per-object state left", WAIT, || async {
        Ok((wasmop::controller::tracked_objects(&wr) == Some(0)).then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_reconciler_whose_service_account_may_not_read_a_related_kind_is_refused()
-> anyhow::Result<()> {
    let env = TestEnv::get("startup-reads").await?;
    // The host (admin here) could read Secrets; the module's ServiceAccount may not.
    let (wr, _) = image_updater(
        &env,
        "secrets",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"related": [{"apiVersion": "v1", "kind": "Secret"}]}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    let (_, _, message) = eventually("Ready=False, ReadNotAllowed", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(status, reason, _)| status == "False" && reason == "ReadNotAllowed"))
    })
    .await?;
    let sa = format!("{}/secrets", env.namespace);
    assert!(
        message.contains(&format!(
            "{sa} may not list v1/Secret (secrets) in namespace"
        )) && message.contains("grant it"),
        "{message}"
    );
    eventually("a Warning Event ReadNotAllowed", WAIT, || async {
        Ok(cluster_events(&env.client, &wr)
            .await?
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("ReadNotAllowed")
            })
            .map(|_| ()))
    })
    .await?;
    // Granted reads: the reconciler starts.
    let mut rules = image_updater_rules(true);
    if let Some(r) = rules.as_array_mut() {
        r.push(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]}));
    }
    service_account(&env.client, &env.namespace, "secrets", rules).await?;
    wait_wr_ready(&env.client, &wr).await?;
    host.shutdown().await?;
    env.passed()
}

/// A client of the admin impersonating `user`.
async fn client_as(env: &TestEnv, user: &str) -> anyhow::Result<Client> {
    let mut kc = kube::config::Kubeconfig::read_from(env.kubeconfig())?;
    for auth in &mut kc.auth_infos {
        if let Some(info) = auth.auth_info.as_mut() {
            info.impersonate = Some(user.to_string());
        }
    }
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(Client::try_from(config)?)
}

/// Creates (or, with `dry_run`, tries) WasmReconciler `wr` as `client`.
async fn create_reconciler(client: &Client, wr: &Value, dry_run: bool) -> kube::Result<()> {
    let api: Api<wasmop::crd::WasmReconciler> = Api::all(client.clone());
    let object: wasmop::crd::WasmReconciler =
        serde_json::from_value(wr.clone()).map_err(kube::Error::SerdeError)?;
    let pp = PostParams {
        dry_run,
        ..PostParams::default()
    };
    api.create(&pp, &object).await.map(|_| ())
}

#[tokio::test]
async fn only_users_who_may_impersonate_the_service_account_create_reconcilers()
-> anyhow::Result<()> {
    let env = TestEnv::get("startup-vap").await?;
    let ns = env.namespace.clone();
    install_crds(&env.client).await?;
    // The shipped policy, bound to this test's WasmReconcilers only (other tests run alongside).
    let mut docs = yaml_docs(&repo().join("deploy/admission-policy.yaml"))?;
    anyhow::ensure!(
        docs.len() == 2,
        "deploy/admission-policy.yaml: policy and binding"
    );
    let policy_name = format!("wasmop-reconciler-identity-{ns}");
    docs[0]["metadata"]["name"] = json!(policy_name);
    docs[1]["metadata"]["name"] = json!(policy_name);
    docs[1]["spec"]["policyName"] = json!(policy_name);
    docs[1]["spec"]["matchResources"] =
        json!({"objectSelector": {"matchLabels": {"wasmop.dev/test": ns}}});
    let policies = Api::<DynamicObject>::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
            ),
            "validatingadmissionpolicies",
        ),
    );
    let bindings = Api::<DynamicObject>::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
            ),
            "validatingadmissionpolicybindings",
        ),
    );
    policies
        .patch(&policy_name, &apply(), &Patch::Apply(&docs[0]))
        .await?;
    bindings
        .patch(&policy_name, &apply(), &Patch::Apply(&docs[1]))
        .await?;

    // A user who may create WasmReconcilers, but not impersonate the module's ServiceAccount.
    let user = format!("e2e-creator-{ns}");
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": user},
        "rules": [{"apiGroups": ["wasmop.dev"], "resources": ["wasmreconcilers"],
                   "verbs": ["get", "list", "create", "update", "patch"]}]
    }))?;
    Api::<ClusterRole>::all(env.client.clone())
        .patch(&user, &apply(), &Patch::Apply(&role))
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .patch(&user, &apply(), &Patch::Apply(&binding))
        .await?;
    service_account(&env.client, &ns, "module", widget_rules()).await?;
    let creator = client_as(&env, &user).await?;
    let wr = reconciler(
        &env,
        &format!("{ns}-vap"),
        "module",
        ("test.wasmop.dev/v1", "Widget"),
        &[("v1", "ConfigMap")],
        "module",
        json!({}),
    );

    // Policies load asynchronously: wait until a dry run is denied by this one.
    let denied = eventually("the policy denies the creator", WAIT, || async {
        Ok(match create_reconciler(&creator, &wr, true).await {
            Err(kube::Error::Api(s)) if s.message.contains("impersonate") => Some(s),
            _ => None,
        })
    })
    .await?;
    assert!(
        denied.message.contains(&format!("{ns}/module")) && denied.message.contains(&user),
        "{}",
        denied.message
    );
    let real = create_reconciler(&creator, &wr, false).await;
    assert!(
        matches!(&real, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422),
        "the create itself is denied: {real:?}"
    );

    // Allowed to impersonate exactly that ServiceAccount: admitted.
    let may: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "impersonate-module", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"],
                   "resourceNames": ["module"], "verbs": ["impersonate"]}]
    }))?;
    Api::<Role>::namespaced(env.client.clone(), &ns)
        .patch("impersonate-module", &apply(), &Patch::Apply(&may))
        .await?;
    let may_binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "impersonate-module", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "impersonate-module"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))?;
    Api::<RoleBinding>::namespaced(env.client.clone(), &ns)
        .patch("impersonate-module", &apply(), &Patch::Apply(&may_binding))
        .await?;
    eventually("the creator is admitted", WAIT, || async {
        Ok(create_reconciler(&creator, &wr, false).await.ok())
    })
    .await?;

    Api::<wasmop::crd::WasmReconciler>::all(env.client.clone())
        .delete(&format!("{ns}-vap"), &DeleteParams::default())
        .await?;
    bindings
        .delete(&policy_name, &DeleteParams::default())
        .await?;
    policies
        .delete(&policy_name, &DeleteParams::default())
        .await?;
    env.passed()
}
