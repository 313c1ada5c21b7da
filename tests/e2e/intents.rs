//! Intents touch only what the module owns, on the real local control plane: deletes carry the
//! observed uid (a stale cache never deletes a recreated object), a finalize whose cleanup
//! failed keeps the finalizer, and a hostile module's patches and deletes of what it does not
//! own are refused whole with an `InvalidIntents` Warning, nothing touched.

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use wasmop::contract::{Action, Gvk, ObjectRef, Propagation};
use wasmop::controller::apply::{Applier, Observed};
use wasmop::controller::emit::{EventLane, Recorders};
use wasmop::controller::intents::{PreparedSet, Validated};
use wasmop::discovery::Discovery;
use wasmop_testenv::{TestEnv, eventually};

fn config_map(name: &str, data: Value, owner: Option<&ConfigMap>) -> anyhow::Result<ConfigMap> {
    let mut cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"wasmop.dev/reconciler": "stale"}},
        "data": data,
    });
    if let Some(owner) = owner {
        cm["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(),
            "uid": owner.uid().unwrap_or_default(), "controller": true,
        }]);
    }
    Ok(serde_json::from_value(cm)?)
}

fn dynamic(cm: &ConfigMap) -> anyhow::Result<DynamicObject> {
    let mut o: DynamicObject = serde_json::from_value(serde_json::to_value(cm)?)?;
    o.types = Some(kube::core::TypeMeta {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
    });
    Ok(o)
}

/// Deletes `name` and creates an object of the same name that the primary does not control.
async fn recreate_by_someone_else(cms: &Api<ConfigMap>, name: &str) -> anyhow::Result<ConfigMap> {
    cms.delete(name, &DeleteParams::default()).await?;
    eventually(&format!("{name} deleted"), WAIT, || async {
        Ok(cms.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    Ok(cms
        .create(
            &PostParams::default(),
            &config_map(name, json!({"who": "someone-else"}), None)?,
        )
        .await?)
}

/// The intent of child ConfigMap `name` of `owner` with `data`, as the applier gets it.
fn child_set(name: &str, data: Value, owner: &ConfigMap) -> anyhow::Result<PreparedSet> {
    let object = serde_json::to_value(config_map(name, data, Some(owner))?)?;
    Ok(PreparedSet {
        keep: Default::default(),
        kind: Gvk::new("v1", "ConfigMap"),
        namespaced: true,
        objects: vec![wasmop::controller::intents::PreparedChild {
            namespace: owner.namespace(),
            name: name.into(),
            object,
        }],
    })
}

/// A new child's first apply is its only request, on the real API server: it creates the child
/// under the field manager's Apply entry alone (so a field the module drops later is removed),
/// fails on a name someone else holds (the object untouched, the failure naming it), and
/// applies over a child of this primary that the cache has not caught up with.
#[tokio::test]
async fn a_new_childs_first_apply_creates_it_or_refuses_a_name_someone_else_holds()
-> anyhow::Result<()> {
    let env = TestEnv::get("intents-create").await?;
    let cms: Api<ConfigMap> = env.api();
    let owner = cms
        .create(
            &PostParams::default(),
            &config_map("owner", json!({}), None)?,
        )
        .await?;
    let discovery = Discovery::new(env.client.clone());
    let resolved = discovery.resolve(&Gvk::new("v1", "ConfigMap")).await?;
    let recorders = Recorders::new(
        &env.client,
        &Reporter {
            controller: "wasmop-e2e".into(),
            instance: None,
        },
    );
    let applier = Applier::new(
        env.client.clone(),
        env.client.clone(),
        "create",
        discovery,
        EventLane::start(recorders, "create", Default::default()),
    );
    let apply = |set: PreparedSet, observed: Vec<Observed>| {
        let (applier, resolved, owner) = (&applier, &resolved, &owner);
        async move {
            let primary = dynamic(owner)?;
            let validated = Validated {
                children: vec![set],
                ..Validated::default()
            };
            let report = applier
                .apply(&primary, resolved, &observed, validated, Default::default())
                .await;
            Ok::<_, anyhow::Error>(report)
        }
    };

    // A free name: created by the apply, under the Apply entry only.
    let report = apply(
        child_set("fresh", json!({"a": "1", "b": "2"}), &owner)?,
        vec![],
    )
    .await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!((report.applied, report.created.len()), (1, 1));
    let fresh = cms.get("fresh").await?;
    let managers: Vec<(String, String)> = fresh
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        managers,
        vec![("wasmop/create".to_string(), "Apply".to_string())]
    );
    // The module drops a field: the next apply removes it.
    let observed = vec![Observed {
        kind: Gvk::new("v1", "ConfigMap"),
        objects: vec![dynamic(&fresh)?],
    }];
    let report = apply(child_set("fresh", json!({"a": "1"}), &owner)?, observed).await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let data = cms.get("fresh").await?.data.unwrap_or_default();
    assert_eq!(data.keys().collect::<Vec<_>>(), vec!["a"], "{data:?}");

    // A name someone else holds: refused, their object untouched.
    let theirs = cms
        .create(
            &PostParams::default(),
            &config_map("held", json!({"who": "someone-else"}), None)?,
        )
        .await?;
    let report = apply(child_set("held", json!({"who": "owner"}), &owner)?, vec![]).await?;
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert!(
        report.failures[0].message.contains("already exists"),
        "{:?}",
        report.failures
    );
    assert!(report.created.is_empty());
    let after = cms.get("held").await?;
    assert_eq!(after.resource_version(), theirs.resource_version());
    assert!(after.owner_references().is_empty());

    // A child of this primary that the cache does not show yet: applied over.
    cms.create(
        &PostParams::default(),
        &config_map("mine", json!({"v": "1"}), Some(&owner))?,
    )
    .await?;
    let report = apply(child_set("mine", json!({"v": "2"}), &owner)?, vec![]).await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!((report.applied, report.created.len()), (1, 0));
    let data = cms.get("mine").await?.data.unwrap_or_default();
    assert_eq!(data.get("v").map(String::as_str), Some("2"));
    env.passed()
}

#[tokio::test]
async fn prunes_and_deletes_on_a_stale_observation_spare_an_object_recreated_under_the_same_name()
-> anyhow::Result<()> {
    let env = TestEnv::get("intents-stale").await?;
    let cms: Api<ConfigMap> = env.api();
    let owner = cms
        .create(
            &PostParams::default(),
            &config_map("owner", json!({}), None)?,
        )
        .await?;
    let discovery = Discovery::new(env.client.clone());
    let kind = Gvk::new("v1", "ConfigMap");
    let resolved = discovery.resolve(&kind).await?;
    let recorders = Recorders::new(
        &env.client,
        &Reporter {
            controller: "wasmop-e2e".into(),
            instance: None,
        },
    );
    let applier = Applier::new(
        env.client.clone(),
        env.client.clone(),
        "stale",
        discovery,
        EventLane::start(recorders, "stale", Default::default()),
    );

    // A prune of a child the cache still shows, after someone replaced it.
    let child = cms
        .create(
            &PostParams::default(),
            &config_map("pruned", json!({"who": "owner"}), Some(&owner))?,
        )
        .await?;
    let stale = vec![Observed {
        kind: kind.clone(),
        objects: vec![dynamic(&child)?],
    }];
    let recreated = recreate_by_someone_else(&cms, "pruned").await?;
    let report = applier
        .apply(
            &dynamic(&owner)?,
            &resolved,
            &stale,
            Validated {
                children: vec![PreparedSet {
                    keep: Default::default(),
                    kind: kind.clone(),
                    namespaced: true,
                    objects: vec![],
                }],
                ..Validated::default()
            },
            Default::default(),
        )
        .await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.pruned, 0, "nothing of ours was left to prune");
    let survivor = cms.get("pruned").await?;
    assert_eq!(
        survivor.uid(),
        recreated.uid(),
        "the prune deleted the object someone recreated under the child's name"
    );

    // A delete action aimed at an observed child, after someone replaced it.
    let child = cms
        .create(
            &PostParams::default(),
            &config_map("deleted", json!({"who": "owner"}), Some(&owner))?,
        )
        .await?;
    let stale = vec![Observed {
        kind: kind.clone(),
        objects: vec![dynamic(&child)?],
    }];
    let recreated = recreate_by_someone_else(&cms, "deleted").await?;
    let report = applier
        .apply(
            &dynamic(&owner)?,
            &resolved,
            &stale,
            Validated {
                actions: vec![Action::Delete {
                    target: ObjectRef {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        namespace: Some(env.namespace.clone()),
                        name: "deleted".into(),
                    },
                    propagation: Propagation::Background,
                }],
                ..Validated::default()
            },
            Default::default(),
        )
        .await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let survivor = cms.get("deleted").await?;
    assert_eq!(
        survivor.uid(),
        recreated.uid(),
        "the delete action removed the object someone recreated under the child's name"
    );
    env.passed()
}

/// Rules of the hostile guest's ServiceAccount: Widgets and their finalizers, Events, and on
/// ConfigMaps everything but `delete` unless `delete`.
fn hostile_rules(delete: bool) -> Value {
    let mut verbs = vec!["get", "list", "watch", "create", "update", "patch"];
    if delete {
        verbs.push("delete");
    }
    json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs},
        {"apiGroups": ["test.wasmop.dev"], "resources": ["widgets", "widgets/status", "widgets/finalizers"], "verbs": ["get", "list", "watch", "update", "patch", "delete"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
    ])
}

fn widget(name: &str, mode: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"mode": mode},
    }))?)
}

/// Whether the Widget holds a wasmop finalizer (named per reconciler: `wasmop.dev/<name>`).
fn has_finalizer(o: &DynamicObject) -> bool {
    o.finalizers().iter().any(|f| f.starts_with("wasmop.dev/"))
}

#[tokio::test]
async fn a_finalize_whose_cleanup_is_forbidden_keeps_the_finalizer_until_it_succeeds()
-> anyhow::Result<()> {
    let env = TestEnv::get("intents-finalize").await?;
    let (_, _) =
        widget_reconciler(&env, "hostile", wasmop_test_modules::HOSTILE, json!({})).await?;
    // The module's ServiceAccount may not delete ConfigMaps (yet).
    service_account(&env.client, &env.namespace, "hostile", hostile_rules(false)).await?;
    let host = start_host(&env, None).await?;
    let widgets = widgets(&env.client, &env.namespace);
    let cms: Api<ConfigMap> = env.api();
    widgets
        .create(&PostParams::default(), &widget("w", "finalize-delete")?)
        .await?;
    eventually("the child and the finalizer", WAIT, || async {
        let child = cms.get_opt("w-child").await?;
        let w = widgets.get("w").await?;
        Ok((child.is_some() && has_finalizer(&w)).then_some(()))
    })
    .await?;

    widgets.delete("w", &DeleteParams::default()).await?;
    let warning = eventually("a FinalizeIncomplete Warning", WAIT, || async {
        Ok(events(&env.client, &env.namespace, "FinalizeIncomplete")
            .await?
            .into_iter()
            .next())
    })
    .await?;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains("delete v1/ConfigMap") && note.contains("w-child"),
        "the Warning names the failed cleanup: {note}"
    );
    assert!(
        note.contains("wasmop.dev/"),
        "the Warning names the finalizer: {note}"
    );
    let w = widgets.get_opt("w").await?;
    assert!(
        w.as_ref().is_some_and(has_finalizer),
        "the finalizer went although the cleanup failed: {w:?}"
    );
    assert!(cms.get_opt("w-child").await?.is_some());

    // Granted the right, the next finalize cleans up and lets the Widget go.
    service_account(&env.client, &env.namespace, "hostile", hostile_rules(true)).await?;
    eventually("the Widget gone", WAIT, || async {
        Ok(widgets.get_opt("w").await?.is_none().then_some(()))
    })
    .await?;
    assert!(cms.get_opt("w-child").await?.is_none());
    host.shutdown().await?;
    env.passed()
}

/// Each attack of the hostile guest, and what its refusal says.
const ATTACKS: &[(&str, &[&str])] = &[
    (
        "module-config-map",
        &["actions[0] (merge-patch v1/ConfigMap hostile): not an observed child of this primary"],
    ),
    (
        "root-ca",
        &[
            "actions[0] (delete v1/ConfigMap kube-root-ca.crt): not an observed child of this primary",
        ],
    ),
    (
        "delete-victim",
        &["actions[0] (delete test.wasmop.dev/v1/Widget victim): not this primary"],
    ),
    (
        "strip-merge",
        &[
            "actions[0] (merge-patch test.wasmop.dev/v1/Widget strip-merge): the patch touches metadata.finalizers",
        ],
    ),
    (
        "strip-json",
        &[
            "actions[0] (json-patch test.wasmop.dev/v1/Widget strip-json): the patch touches \"/metadata/finalizers\"",
        ],
    ),
    (
        "event",
        &["events[0] (Forged): not an observed child of this primary"],
    ),
];

#[tokio::test]
async fn a_hostile_module_touches_nothing_it_does_not_own() -> anyhow::Result<()> {
    let env = TestEnv::get("intents-hostile").await?;
    let ns = env.namespace.clone();
    widget_reconciler(
        &env,
        "hostile",
        wasmop_test_modules::HOSTILE,
        json!({"config": {"moduleConfigMap": "hostile", "victim": "victim"}}),
    )
    .await?;
    service_account(&env.client, &ns, "hostile", hostile_rules(true)).await?;
    let cms: Api<ConfigMap> = env.api();
    let widgets = widgets(&env.client, &ns);
    let module_cm = cms.get("hostile").await?;
    let root_ca = eventually("kube-root-ca.crt", WAIT, || async {
        Ok(cms.get_opt("kube-root-ca.crt").await?)
    })
    .await?;
    let host = start_host(&env, None).await?;
    let victim = widgets
        .create(&PostParams::default(), &widget("victim", "good")?)
        .await?;
    eventually("the victim's child", WAIT, || async {
        Ok(cms.get_opt("victim-child").await?)
    })
    .await?;
    for (attack, _) in ATTACKS {
        let mut w = widget(attack, "hostile")?;
        w.data["spec"]["attack"] = json!(attack);
        widgets.create(&PostParams::default(), &w).await?;
    }

    for (attack, needles) in ATTACKS {
        let warning = eventually(
            &format!("an InvalidIntents Warning on {attack}"),
            WAIT,
            || async {
                Ok(events(&env.client, &ns, "InvalidIntents")
                    .await?
                    .into_iter()
                    .find(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*attack)
                    }))
            },
        )
        .await?;
        let note = warning.note.unwrap_or_default();
        for needle in *needles {
            assert!(
                note.contains(needle),
                "{attack}: missing {needle:?} in: {note}"
            );
        }
        let attacker = widgets.get(attack).await?;
        assert!(has_finalizer(&attacker), "{attack} stripped its finalizer");
        assert!(
            cms.get_opt(&format!("{attack}-child")).await?.is_none(),
            "{attack}: a refused response is refused whole, but its child was applied"
        );
    }
    let module_cm_now = cms.get("hostile").await?;
    assert_eq!(
        module_cm_now.resource_version(),
        module_cm.resource_version(),
        "the module's own ConfigMap was patched"
    );
    assert_eq!(
        cms.get("kube-root-ca.crt").await?.uid(),
        root_ca.uid(),
        "kube-root-ca.crt was deleted"
    );
    let victim_now = widgets.get("victim").await?;
    assert_eq!(victim_now.uid(), victim.uid(), "the victim was deleted");
    assert!(
        victim_now.metadata.deletion_timestamp.is_none(),
        "the victim is being deleted"
    );
    let forged = events(&env.client, &ns, "Forged").await?;
    assert!(
        forged.is_empty(),
        "an Event about kube-root-ca.crt was recorded: {forged:?}"
    );

    // Every Widget still goes when deleted (finalize is harmless in these modes).
    widgets
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await?;
    eventually("every Widget finalized", WAIT, || async {
        let left = widgets.list(&Default::default()).await?.items.len();
        Ok((left == 0).then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}
