//! The operator host end to end, on the real local control plane: a WasmReconciler registers the
//! image-updater module (loaded from a ConfigMap) for Apps; the host reconciles them under the
//! module's own ServiceAccount.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmop::host::Host;
use wasmop_testenv::{TestEnv, eventually};

fn container_image(d: &Deployment) -> Option<String> {
    d.spec
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

/// image-updater registered as `name` (allowed to write Services when `services`), a host,
/// and App `app` (nginx:1.27, one replica), once its Deployment exists (`what`). Returns the
/// host and the Apps and Deployments of the test's namespace.
async fn first_app(
    env: &TestEnv,
    name: &str,
    services: bool,
    app_name: &str,
    what: &str,
) -> anyhow::Result<(Host, Api<DynamicObject>, Api<Deployment>)> {
    image_updater(
        env,
        name,
        wasmop_test_modules::IMAGE_UPDATER,
        services,
        json!({}),
    )
    .await?;
    let host = start_host(env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &new_app(app_name, "nginx:1.27", 1))
        .await?;
    let deployments: Api<Deployment> = env.api();
    eventually(what, WAIT, || async {
        Ok(deployments.get_opt(app_name).await?)
    })
    .await?;
    Ok((host, apps, deployments))
}

#[tokio::test]
async fn an_app_becomes_a_deployment_and_a_service_rolls_out_and_is_finalized() -> anyhow::Result<()>
{
    let env = TestEnv::get("host-app").await?;
    let (_, sha) = updater(&env, "image-updater").await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    let created = apps
        .create(&PostParams::default(), &new_app("web", "nginx:1.27", 2))
        .await?;
    let deployments: Api<Deployment> = env.api();
    let services: Api<Service> = env.api();

    let d = eventually("the Deployment", WAIT, || async {
        Ok(deployments
            .get_opt("web")
            .await?
            .filter(|d| container_image(d).as_deref() == Some("nginx:1.27")))
    })
    .await?;
    let owner = d.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(
        owner[0].uid,
        created.uid().unwrap_or_default(),
        "the App controls its Deployment"
    );
    assert_eq!(owner[0].controller, Some(true));
    assert_eq!(
        d.labels().get("wasmop.dev/reconciler").map(String::as_str),
        Some(format!("{}-image-updater", env.namespace).as_str())
    );
    eventually("the Service", WAIT, || async {
        Ok(services.get_opt("web").await?)
    })
    .await?;

    // The status: ready replicas (pods made Ready by kwok) and the observed generation.
    let ready = |generation: i64, image: &'static str| {
        let apps = apps.clone();
        move || {
            let apps = apps.clone();
            async move {
                let a = apps.get("web").await?;
                let s = &a.data["status"];
                let ok = s["observedGeneration"] == json!(generation)
                    && s["readyReplicas"] == json!(2)
                    && s["image"] == json!(image)
                    && s["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Progressing" && c["status"] == "False")
                    });
                Ok(ok.then_some(a))
            }
        }
    };
    let generation = created.metadata.generation.unwrap_or(1);
    eventually(
        "status readyReplicas 2 at generation 1",
        WAIT,
        ready(generation, "nginx:1.27"),
    )
    .await?;

    // Changing the image rolls the Deployment out: a new ReplicaSet whose pods become Ready.
    let patched = apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
        )
        .await?;
    let rs: Api<ReplicaSet> = env.api();
    let pods: Api<Pod> = env.api();
    eventually(
        "a new ReplicaSet with Ready pods on nginx:1.28",
        WAIT,
        || async {
            let sets = rs
                .list(&ListParams::default().labels("app.kubernetes.io/name=web"))
                .await?
                .items;
            let new = sets.iter().find(|s| {
                s.spec
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|p| p.containers.first())
                    .and_then(|c| c.image.as_deref())
                    == Some("nginx:1.28")
            });
            let ready_new = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=web"))
                .await?
                .items
                .iter()
                .filter(|p| {
                    p.spec.as_ref().map(|s| s.containers[0].image.as_deref())
                        == Some(Some("nginx:1.28"))
                })
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count();
            Ok((sets.len() >= 2 && new.is_some() && ready_new == 2).then_some(()))
        },
    )
    .await?;
    eventually(
        "status at the new generation",
        WAIT,
        ready(patched.metadata.generation.unwrap_or(2), "nginx:1.28"),
    )
    .await?;
    ns_event(&env.client, &env.namespace, "RollingOut", |e| {
        e.note
            .as_deref()
            .is_some_and(|n| n.contains("nginx:1.27 -> nginx:1.28"))
    })
    .await?;

    // The WasmReconciler reports the module it serves (written with Ready, after the controller
    // started: wait for it rather than read once).
    let wr_name = format!("{}-image-updater", env.namespace);
    wait_wr_ready(&env.client, &wr_name).await?;
    let wr: wasmop::crd::WasmReconciler = Api::all(env.client.clone()).get(&wr_name).await?;
    assert_eq!(
        wr.status.and_then(|s| s.active_module).map(|m| m.sha256),
        Some(sha)
    );

    // Deleting runs finalize (it drains the Service first), then the garbage collector removes
    // the Deployment.
    assert!(
        apps.get("web")
            .await?
            .finalizers()
            .iter()
            .any(|f| *f == wasmop::crd::finalizer_for(&wr_name))
    );
    apps.delete("web", &DeleteParams::default()).await?;
    eventually("the App gone", WAIT, || async {
        Ok(apps.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    eventually("the children garbage-collected", WAIT, || async {
        Ok((deployments.get_opt("web").await?.is_none()
            && services.get_opt("web").await?.is_none())
        .then_some(()))
    })
    .await?;
    // "finalize deleted the Service" and "finalize said done". Drained is published after the
    // finalizer is released, so it may trail the App's deletion: waited for, not read once.
    for reason in ["Draining", "Drained"] {
        ns_event(&env.client, &env.namespace, reason, |_| true).await?;
    }
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_forbidden_write_is_a_warning_and_degrades_the_reconciler_while_the_rest_applies()
-> anyhow::Result<()> {
    let env = TestEnv::get("host-rbac").await?;
    let (host, _, _) = first_app(
        &env,
        "no-services",
        false,
        "web",
        "the Deployment applied despite the Service being forbidden",
    )
    .await?;
    let warning = eventually("a Forbidden Warning Event on the App", WAIT, || async {
        Ok(events(&env.client, &env.namespace, "Forbidden")
            .await?
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning")))
    })
    .await?;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains(&format!(
            "system:serviceaccount:{}:no-services",
            env.namespace
        )),
        "{note}"
    );
    assert!(note.contains("v1/Service"), "{note}");
    assert_eq!(
        warning.regarding.and_then(|r| r.name).as_deref(),
        Some("web")
    );
    let services: Api<Service> = env.api();
    assert!(
        services.get_opt("web").await?.is_none(),
        "RBAC, not the host, decides"
    );
    let wr_name = format!("{}-no-services", env.namespace);
    eventually("Degraded=True on the WasmReconciler", WAIT, || async {
        Ok(wr_condition(&env.client, &wr_name, "Degraded")
            .await?
            .filter(|(s, r, _)| s == "True" && r == "Forbidden"))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

/// Whether RBAC lets ServiceAccount `sa` of `ns` create Events (events.k8s.io) in `ns`: the
/// host's own SubjectAccessReview ([`wasmop::manager::access::review`]), which the authorizer
/// of the host's requests answers.
async fn may_create_events(client: &kube::Client, ns: &str, sa: &str) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    use k8s_openapi::api::events::v1::Event;
    use wasmop::manager::access::{Read, review};
    let read = Read {
        kind: wasmop::contract::Gvk::new("events.k8s.io/v1", "Event"),
        resolved: wasmop::discovery::Resolved {
            resource: kube::discovery::ApiResource::erase::<Event>(&()),
            namespaced: true,
        },
        namespace: Some(ns.to_string()),
    };
    let sa = wasmop::crd::ServiceAccountRef {
        namespace: ns.to_string(),
        name: sa.to_string(),
    };
    let reviewed = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review(&sa, &read, "create"))
        .await?;
    Ok(reviewed.status.is_some_and(|s| s.allowed))
}

#[tokio::test]
async fn refused_module_events_degrade_the_reconciler_until_an_event_is_published()
-> anyhow::Result<()> {
    let env = TestEnv::get("host-events").await?;
    let (ns, sa) = (env.namespace.clone(), "no-events");
    let (wr, _) = updater(&env, sa).await?;
    // The same Role without Events (applied by the same manager: the rule is removed).
    let mut rules = image_updater_rules(true);
    if let Some(rules) = rules.as_array_mut() {
        rules.retain(|r| r["apiGroups"][0] != "events.k8s.io");
    }
    service_account(&env.client, &ns, sa, rules).await?;
    eventually("RBAC refusing the Events", WAIT, || async {
        Ok((!may_create_events(&env.client, &ns, sa).await?).then_some(()))
    })
    .await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &ns);
    apps.create(&PostParams::default(), &new_app("web", "nginx:1.27", 1))
        .await?;
    let services: Api<Service> = env.api();
    eventually(
        "the Service, written despite the refused Event",
        WAIT,
        || async { Ok(services.get_opt("web").await?) },
    )
    .await?;
    let (_, _, message) = eventually("Degraded=True for the Events", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Degraded")
            .await?
            .filter(|(s, r, m)| s == "True" && r == "Forbidden" && m.contains("Events")))
    })
    .await?;
    assert!(
        message.contains(&format!("system:serviceaccount:{ns}:{sa}")),
        "{message}"
    );

    // Granted, the module's next Event (the rollout of a new image) is published and clears it.
    service_account(&env.client, &ns, sa, image_updater_rules(true)).await?;
    eventually("RBAC allowing the Events", WAIT, || async {
        Ok(may_create_events(&env.client, &ns, sa).await?.then_some(()))
    })
    .await?;
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
    )
    .await?;
    eventually(
        "Degraded=False once an Event is published",
        WAIT,
        || async {
            Ok(wr_condition(&env.client, &wr, "Degraded")
                .await?
                .filter(|(s, r, _)| s == "False" && r == "AllWritesAllowed"))
        },
    )
    .await?;
    ns_event(&env.client, &ns, "RollingOut", |_| true).await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_trapping_module_backs_off_while_other_objects_and_reconcilers_work() -> anyhow::Result<()>
{
    let env = TestEnv::get("host-trap").await?;
    install_crds(&env.client).await?;
    push_module(
        &env.client,
        &env.namespace,
        "misbehave",
        wasmop_test_modules::MISBEHAVE,
    )
    .await?;
    service_account(&env.client, &env.namespace, "misbehave", widget_rules()).await?;
    apply_reconciler(
        &env.client,
        &reconciler(
            &env,
            &format!("{}-widgets", env.namespace),
            "misbehave",
            ("test.wasmop.dev/v1", "Widget"),
            &[("v1", "ConfigMap")],
            "misbehave",
            json!({}),
        ),
    )
    .await?;
    updater(&env, "image-updater").await?;
    let host = start_host(&env, None).await?;

    let widgets = widgets(&env.client, &env.namespace);
    for (name, mode) in [("bad", "panic"), ("good", "good")] {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"mode": mode}
        }))?;
        widgets.create(&PostParams::default(), &w).await?;
    }
    apps(&env.client, &env.namespace)
        .create(&PostParams::default(), &new_app("web", "nginx:1.27", 1))
        .await?;

    let panicked = eventually(
        "a ModulePanicked Warning Event on the bad Widget",
        WAIT,
        || async {
            Ok(events(&env.client, &env.namespace, "ModulePanicked")
                .await?
                .into_iter()
                .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad")))
        },
    )
    .await?;
    assert!(
        panicked
            .note
            .as_deref()
            .is_some_and(|n| n.contains("deliberate panic while reconciling bad")),
        "{panicked:?}"
    );
    // Other objects of the same reconciler, and other reconcilers, keep working.
    let cms: Api<ConfigMap> = env.api();
    eventually("the good Widget's ConfigMap", WAIT, || async {
        Ok(cms.get_opt("good-out").await?)
    })
    .await?;
    let deployments: Api<Deployment> = env.api();
    eventually("the App's Deployment", WAIT, || async {
        Ok(deployments.get_opt("web").await?)
    })
    .await?;
    // Backoff: retried, but exponentially (5 ms doubling), not in a hot loop. Judged from what
    // the Events record (attempts and the time between the first and the last), not from how
    // long this test slept.
    let (attempts, span) = eventually("the bad Widget retried", WAIT, || async {
        let recorded: Vec<(i32, Option<Duration>)> =
            events(&env.client, &env.namespace, "ModulePanicked")
                .await?
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad"))
                .map(|e| {
                    let first = e.event_time.as_ref().map(|t| t.0.as_microsecond());
                    let last = e
                        .series
                        .as_ref()
                        .map(|s| s.last_observed_time.0.as_microsecond())
                        .or(first);
                    let span = first.zip(last).map(|(f, l)| {
                        Duration::from_micros(u64::try_from(l - f).unwrap_or_default())
                    });
                    (e.series.as_ref().map_or(1, |s| s.count), span)
                })
                .collect();
        let attempts: i32 = recorded.iter().map(|(n, _)| n).sum();
        let span = recorded.iter().filter_map(|(_, s)| *s).max();
        Ok((attempts >= 2).then_some((attempts, span)))
    })
    .await?;
    // n attempts 5 ms doubling apart take at least 5 ms x (2^(n-1) - 1); allow 1 s for the
    // recorder's own batching.
    let span = span.unwrap_or_default() + Duration::from_secs(1);
    let most = 1 + (span.as_secs_f64() / 0.005 + 1.0).log2().ceil() as i32;
    assert!(
        attempts <= most,
        "retried with backoff: {attempts} attempts within {span:?} (at most {most})"
    );
    // The reconcile that created good's child held its status back; the next one writes it.
    eventually("good Ready", WAIT, || async {
        let good = widgets.get("good").await?;
        Ok((good.data["status"]["conditions"][0]["status"] == "True").then_some(()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn concurrent_edits_by_another_client_converge_without_lost_updates() -> anyhow::Result<()> {
    let env = TestEnv::get("host-race").await?;
    updater(&env, "image-updater").await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &new_app("web", "nginx:1.27", 1))
        .await?;
    let deployments: Api<Deployment> = env.api();
    eventually("the Deployment", WAIT, || async {
        Ok(deployments.get_opt("web").await?)
    })
    .await?;

    // Another client edits the App (spec and annotations) and the Deployment (its own label)
    // while the host reconciles and writes status.
    let other = PatchParams::apply("another-client");
    const EDITS: i64 = 12;
    for i in 1..=EDITS {
        apps.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {format!("e2e.wasmop.dev/edit-{i}"): "yes"}},
                "spec": {"replicas": i % 4 + 1}
            })),
        )
        .await?;
        deployments
            .patch(
                "web",
                &other,
                &Patch::Apply(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "labels": {"e2e.wasmop.dev/touched": i.to_string()}}
                })),
            )
            .await?;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let want_replicas = EDITS % 4 + 1;
    let app = eventually("the status at the last generation", WAIT, || async {
        let a = apps.get("web").await?;
        let g = a.metadata.generation;
        Ok((a.data["status"]["observedGeneration"].as_i64() == g
            && a.data["status"]["replicas"] == json!(want_replicas))
        .then_some(a))
    })
    .await?;
    let annotations: BTreeMap<String, String> = app.annotations().clone();
    for i in 1..=12 {
        assert!(
            annotations.contains_key(&format!("e2e.wasmop.dev/edit-{i}")),
            "edit {i} was lost: {annotations:?}"
        );
    }
    let d = eventually("the Deployment at the last spec", WAIT, || async {
        Ok(deployments
            .get("web")
            .await
            .ok()
            .filter(|d| d.spec.replicas.map(i64::from) == Some(want_replicas)))
    })
    .await?;
    assert_eq!(
        d.labels().get("e2e.wasmop.dev/touched").map(String::as_str),
        Some("12"),
        "the other client's field survives server-side apply"
    );
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn changing_and_deleting_a_wasmreconciler_reconfigures_and_stops_its_controller()
-> anyhow::Result<()> {
    let env = TestEnv::get("host-live").await?;
    let (host, apps, deployments) =
        first_app(&env, "image-updater", true, "one", "the first Deployment").await?;

    // Change the registration: a reconciler for another namespace only. Apps here stop being served.
    let wr_name = format!("{}-image-updater", env.namespace);
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(env.client.clone());
    wrs.patch(
        &wr_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"namespaces": ["elsewhere"]}})),
    )
    .await?;
    eventually("the new generation observed", WAIT, || async {
        let wr = wrs.get(&wr_name).await?;
        Ok((wr.status.and_then(|s| s.observed_generation) == wr.metadata.generation).then_some(()))
    })
    .await?;
    apps.create(&PostParams::default(), &new_app("two", "nginx:1.27", 1))
        .await?;
    // And back: the controller picks the namespace up again and reconciles "two".
    wrs.patch(
        &wr_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"namespaces": [env.namespace]}})),
    )
    .await?;
    eventually(
        "the second Deployment after reconfiguring",
        WAIT,
        || async { Ok(deployments.get_opt("two").await?) },
    )
    .await?;

    // Deleting the WasmReconciler stops its controller: a new App is not reconciled.
    wrs.delete(&wr_name, &DeleteParams::default()).await?;
    // Stopped when its supervisor has ended (it unpublishes the module), however long that
    // takes on a loaded machine.
    eventually(
        "the deleted WasmReconciler's controller stopped",
        WAIT,
        || async {
            Ok(wasmop::admission::slots()
                .module(&wr_name)
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    // Its controller is gone, not merely idle: no state is kept for it any more.
    eventually("the controller stopped", WAIT, || async {
        Ok(wasmop::controller::tracked_objects(&wr_name)
            .is_none()
            .then_some(()))
    })
    .await?;
    apps.create(&PostParams::default(), &new_app("three", "nginx:1.27", 1))
        .await?;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        deployments.get_opt("three").await?.is_none(),
        "a deleted WasmReconciler's controller must stop"
    );
    host.shutdown().await?;
    env.passed()
}

#[tokio::test]
async fn a_child_name_taken_by_someone_else_is_not_taken_over() -> anyhow::Result<()> {
    let env = TestEnv::get("host-taken").await?;
    updater(&env, "image-updater").await?;
    // A Service the user made, with the name the App's Service will want.
    let services: Api<Service> = env.api();
    let theirs: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "shop", "labels": {"owner": "someone-else"}},
        "spec": {"ports": [{"port": 9999}], "selector": {"app": "theirs"}}
    }))?;
    services.create(&PostParams::default(), &theirs).await?;
    let host = start_host(&env, None).await?;
    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &new_app("shop", "nginx:1.27", 1))
        .await?;
    let warning = eventually(
        "an ApplyFailed Event naming the taken Service",
        WAIT,
        || async {
            Ok(events(&env.client, &env.namespace, "ApplyFailed")
                .await?
                .into_iter()
                .find(|e| {
                    e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("Service") && n.contains("already exists"))
                }))
        },
    )
    .await?;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let after = services.get("shop").await?;
    assert_eq!(
        after
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|p| p[0].port),
        Some(9999),
        "the user's Service is untouched"
    );
    assert!(after.metadata.owner_references.is_none());
    // Once the user removes it, the App gets its own.
    services.delete("shop", &DeleteParams::default()).await?;
    eventually("the App's own Service", WAIT, || async {
        Ok(services
            .get_opt("shop")
            .await?
            .filter(|s| s.metadata.owner_references.is_some()))
    })
    .await?;
    host.shutdown().await?;
    env.passed()
}

/// Durations a hostile or careless author may write: each reconciler is refused with a
/// condition naming the field and the bound, and the host goes on serving: a corrected
/// reconciler is set up at once.
#[tokio::test]
async fn hostile_durations_refuse_their_reconciler_and_the_host_goes_on() -> anyhow::Result<()> {
    let env = TestEnv::get("host-durations").await?;
    let (huge, _) = widget_reconciler(
        &env,
        "huge",
        wasmop_test_modules::MISBEHAVE,
        json!({"resyncPeriod": "99999999999999999999999h"}),
    )
    .await?;
    let (long, _) = image_updater(
        &env,
        "long",
        wasmop_test_modules::IMAGE_UPDATER,
        false,
        json!({"limits": {"deadline": "6m"}}),
    )
    .await?;
    let host = start_host(&env, None).await?;
    for (wr, field) in [
        (&huge, "spec.resyncPeriod"),
        (&long, "spec.limits.deadline"),
    ] {
        let (_, reason, message) = eventually(&format!("{wr} refused"), WAIT, || async {
            Ok(wr_condition(&env.client, wr, "Ready")
                .await?
                .filter(|(status, _, _)| status == "False"))
        })
        .await?;
        assert_eq!(reason, "InvalidSpec", "{wr}: {message}");
        assert!(message.contains(field), "{wr} names {field}: {message}");
    }
    // The host survived both: the corrected reconciler is served.
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(env.client.clone());
    wrs.patch(
        &long,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"limits": {"deadline": "2s"}}})),
    )
    .await?;
    wait_wr_ready(&env.client, &long).await?;
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
    host.shutdown().await?;
    env.passed()
}
