//! Hot swap of modules through ConfigMaps, end to end: a new module takes over without a failed
//! reconcile, a bad one is refused while the old one keeps serving, a failing one is rolled
//! back, and a restarted host loads compiled modules from its cache.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use wasmop::crd::WasmReconciler;
use wasmop_testenv::{TestEnv, eventually};

const FAILURE_REASONS: [&str; 6] = [
    "ModulePanicked",
    "ModuleError",
    "ModuleTrapped",
    "ModuleDeadlineExceeded",
    "InvalidIntents",
    "ApplyFailed",
];

/// The module-failure Events of the test's namespace, as `reason: note`.
async fn module_failures(env: &TestEnv) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for reason in FAILURE_REASONS {
        for e in events(&env.client, &env.namespace, reason).await? {
            failures.push(format!("{reason}: {}", e.note.unwrap_or_default()));
        }
    }
    Ok(failures)
}

async fn active_sha(client: &Client, wr: &str) -> anyhow::Result<Option<String>> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    Ok(api
        .get(wr)
        .await?
        .status
        .and_then(|s| s.active_module)
        .map(|m| m.sha256))
}

/// Waits until the status names `sha` as the active module: the status follows the swap (the
/// controller reconciles with a new module before the status write lands).
async fn wait_active(client: &Client, wr: &str, sha: &str) -> anyhow::Result<()> {
    eventually(&format!("{wr} serving {sha}"), WAIT, || async {
        Ok((active_sha(client, wr).await?.as_deref() == Some(sha)).then_some(()))
    })
    .await
}

fn revision(d: &Deployment) -> Option<String> {
    d.annotations()
        .get("example.wasmop.dev/module-revision")
        .cloned()
}

/// Waits (as `what`) until every Deployment of `names` exists with the module revision `rev`
/// (`None`: without the revision annotation).
async fn wait_revision(
    deployments: &Api<Deployment>,
    what: &str,
    names: &[String],
    rev: Option<&str>,
) -> anyhow::Result<()> {
    eventually(what, WAIT, || async {
        let mut ok = 0;
        for n in names {
            if deployments
                .get_opt(n)
                .await?
                .is_some_and(|d| revision(&d).as_deref() == rev)
            {
                ok += 1;
            }
        }
        Ok((ok == names.len()).then_some(()))
    })
    .await
}

#[tokio::test]
async fn v1_to_v2_swaps_without_failures_garbage_is_refused_and_v2_keeps_serving()
-> anyhow::Result<()> {
    let env = TestEnv::get("swap").await?;
    // A deadline no loaded machine meets by accident: the test is about the swap, and on a
    // CI machine starved of CPU a 500 ms call could time out (seen at a load of 30).
    let (wr, v1) = image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"limits": {"deadline": "30s", "memory": "64Mi", "concurrency": 4}}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    let names: Vec<String> = (1..=5).map(|i| format!("app-{i}")).collect();
    for name in &names {
        let app: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App", "metadata": {"name": name},
            "spec": {"image": "nginx:1.27", "replicas": 1}
        }))?;
        apps.create(&PostParams::default(), &app).await?;
    }
    let deployments: Api<Deployment> = env.api();
    wait_revision(
        &deployments,
        "five Deployments from v1, without the revision annotation",
        &names,
        None,
    )
    .await?;
    wait_active(&env.client, &wr, &v1).await?;

    // v2 annotates its children. Keep the Apps busy while it is pushed.
    let editor = {
        let apps = apps.clone();
        let names = names.clone();
        tokio::spawn(async move {
            for round in 0..20 {
                for n in &names {
                    let _ = apps.patch(n, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"e2e/round": round.to_string()}}}))).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let v2 = push_module(
        &env.client,
        &env.namespace,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER_V2,
    )
    .await?;
    wait_revision(
        &deployments,
        "every Deployment re-applied by v2",
        &names,
        Some("2"),
    )
    .await?;
    editor.await?;
    wait_active(&env.client, &wr, &v2).await?;
    // The lane publishes a failure's Event after its reconcile: read once it is empty.
    events_published(&wr).await?;
    let failures = module_failures(&env).await?;
    assert!(
        failures.is_empty(),
        "no reconcile failed during the swap: {failures:?}"
    );
    wr_event(&env.client, &wr, "ModuleSwapped").await?;

    // Garbage is refused; v2 keeps serving.
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
    let (_, reason, message) = eventually("ModuleLoaded=False for the garbage", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "ModuleLoaded")
            .await?
            .filter(|(s, _, _)| s == "False"))
    })
    .await?;
    assert_eq!(reason, "ModuleInvalid");
    assert!(
        message.contains("not a WebAssembly module") && message.contains("keeps serving"),
        "{message}"
    );
    let on_cm = eventually("a Warning Event on the ConfigMap", WAIT, || async {
        Ok(events(&env.client, &env.namespace, "ModuleInvalid")
            .await?
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ConfigMap")))
    })
    .await?;
    assert_eq!(on_cm.type_.as_deref(), Some("Warning"));
    assert_eq!(
        active_sha(&env.client, &wr).await?.as_deref(),
        Some(v2.as_str())
    );
    apps.patch(
        "app-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
    )
    .await?;
    eventually("v2 still reconciling after the refusal", WAIT, || async {
        Ok(deployments.get_opt("app-1").await?.filter(|d| {
            revision(d).as_deref() == Some("2")
                && d.spec
                    .template
                    .spec
                    .as_ref()
                    .and_then(|p| p.containers.first())
                    .and_then(|c| c.image.as_deref())
                    == Some("nginx:1.28")
        }))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

/// Whether App `app` has converged: its status observes its generation and says Available.
fn converged(app: &DynamicObject) -> bool {
    let status = &app.data["status"];
    let available = status["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True")
    });
    available && status["observedGeneration"].as_i64() == app.metadata.generation
}

/// `make demo`'s swap: an App that has converged after a rollout, nothing else changing, and a
/// new module pushed. The new module reaches its children without any change to the App.
#[tokio::test]
async fn a_swap_under_a_converged_app_reaches_its_children() -> anyhow::Result<()> {
    let env = TestEnv::get("swap-idle").await?;
    let (wr, v1) = updater(&env, "image-updater").await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &new_app("web", "nginx:1.27", 2))
        .await?;
    let converge = |what: &'static str| {
        let apps = apps.clone();
        async move {
            eventually(what, WAIT, || async {
                Ok(converged(&apps.get("web").await?).then_some(()))
            })
            .await
        }
    };
    converge("App web converged").await?;
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
    )
    .await?;
    converge("App web converged on nginx:1.28").await?;
    wait_active(&env.client, &wr, &v1).await?;

    let v2 = push_module(
        &env.client,
        &env.namespace,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER_V2,
    )
    .await?;
    wait_active(&env.client, &wr, &v2).await?;
    let deployments: Api<Deployment> = env.api();
    let web = ["web".to_string()];
    wait_revision(
        &deployments,
        "the Deployment re-applied by v2",
        &web,
        Some("2"),
    )
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_failing_new_module_is_rolled_back_and_not_retried() -> anyhow::Result<()> {
    let env = TestEnv::get("rollback").await?;
    let (wr, good, host) = rollback_setup(&env).await?;
    let widgets = widgets(&env.client, &env.namespace);

    let bad = push_module(
        &env.client,
        &env.namespace,
        "widgets",
        wasmop_test_modules::MISBEHAVE_FRAGILE,
    )
    .await?;
    let (_, reason, message) = eventually("the fragile module rolled back", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "ModuleLoaded")
            .await?
            .filter(|(_, r, _)| r == "RolledBack"))
    })
    .await?;
    assert_eq!(reason, "RolledBack");
    assert!(
        message.contains(&bad[..12]) && message.contains(&good[..12]),
        "names both digests: {message}"
    );
    let api: Api<WasmReconciler> = Api::all(env.client.clone());
    let status = api.get(&wr).await?.status.unwrap_or_default();
    assert_eq!(status.rejected_sha256.as_deref(), Some(bad.as_str()));
    assert_eq!(
        status.active_module.map(|m| m.sha256).as_deref(),
        Some(good.as_str())
    );
    // The Event follows the status write: wait for it rather than read once.
    let rolled = eventually("a RolledBack Warning Event", WAIT, || async {
        let events = cluster_events(&env.client, &wr).await?;
        Ok(events
            .iter()
            .any(|e| e.reason.as_deref() == Some("RolledBack"))
            .then_some(events))
    })
    .await?;
    assert!(
        rolled
            .iter()
            .filter(|e| e.reason.as_deref() == Some("RolledBack"))
            .all(|e| e.type_.as_deref() == Some("Warning")),
        "a rollback is told once, as a Warning: {rolled:?}"
    );

    // Not retried while the ConfigMap holds the same module.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        active_sha(&env.client, &wr).await?.as_deref(),
        Some(good.as_str())
    );
    // The good module serves the fragile widgets again.
    widgets
        .patch(
            "z-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "good", "touch": 1}})),
        )
        .await?;
    eventually("z-1 Ready under the good module", WAIT, || async {
        let w = widgets.get("z-1").await?;
        Ok((w.data["status"]["conditions"][0]["status"] == "True").then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_restarted_host_loads_the_module_from_its_compiled_cache() -> anyhow::Result<()> {
    let env = TestEnv::get("restart").await?;
    let (wr, _) =
        widget_reconciler(&env, "widgets", wasmop_test_modules::MISBEHAVE, json!({})).await?;
    let cache = tempfile_dir(&env.namespace)?;
    let source = |client: Client| {
        let wr = wr.clone();
        async move {
            let api: Api<WasmReconciler> = Api::all(client);
            anyhow::Ok(
                api.get(&wr)
                    .await?
                    .status
                    .and_then(|s| s.active_module)
                    .map(|m| (m.source, m.loaded_at)),
            )
        }
    };
    let first = start_host(&env, Some(&cache)).await?;
    let (src, loaded) =
        eventually("the module compiled", WAIT, || source(env.client.clone())).await?;
    assert_eq!(src, "compiled");
    first.shutdown().await?;
    // `loadedAt` has a resolution of one second: let it tell the two loads apart.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = start_host(&env, Some(&cache)).await?;
    let (src, _) = eventually("the module loaded again", WAIT, || async {
        Ok(source(env.client.clone())
            .await?
            .filter(|(_, at)| *at != loaded))
    })
    .await?;
    assert_eq!(src, "cache", "a restart skips compilation");
    let widgets = widgets(&env.client, &env.namespace);
    let w: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": "after"}, "spec": {}}),
    )?;
    widgets.create(&PostParams::default(), &w).await?;
    let cms: Api<ConfigMap> = env.api();
    eventually("the cached module reconciling", WAIT, || async {
        Ok(cms.get_opt("after-out").await?)
    })
    .await?;
    second.shutdown().await?;
    let _ = std::fs::remove_dir_all(&cache);
    env.passed()
}

fn tempfile_dir(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("wasmop-e2e-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
