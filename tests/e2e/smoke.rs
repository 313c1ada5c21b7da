//! Smoke tests proving the local control plane is a real one: CRDs with a status subresource,
//! Deployments whose pods become Ready (scheduler + kwok), ownerReference garbage collection
//! (controller-manager), and optimistic concurrency (409 on a stale resourceVersion).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::json;
use wasmop_testenv::{TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(60);

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> anyhow::Result<T> {
    Ok(serde_json::from_value(value)?)
}

#[tokio::test]
async fn crd_and_custom_resource_round_trip_with_status_subresource() -> anyhow::Result<()> {
    let env = TestEnv::get("smoke-crd").await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let crd: CustomResourceDefinition = from_json(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.smoke.wasmop.dev" },
        "spec": {
            "group": "smoke.wasmop.dev",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "properties": { "size": { "type": "integer", "minimum": 1 } } },
                        "status": { "type": "object", "properties": { "observedSize": { "type": "integer" } } }
                    }
                }}
            }]
        }
    }))?;
    crds.create(&PostParams::default(), &crd).await?;
    eventually("the Widget CRD to be Established", WAIT, || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("widgets.smoke.wasmop.dev").await?;
            let established = crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            Ok(established.then_some(()))
        }
    })
    .await?;

    let gvk = GroupVersionKind::gvk("smoke.wasmop.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.namespace, &ar);
    let widget: DynamicObject = from_json(json!({
        "apiVersion": "smoke.wasmop.dev/v1", "kind": "Widget",
        "metadata": { "name": "w1" },
        "spec": { "size": 3 },
        "status": { "observedSize": 99 }
    }))?;
    // The CRD may be Established a moment before its endpoint serves; retry the create briefly.
    let created = eventually("the Widget endpoint to accept a create", WAIT, || {
        let (widgets, widget) = (widgets.clone(), widget.clone());
        async move { Ok(Some(widgets.create(&PostParams::default(), &widget).await?)) }
    })
    .await?;
    assert_eq!(created.data["spec"]["size"], 3);
    assert!(
        created.data.get("status").is_none(),
        "status must be dropped on create with a status subresource"
    );
    let generation = created.metadata.generation;

    // Schema validation is enforced by the real apiserver.
    let invalid: DynamicObject = from_json(json!({
        "apiVersion": "smoke.wasmop.dev/v1", "kind": "Widget",
        "metadata": { "name": "w-invalid" }, "spec": { "size": 0 }
    }))?;
    let refused = widgets.create(&PostParams::default(), &invalid).await;
    assert!(
        matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 422),
        "expected 422, got {refused:?}"
    );

    let patched = widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "observedSize": 3 } })),
        )
        .await?;
    assert_eq!(patched.data["status"]["observedSize"], 3);
    assert_eq!(
        patched.metadata.generation, generation,
        "a status write must not bump the generation"
    );

    let respec = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 5 }, "status": { "observedSize": 1 } })),
        )
        .await?;
    assert_eq!(
        respec.data["status"]["observedSize"], 3,
        "the main endpoint must ignore status"
    );
    assert!(
        respec.metadata.generation > generation,
        "a spec change must bump the generation"
    );

    let read = widgets.get("w1").await?;
    assert_eq!(read.data["spec"]["size"], 5);
    assert_eq!(read.data["status"]["observedSize"], 3);
    crds.delete("widgets.smoke.wasmop.dev", &DeleteParams::default())
        .await?;
    env.passed()
}

#[tokio::test]
async fn deployment_pods_become_ready_on_kwok_nodes() -> anyhow::Result<()> {
    let env = TestEnv::get("smoke-deploy").await?;
    let deployments: Api<Deployment> = env.api();
    let deployment: Deployment = from_json(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "nginx:1.27" }] }
            }
        }
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    eventually("Deployment web to have 3 ready replicas", WAIT, || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("web").await?;
            let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
            Ok((ready == 3).then_some(()))
        }
    })
    .await?;

    let pods: Api<Pod> = env.api();
    let list = pods.list(&ListParams::default().labels("app=web")).await?;
    assert_eq!(list.items.len(), 3);
    for pod in &list.items {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(
            env.cp.nodes().contains(&node),
            "pod scheduled on {node:?}, expected a kwok node"
        );
        let status = pod.status.as_ref();
        assert_eq!(status.and_then(|s| s.phase.as_deref()), Some("Running"));
        assert!(
            status.and_then(|s| s.pod_ip.as_ref()).is_some(),
            "kwok assigns a pod IP"
        );
    }

    // A rolling update really rolls: a new ReplicaSet whose pods become Ready.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({ "spec": { "template": { "spec": { "containers": [{ "name": "web", "image": "nginx:1.28" }] } } } })),
        )
        .await?;
    eventually("the rollout to nginx:1.28 to complete", WAIT, || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("web").await?;
            let generation = d.metadata.generation.unwrap_or(0);
            let s = d.status.unwrap_or_default();
            let done = s.observed_generation == Some(generation)
                && s.updated_replicas == Some(3)
                && s.ready_replicas == Some(3)
                && s.replicas == Some(3);
            Ok(done.then_some(()))
        }
    })
    .await?;
    env.passed()
}

#[tokio::test]
async fn owner_reference_garbage_collection() -> anyhow::Result<()> {
    let env = TestEnv::get("smoke-gc").await?;
    let config_maps: Api<ConfigMap> = env.api();
    let owner = config_maps
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": "owner" }, "data": { "k": "v" } }))?,
        )
        .await?;
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    assert!(!uid.is_empty());
    for name in ["child-a", "child-b"] {
        config_maps
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": {
                        "name": name,
                        "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "controller": true, "blockOwnerDeletion": true }]
                    }
                }))?,
            )
            .await?;
    }
    config_maps
        .delete("owner", &DeleteParams::background())
        .await?;
    eventually(
        "the garbage collector to delete the owned ConfigMaps",
        WAIT,
        || {
            let config_maps = config_maps.clone();
            async move {
                let a = config_maps.get_opt("child-a").await?;
                let b = config_maps.get_opt("child-b").await?;
                Ok((a.is_none() && b.is_none()).then_some(()))
            }
        },
    )
    .await?;

    // Foreground deletion: the owner waits (with a finalizer) until its dependents are gone.
    let owner = config_maps
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": "owner2" } }))?,
        )
        .await?;
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    config_maps
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": {
                    "name": "child-c",
                    "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": uid, "blockOwnerDeletion": true }]
                }
            }))?,
        )
        .await?;
    config_maps
        .delete("owner2", &DeleteParams::foreground())
        .await?;
    eventually("foreground deletion of owner2 and child-c", WAIT, || {
        let config_maps = config_maps.clone();
        async move {
            let owner = config_maps.get_opt("owner2").await?;
            let child = config_maps.get_opt("child-c").await?;
            Ok((owner.is_none() && child.is_none()).then_some(()))
        }
    })
    .await?;
    env.passed()
}

#[tokio::test]
async fn stale_resource_version_is_a_409_conflict() -> anyhow::Result<()> {
    let env = TestEnv::get("smoke-409").await?;
    let config_maps: Api<ConfigMap> = env.api();
    config_maps
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": "cm" }, "data": { "n": "0" } }))?,
        )
        .await?;
    let stale = config_maps.get("cm").await?;
    let mut fresh = stale.clone();
    fresh.data = Some([("n".to_string(), "1".to_string())].into());
    let updated = config_maps
        .replace("cm", &PostParams::default(), &fresh)
        .await?;
    assert_ne!(
        updated.metadata.resource_version,
        stale.metadata.resource_version
    );

    let mut conflicting = stale.clone();
    conflicting.data = Some([("n".to_string(), "2".to_string())].into());
    match config_maps
        .replace("cm", &PostParams::default(), &conflicting)
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409, "expected 409 Conflict, got {status:?}");
            assert_eq!(status.reason, "Conflict");
        }
        other => panic!("an update with a stale resourceVersion must fail with 409, got {other:?}"),
    }
    assert_eq!(
        config_maps
            .get("cm")
            .await?
            .data
            .unwrap_or_default()
            .get("n")
            .map(String::as_str),
        Some("1")
    );
    env.passed()
}
