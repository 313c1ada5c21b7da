//! A reconciler's lifecycle, end to end: deleting or narrowing a WasmReconciler releases the
//! finalizers it holds, two reconcilers never fight over one primary, a rollback survives a
//! restart and an edit, a busy host defers a swap rather than refusing it, and a follower serves the active module for admission after a refused
//! push.

use std::time::Duration;

use crate::support::*;
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;
use wasmop::crd::{WasmReconciler, finalizer_for};
use wasmop_testenv::{TestEnv, eventually};

/// How long a deleted App may take to go: once its WasmReconciler is deleted, the host keeps the
/// controller running for a 20 s grace (so a finalize under way can finish) before it releases
/// the finalizers anyway, and a loaded machine adds to that. Far above the expected wait.
const GONE: Duration = Duration::from_secs(120);

fn app(name: &str, finalizers: &[&str]) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
    }))?)
}

async fn status(client: &Client, wr: &str) -> anyhow::Result<wasmop::crd::WasmReconcilerStatus> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    Ok(api.get(wr).await?.status.unwrap_or_default())
}

#[tokio::test]
async fn deleting_the_reconciler_releases_its_primaries_and_migrates_the_old_finalizer()
-> anyhow::Result<()> {
    let env = TestEnv::get("life-delete").await?;
    let (wr, _) = updater(&env, "image-updater").await?;
    let own = finalizer_for(&wr);
    let apps = apps(&env.client, &env.namespace);
    // An App from before per-reconciler finalizers.
    apps.create(
        &PostParams::default(),
        &app("old", &["wasmop.dev/finalizer"])?,
    )
    .await?;
    let host = start_host(&env, None).await?;
    apps.create(&PostParams::default(), &app("web", &[])?)
        .await?;
    for name in ["web", "old"] {
        eventually(&format!("{name} holds only {own}"), WAIT, || async {
            let a = apps.get(name).await?;
            Ok((a.finalizers() == [own.clone()]).then_some(()))
        })
        .await?;
    }
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    assert!(
        wrs.get(&wr)
            .await?
            .finalizers()
            .iter()
            .any(|f| f == wasmop::crd::RECONCILER_FINALIZER)
    );

    // Delete the reconciler, then an App: neither stays stuck.
    wrs.delete(&wr, &DeleteParams::default()).await?;
    apps.delete("web", &DeleteParams::default()).await?;
    eventually("the App gone", GONE, || async {
        Ok(apps.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    eventually("the WasmReconciler gone", WAIT, || async {
        Ok(wrs.get_opt(&wr).await?.is_none().then_some(()))
    })
    .await?;
    let old = apps.get("old").await?;
    assert!(old.finalizers().is_empty(), "{:?}", old.finalizers());
    ns_event(&env.client, &env.namespace, "FinalizerReleased", |e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("old")
            && e.note.as_deref().is_some_and(|n| n.contains("was deleted"))
    })
    .await?;
    apps.delete("old", &DeleteParams::default()).await?;
    eventually("the old App gone", GONE, || async {
        Ok(apps.get_opt("old").await?.is_none().then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn narrowing_the_namespaces_releases_the_primaries_left_outside() -> anyhow::Result<()> {
    let env = TestEnv::get("life-narrow").await?;
    let (wr, _) = updater(&env, "image-updater").await?;
    let own = finalizer_for(&wr);
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &app("web", &[])?)
        .await?;
    eventually("the App holds the finalizer", WAIT, || async {
        Ok(apps
            .get("web")
            .await?
            .finalizers()
            .contains(&own)
            .then_some(()))
    })
    .await?;
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    wrs.patch(
        &wr,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"namespaces": ["elsewhere"]}})),
    )
    .await?;
    eventually("the App released", WAIT, || async {
        Ok(apps.get("web").await?.finalizers().is_empty().then_some(()))
    })
    .await?;
    apps.delete("web", &DeleteParams::default()).await?;
    eventually("the App gone", GONE, || async {
        Ok(apps.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    ns_event(&env.client, &env.namespace, "FinalizerReleased", |e| {
        e.note
            .as_deref()
            .is_some_and(|n| n.contains("no longer serves this namespace"))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

/// Namespace `ns`, where ServiceAccount `sa` of the test's namespace gets the rules of its Role
/// there (the set-up checks that it may read its primaries in every namespace it serves).
async fn grant_elsewhere(env: &TestEnv, ns: &str, sa: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let namespace: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )?;
    namespaces
        .patch(ns, &apply_params(), &Patch::Apply(&namespace))
        .await?;
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": sa, "namespace": ns}, "rules": image_updater_rules(true)
    }))?;
    Api::<Role>::namespaced(env.client.clone(), ns)
        .patch(sa, &apply_params(), &Patch::Apply(&role))
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": sa, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": env.namespace}]
    }))?;
    Api::<RoleBinding>::namespaced(env.client.clone(), ns)
        .patch(sa, &apply_params(), &Patch::Apply(&binding))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_conflict_loser_releases_its_finalizers_to_the_winner() -> anyhow::Result<()> {
    let env = TestEnv::get("life-yield").await?;
    let elsewhere = format!("{}-elsewhere", env.namespace);
    // Created first, for another namespace: no conflict yet.
    let (first, _) = image_updater(
        &env,
        "a-first",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"namespaces": [elsewhere]}),
    )
    .await?;
    let (second, _) = updater(&env, "b-second").await?;
    grant_elsewhere(&env, &elsewhere, "a-first").await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &app("web", &[])?)
        .await?;
    let (ours, theirs) = (finalizer_for(&first), finalizer_for(&second));
    eventually("the App holds the second's finalizer", WAIT, || async {
        Ok(apps
            .get("web")
            .await?
            .finalizers()
            .contains(&theirs)
            .then_some(()))
    })
    .await?;
    // The first widens over the second's namespace: the second loses its primaries.
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    wrs.patch(
        &first,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"namespaces": [elsewhere, env.namespace]}})),
    )
    .await?;
    let (_, reason, _) = eventually("the second one refused", WAIT, || async {
        Ok(wr_condition(&env.client, &second, "Ready")
            .await?
            .filter(|(s, _, _)| s == "False"))
    })
    .await?;
    assert_eq!(reason, "Conflict");
    eventually(
        "the first's finalizer replaces the second's",
        WAIT,
        || async {
            let held = apps.get("web").await?.finalizers().to_vec();
            Ok((held.contains(&ours) && !held.contains(&theirs)).then_some(()))
        },
    )
    .await?;
    // Only the winner holds the App now: deleting it is not stuck on the loser.
    apps.delete("web", &DeleteParams::default()).await?;
    eventually("the App gone", GONE, || async {
        Ok(apps.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    let lost = format!("lost its primaries to WasmReconciler {first}");
    ns_event(&env.client, &env.namespace, "FinalizerReleased", |e| {
        e.note.as_deref().is_some_and(|n| n.contains(&lost))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_second_reconciler_of_the_same_primaries_is_refused_and_nothing_flips()
-> anyhow::Result<()> {
    let env = TestEnv::get("life-conflict").await?;
    // Created in this order, and named so that the name agrees when both land in one second.
    let (first, _) = updater(&env, "a-first").await?;
    let (second, _) = updater(&env, "b-second").await?;
    let host = start_host(&env, None).await?;
    let (_, reason, message) = eventually("the second one refused", WAIT, || async {
        Ok(wr_condition(&env.client, &second, "Ready")
            .await?
            .filter(|(s, _, _)| s == "False"))
    })
    .await?;
    assert_eq!(reason, "Conflict");
    assert!(message.contains(&first), "names the winner: {message}");

    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &app("web", &[])?)
        .await?;
    let deployments: Api<Deployment> = env.api();
    let settled = eventually("the Deployment available", WAIT, || async {
        Ok(deployments.get_opt("web").await?.filter(|d| {
            d.status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0)
                == 1
        }))
    })
    .await?;
    let label = |d: &Deployment| d.labels().get("wasmop.dev/reconciler").cloned();
    assert_eq!(label(&settled).as_deref(), Some(first.as_str()));

    // Every write to the Deployment for 20 s, as the watch delivers them.
    let rv = settled.resource_version().unwrap_or_default();
    let stream = deployments
        .watch(&WatchParams::default().fields("metadata.name=web"), &rv)
        .await?;
    let mut changes = Vec::new();
    let window = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(window);
    tokio::pin!(stream);
    loop {
        tokio::select! {
            _ = &mut window => break,
            event = stream.try_next() => match event? {
                Some(WatchEvent::Modified(d)) => changes.push((d.resource_version(), label(&d))),
                Some(WatchEvent::Error(e)) => anyhow::bail!("watch failed: {e:?}"),
                Some(_) => {}
                None => break,
            },
        }
    }
    assert!(
        changes.len() < 5,
        "the Deployment kept changing: {changes:?}"
    );
    assert!(
        changes
            .iter()
            .all(|(_, l)| l.as_deref() == Some(first.as_str())),
        "only the first reconciler wrote it: {changes:?}"
    );
    // The refused one holds no finalizer on the App.
    let a = apps.get("web").await?;
    assert_eq!(a.finalizers(), [finalizer_for(&first)]);
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_rollback_survives_a_restart_and_an_edit() -> anyhow::Result<()> {
    let env = TestEnv::get("life-rollback").await?;
    let (wr, good, host) = rollback_setup(&env).await?;
    let widgets = widgets(&env.client, &env.namespace);
    let bad = push_module(
        &env.client,
        &env.namespace,
        "widgets",
        wasmop_test_modules::MISBEHAVE_FRAGILE,
    )
    .await?;
    eventually("the fragile module rolled back", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok((s.rejected_sha256.as_deref() == Some(bad.as_str())
            && s.active_module.as_ref().map(|m| m.sha256.as_str()) == Some(good.as_str()))
        .then_some(s))
    })
    .await?;
    let before = status(&env.client, &wr).await?;
    let loaded = before.active_module.map(|m| m.loaded_at);
    host.shutdown().await?;

    // Restart: the ConfigMap still holds the rolled-back module.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let host = start_host(&env, None).await?;
    let after = eventually("the module loaded again", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok(s.active_module
            .clone()
            .filter(|m| Some(&m.loaded_at) != loaded.as_ref())
            .map(|m| (m, s)))
    })
    .await?;
    assert_eq!(after.0.sha256, good, "the good module after a restart");
    assert_eq!(after.1.rejected_sha256.as_deref(), Some(bad.as_str()));

    // Edit the WasmReconciler: a new generation, set up again.
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    let edited = wrs
        .patch(
            &wr,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resyncPeriod": "4m"}})),
        )
        .await?;
    let generation = edited.metadata.generation;
    eventually("the edit observed", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok((s.observed_generation == generation
            && s.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == generation
            }))
        .then_some(()))
    })
    .await?;
    let s = status(&env.client, &wr).await?;
    assert_eq!(
        s.active_module.map(|m| m.sha256).as_deref(),
        Some(good.as_str()),
        "the good module after an edit"
    );
    // And it does serve: the fragile widgets reconcile (the bad module panics on them).
    widgets
        .patch(
            "z-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "good", "touch": 2}})),
        )
        .await?;
    eventually("z-1 reconciled at its new generation", WAIT, || async {
        let w = widgets.get("z-1").await?;
        let observed = w.data["status"]["observedGeneration"].as_i64();
        Ok((observed == w.metadata.generation
            && w.data["status"]["conditions"][0]["status"] == "True")
            .then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

/// The value of `wasmop_hotswap_total` for `reconciler` and `result` in this process.
fn hotswaps(reconciler: &str, result: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    let series =
        format!("wasmop_hotswap_total{{reconciler=\"{reconciler}\",result=\"{result}\"}} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0.0))
}

/// A ConfigMap update that holds the module already serving (a label, an annotation) keeps the
/// module it would roll back to: a rollback after it still returns to the good module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_with_the_same_module_keeps_the_rollback_target() -> anyhow::Result<()> {
    let env = TestEnv::get("life-same").await?;
    let (wr, good) = widget_reconciler(
        &env,
        "widgets",
        wasmop_test_modules::MISBEHAVE,
        json!({"rollout": {"watchReconciles": 8, "failureThresholdPercent": 50}}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    let widgets = widgets(&env.client, &env.namespace);
    let names = ["w-1", "w-2", "w-3", "w-4"];
    for name in names {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": {"mode": "good"}
        }))?;
        widgets.create(&PostParams::default(), &w).await?;
    }
    let cms: Api<ConfigMap> = env.api();
    eventually("the widgets reconciled", WAIT, || async {
        let mut n = 0;
        for w in names {
            n += usize::from(cms.get_opt(&format!("{w}-out")).await?.is_some());
        }
        Ok((n == names.len()).then_some(()))
    })
    .await?;
    // The fragile build handles every widget until one is labelled fragile.
    let bad = push_module(
        &env.client,
        &env.namespace,
        "widgets",
        wasmop_test_modules::MISBEHAVE_FRAGILE,
    )
    .await?;
    eventually("the fragile build active", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok((s.active_module.map(|m| m.sha256) == Some(bad.clone())).then_some(()))
    })
    .await?;
    // The same module, a new ConfigMap version.
    let unchanged = hotswaps(&wr, "unchanged")?;
    cms.patch(
        "widgets",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    eventually("the update seen as the same module", WAIT, || async {
        Ok((hotswaps(&wr, "unchanged")? > unchanged).then_some(()))
    })
    .await?;
    // Now the fragile build fails: it is rolled back, to the good module.
    for name in names {
        widgets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"test.wasmop.dev/fragile": "true"}}})),
            )
            .await?;
    }
    let s = eventually("the fragile build rolled back", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok((s.rejected_sha256.as_deref() == Some(bad.as_str())).then_some(s))
    })
    .await?;
    assert_eq!(
        s.active_module.map(|m| m.sha256).as_deref(),
        Some(good.as_str()),
        "rolled back to the good module"
    );
    host.shutdown().await?;
    env.passed()
}

/// A host too busy to run the self-check (its only sandbox slot held by another reconciler's
/// call) defers a new module instead of refusing it, and swaps it in once a slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_host_defers_the_self_check_and_swaps_once_a_sandbox_is_free() -> anyhow::Result<()>
{
    let env = TestEnv::get("life-deferred").await?;
    let (apps_wr, old) = image_updater(
        &env,
        "apps",
        wasmop_test_modules::IMAGE_UPDATER,
        false,
        json!({"limits": {"deadline": "2s"}}),
    )
    .await?;
    // The sleeper's calls hold the host's one slot for up to 90 s each.
    let (sleeper, _) = widget_reconciler(
        &env,
        "sleeper",
        wasmop_test_modules::MISBEHAVE,
        json!({"limits": {"deadline": "90s", "concurrency": 1}}),
    )
    .await?;
    let host = start_host_with(&env, |o| o.max_module_calls = 1).await?;
    for wr in [&apps_wr, &sleeper] {
        wait_wr_ready(&env.client, wr).await?;
    }
    let apps = apps(&env.client, &env.namespace);
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "metadata": {"name": "web"},
        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
    }))?;
    apps.create(&PostParams::default(), &app).await?;
    eventually("web reconciled", WAIT, || async {
        let a = apps.get("web").await?;
        Ok((a.data["status"]["image"] == json!("nginx:1.27")).then_some(()))
    })
    .await?;

    let widgets = widgets(&env.client, &env.namespace);
    let holder: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": "holder"},
        "spec": {"mode": "sleep", "sleepSeconds": 600}
    }))?;
    widgets.create(&PostParams::default(), &holder).await?;
    // The slot is taken: an App reconcile waits its 2 s deadline in the queue and gives up.
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
    )
    .await?;
    eventually("an App reconcile found no free slot", WAIT, || async {
        let busy = events(&env.client, &env.namespace, "SandboxBusy").await?;
        Ok((!busy.is_empty()).then_some(()))
    })
    .await?;

    // A new module now: its self-check cannot get the slot either. That is the host's
    // business, not the module's: the swap is deferred, never refused.
    let new = push_module(
        &env.client,
        &env.namespace,
        "apps",
        wasmop_test_modules::IMAGE_UPDATER_V2,
    )
    .await?;
    assert_ne!(new, old);
    eventually("the self-check deferred", WAIT, || async {
        let deferred = cluster_events(&env.client, &apps_wr).await?;
        Ok(deferred
            .iter()
            .any(|e| e.reason.as_deref() == Some("SelfCheckDeferred"))
            .then_some(()))
    })
    .await?;
    let loaded = wr_condition(&env.client, &apps_wr, "ModuleLoaded").await?;
    assert!(
        loaded
            .as_ref()
            .is_none_or(|(status, _, _)| status == "True"),
        "a deferred module is not refused: {loaded:?}"
    );

    // Free the slot: the holder's next call returns at once; the current one ends at its
    // deadline. The deferred swap is retried with backoff (at most 60 s apart) and goes through.
    widgets
        .patch(
            "holder",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "good"}})),
        )
        .await?;
    eventually(
        "the new module active",
        Duration::from_secs(300),
        || async {
            let s = status(&env.client, &apps_wr).await?;
            Ok((s.active_module.map(|m| m.sha256) == Some(new.clone())).then_some(()))
        },
    )
    .await?;
    let s = status(&env.client, &apps_wr).await?;
    assert_eq!(s.rejected_sha256, None, "the new module was never rejected");
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_follower_serves_the_active_module_after_a_refused_push() -> anyhow::Result<()> {
    let env = TestEnv::get("life-follower").await?;
    let (wr, good) = image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"admission": {"timeoutSeconds": 5, "failurePolicy": "Fail"}}),
    )
    .await?;
    let leader = start_host(&env, None).await?;
    eventually("the module active and copied", WAIT, || async {
        let s = status(&env.client, &wr).await?;
        Ok(
            (s.active_module.map(|m| m.sha256).as_deref() == Some(good.as_str())
                && s.module_copy.is_some())
            .then_some(()),
        )
    })
    .await?;
    // A push the leader refuses: the ConfigMap no longer holds the active module.
    let cms: Api<ConfigMap> = env.api();
    cms.patch(
        "image-updater",
        &PatchParams::apply("wasmop-e2e").force(),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "image-updater"},
            "binaryData": {"module.wasm": "bm90IGEgd2FzbSBtb2R1bGU="}
        })),
    )
    .await?;
    eventually("the push refused", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "ModuleLoaded")
            .await?
            .filter(|(s, r, _)| s == "False" && r == "ModuleInvalid"))
    })
    .await?;
    leader.shutdown().await?;

    // A replica that never leads.
    let follower = follower(&env, |_| {}).await?;
    let addr = follower
        .webhook_addr
        .ok_or_else(|| anyhow::anyhow!("the follower serves no webhook"))?;
    let app = app("web", &[])?;
    let response = follower_review(addr, &wr, &env.namespace, &app).await?;
    assert_eq!(
        response["response"]["allowed"],
        json!(true),
        "the follower judges with the active module: {response}"
    );
    let leases: Api<Lease> = env.api();
    assert_eq!(
        leases
            .get("held")
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .as_deref(),
        Some("someone-else"),
        "the follower never led"
    );
    follower.shutdown().await?;
    env.passed()
}
