//! Metacontroller's examples under wasmop, on the real local control plane: the CompositeController
//! of each example (examples/metacontroller/<name>/controller.yaml, with `spec.wasmop` naming the
//! hook module in the test registry), its hook built unchanged into a module
//! (scripts/js-module.sh hook, scripts/python-module.sh hook) and the steps of Metacontroller's
//! own test.sh for it (each example's steps.md), with exact comparisons where upstream's bash
//! `-eq` compares nothing.
//!
//! Each test serves its controller for its own namespace (`spec.wasmop.namespaces`), so the
//! tests share the CRDs and run in parallel.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use wasmop_testenv::{Registry, TestEnv, eventually};

/// Loading a never-seen 12-20 MB hook component (pull, check, compile) on a loaded machine
/// takes tens of seconds.
const LOAD: Duration = Duration::from_secs(300);

/// The language of an example's hook.
#[derive(Clone, Copy)]
enum Lang {
    Js,
    Python,
}

/// `examples/metacontroller/<name>/<file>`'s YAML documents.
fn docs(name: &str, file: &str) -> anyhow::Result<Vec<Value>> {
    yaml_docs(&repo().join("examples/metacontroller").join(name).join(file))
}

/// Examples whose upstream hooks are not Python or JavaScript (service-per-pod's are jsonnet):
/// ours run in every mode.
const OURS_ONLY: [&str; 1] = ["service-per-pod"];

/// The hook file of example `name`: ours (`examples/metacontroller/<name>/<ours>`), or, with
/// `WASMOP_METACONTROLLER_EXAMPLES` set to a checkout's `examples/` directory, Metacontroller's
/// own (`<dir>/<name>/manifest/<upstream>`), so its hooks run unchanged against these steps.
fn hook_file(name: &str, ours: &str, upstream: &str) -> std::path::PathBuf {
    match std::env::var_os("WASMOP_METACONTROLLER_EXAMPLES").filter(|_| !OURS_ONLY.contains(&name))
    {
        Some(dir) => std::path::Path::new(&dir)
            .join(name)
            .join("manifest")
            .join(upstream),
        None => repo().join("examples/metacontroller").join(name).join(ours),
    }
}

/// The example's hook built, unchanged, into a hook module (skipped when up to date).
async fn hook_module(name: &str, lang: Lang) -> anyhow::Result<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("metacontroller");
    std::fs::create_dir_all(&dir)?;
    let tag = if std::env::var_os("WASMOP_METACONTROLLER_EXAMPLES").is_some()
        && !OURS_ONLY.contains(&name)
    {
        "upstream"
    } else {
        "ours"
    };
    let out = dir.join(format!("{name}-{tag}.wasm"));
    let (script, hook) = match lang {
        Lang::Js => (
            "scripts/js-module.sh",
            hook_file(name, "hook.js", "sync.js"),
        ),
        Lang::Python => (
            "scripts/python-module.sh",
            hook_file(name, "hook.py", "sync.py"),
        ),
    };
    let output = tokio::process::Command::new("bash")
        .arg(repo().join(script))
        .arg("hook")
        .arg(&hook)
        .arg(&out)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "{script} hook {} failed:\n{}{}",
        hook.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(std::fs::read(out)?)
}

/// Installs wasmop's CRDs: the WasmReconciler's, and the Composite- and DecoratorController's.
async fn install_controller_crds(env: &TestEnv) -> anyhow::Result<()> {
    install_crds(&env.client).await?;
    apply_crds(
        &env.client,
        yaml_docs(&repo().join("deploy/components/metacontroller/crds.yaml"))?,
    )
    .await
}

/// Installs wasmop's CRDs ([`install_controller_crds`]) and the example's parent CRD, if it has
/// one.
async fn install(env: &TestEnv, name: &str) -> anyhow::Result<()> {
    install_controller_crds(env).await?;
    let crd = repo()
        .join("examples/metacontroller")
        .join(name)
        .join("crd.yaml");
    if !crd.exists() {
        return Ok(());
    }
    apply_crds(&env.client, yaml_docs(&crd)?).await
}

/// Metacontroller's controller kinds.
const CONTROLLER_KINDS: [&str; 2] = ["CompositeController", "DecoratorController"];

/// The API of Metacontroller controllers of `kind`.
fn controllers(client: &Client, kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "metacontroller.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "metacontroller.k8s.io/v1alpha1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    Api::all_with(client.clone(), &resource)
}

/// The WasmReconciler serving controller `name` of `kind`.
fn reconciler_of(kind: &str, name: &str) -> String {
    match kind {
        "DecoratorController" => wasmop::metacontroller::decorator::reconciler_name(name),
        _ => wasmop::metacontroller::spec::reconciler_name(name),
    }
}

/// Applies the example's controller.yaml for this test: the hook's ServiceAccount in the test's
/// namespace, its cluster roles suffixed with the namespace, the host's own grants left out (the
/// test's host is the cluster's admin), and each Composite- or DecoratorController named
/// `<ns>-<its name>`, labelled for the test's host, serving `module` (for the test's namespace
/// when the parent is `namespaced`). Returns the controllers' kinds and names.
async fn register(
    env: &TestEnv,
    name: &str,
    module: Value,
    namespaced: bool,
) -> anyhow::Result<Vec<(String, String)>> {
    let ns = env.namespace.as_str();
    let mut found = Vec::new();
    for mut doc in docs(name, "controller.yaml")? {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let object = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if object.starts_with("wasmop-host-") {
            continue;
        }
        if CONTROLLER_KINDS.contains(&kind.as_str()) {
            found.push(doc);
            continue;
        }
        if kind.starts_with("Cluster") {
            doc["metadata"]["name"] = json!(format!("{object}-{ns}"));
        } else {
            doc["metadata"]["namespace"] = json!(ns);
        }
        if kind == "ClusterRoleBinding" {
            doc["roleRef"]["name"] = json!(format!(
                "{}-{ns}",
                doc["roleRef"]["name"].as_str().unwrap_or_default()
            ));
            doc["subjects"][0]["namespace"] = json!(ns);
        }
        apply_dynamic(&env.client, doc).await?;
    }
    anyhow::ensure!(
        !found.is_empty(),
        "{name}/controller.yaml has no Composite- or DecoratorController"
    );
    let mut registered = Vec::new();
    for mut cc in found {
        let kind = cc["kind"].as_str().unwrap_or_default().to_string();
        let cc_name = format!(
            "{ns}-{}",
            cc["metadata"]["name"].as_str().unwrap_or_default()
        );
        cc["metadata"] = json!({"name": cc_name, "labels": {"wasmop.dev/test": ns}});
        cc["spec"]["wasmop"]["module"] = module.clone();
        cc["spec"]["wasmop"]["serviceAccount"]["namespace"] = json!(ns);
        if namespaced {
            cc["spec"]["wasmop"]["namespaces"] = json!([ns]);
        }
        controllers(&env.client, &kind)
            .patch(&cc_name, &apply_params(), &Patch::Apply(&cc))
            .await?;
        registered.push((kind, cc_name));
    }
    Ok(registered)
}

/// Server-side applies one object of any kind.
async fn apply_dynamic(client: &Client, doc: Value) -> anyhow::Result<()> {
    let object: DynamicObject = serde_json::from_value(doc)?;
    let types = object.types.clone().unwrap_or_default();
    let (group, version) = types
        .api_version
        .rsplit_once('/')
        .unwrap_or(("", &types.api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, &types.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> = match (&object.metadata.namespace, caps.scope) {
        (Some(ns), kube::discovery::Scope::Namespaced) => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(&name, &apply_params(), &Patch::Apply(&object))
        .await?;
    Ok(())
}

/// The `Ready` condition of controller `name` of `kind`: (status, reason, message).
async fn controller_ready(
    client: &Client,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<(String, String, String)>> {
    let status = controllers(client, kind).get(name).await?.data["status"].take();
    let conditions: Vec<Condition> =
        serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
    Ok(conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status, c.reason, c.message)))
}

/// Builds, pushes and registers example `name`, starts a host for it and waits until the
/// WasmReconciler serving it is Ready. Returns the host and the registry (both stopped when
/// dropped).
async fn serve(
    env: &TestEnv,
    name: &str,
    lang: Lang,
    namespaced: bool,
) -> anyhow::Result<(wasmop::host::Host, Registry)> {
    let registry = Registry::start().await?;
    let bytes = hook_module(name, lang).await?;
    let digest = oci_push(&registry, &format!("hooks/{name}:v1"), bytes).await?;
    oci_pull_secret(env, &registry, "registry").await?;
    install(env, name).await?;
    let reference = format!("{}/hooks/{name}@{digest}", registry.host);
    let module = oci_module(&registry, &reference, "registry");
    let registered = register(env, name, module, namespaced).await?;
    let ns = env.namespace.clone();
    let host = start_host_with(env, |o| o.oci.namespace = Some(ns)).await?;
    for (kind, cc) in &registered {
        let ready = eventually(&format!("{kind} {cc} Ready"), WAIT, || async {
            Ok(controller_ready(&env.client, kind, cc)
                .await?
                .filter(|(s, _, _)| s == "True"))
        })
        .await?;
        assert_eq!(ready.1, "Served", "{ready:?}");
        let wr = reconciler_of(kind, cc);
        eventually(&format!("{wr} serving its hook"), LOAD, || async {
            Ok(wr_condition(&env.client, &wr, "Ready")
                .await?
                .filter(|c| c.0 == "True"))
        })
        .await?;
    }
    Ok((host, registry))
}

fn bluegreen_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "ctl.enisoc.com".into(),
        version: "v1".into(),
        api_version: "ctl.enisoc.com/v1".into(),
        kind: "BlueGreenDeployment".into(),
        plural: "bluegreendeployments".into(),
    };
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

/// bluegreen's "active" wait (steps.md A1-A5, exactly): `active` serves 3 ready Pods, the
/// other color's ReplicaSet exists scaled to 0, the status names `active` with 3 available and
/// the generation observed; and (stricter) the Service selects `active`.
async fn wait_active(env: &TestEnv, active: &str, inactive: &str) -> anyhow::Result<Value> {
    let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> = env.api();
    let services: Api<k8s_openapi::api::core::v1::Service> = env.api();
    let bgds = bluegreen_api(env);
    eventually(&format!("nginx-{active} active"), WAIT, || async {
        let on = rs.get_opt(&format!("nginx-{active}")).await?;
        let off = rs.get_opt(&format!("nginx-{inactive}")).await?;
        let bgd = bgds.get("nginx").await?;
        let svc = services.get_opt("nginx-frontend").await?;
        let ready = on.and_then(|r| r.status).and_then(|s| s.ready_replicas) == Some(3);
        let scaled_down = off.and_then(|r| r.status).map(|s| s.replicas) == Some(0);
        let status = &bgd.data["status"];
        let selects = svc
            .and_then(|s| s.spec)
            .and_then(|s| s.selector)
            .and_then(|s| s.get("color").cloned());
        Ok((ready
            && scaled_down
            && status["activeColor"] == active
            && status["active"]["availableReplicas"] == 3
            && status["observedGeneration"] == json!(bgd.metadata.generation)
            && selects.as_deref() == Some(active))
        .then_some(bgd.data))
    })
    .await
}

/// Metacontroller's examples/bluegreen/test.sh: a BlueGreenDeployment goes blue, rolls to green
/// on a template change, and back to blue on another; the hook is the fission-style JavaScript
/// function of examples/metacontroller/bluegreen, unchanged.
#[tokio::test]
async fn bluegreen_rolls_from_blue_to_green_and_back_with_its_javascript_hook() -> anyhow::Result<()>
{
    let env = TestEnv::get("mc-bluegreen").await?;
    let _served = serve(&env, "bluegreen", Lang::Js, true).await?;
    let bgds = bluegreen_api(&env);
    let example = docs("bluegreen", "example.yaml")?.remove(0);
    bgds.create(&PostParams::default(), &serde_json::from_value(example)?)
        .await?;

    wait_active(&env, "blue", "green").await?;
    let patch = |labels: Value| {
        Patch::Merge(json!({"spec": {"template": {"metadata": {"labels": labels}}}}))
    };
    bgds.patch(
        "nginx",
        &Default::default(),
        &patch(json!({"new": "label"})),
    )
    .await?;
    wait_active(&env, "green", "blue").await?;
    let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> = env.api();
    let green = rs.get("nginx-green").await?;
    let labels = green
        .spec
        .template
        .and_then(|t| t.metadata)
        .and_then(|m| m.labels)
        .unwrap_or_default();
    assert_eq!(
        labels.get("new").map(String::as_str),
        Some("label"),
        "green runs the new template"
    );

    bgds.patch(
        "nginx",
        &Default::default(),
        &patch(json!({"new2": "label2"})),
    )
    .await?;
    wait_active(&env, "blue", "green").await?;
    let green = rs.get("nginx-green").await?;
    assert_eq!(
        green.spec.replicas,
        Some(0),
        "green is scaled to 0 after the swap back"
    );
    let all = rs.list(&Default::default()).await?;
    let names: Vec<String> = all
        .items
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only nginx-blue and nginx-green exist: {names:?}"
    );
    env.passed()
}

fn indexedjob_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "ctl.enisoc.com".into(),
        version: "v1".into(),
        api_version: "ctl.enisoc.com/v1".into(),
        kind: "IndexedJob".into(),
        plural: "indexedjobs".into(),
    };
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

/// Completes one Running Pod of the job as kwok's `pod-complete` stage completes a Job's (kwok
/// completes only Pods a Job owns): returns how many Pods were unfinished before.
async fn complete_one(pods: &Api<k8s_openapi::api::core::v1::Pod>) -> anyhow::Result<usize> {
    let list = pods.list(&Default::default()).await?;
    let phase = |p: &k8s_openapi::api::core::v1::Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    let unfinished = list
        .items
        .iter()
        .filter(|p| !matches!(phase(p).as_str(), "Succeeded" | "Failed"))
        .count();
    if let Some(running) = list.items.iter().find(|p| phase(p) == "Running") {
        let status = json!({"status": {"phase": "Succeeded", "containerStatuses": [{
            "name": "print-index", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        let name = running.metadata.name.clone().unwrap_or_default();
        pods.patch_status(&name, &Default::default(), &Patch::Merge(status))
            .await?;
    }
    Ok(unfinished)
}

/// Metacontroller's examples/indexedjob/test.sh: ten indexed Pods, two at a time, each started
/// only when one finished, until 10 succeeded; the hook is the `http.server` handler of
/// examples/metacontroller/indexedjob, unchanged. kwok does not finish these Pods, so the test
/// does, one at a time, checking the parallelism bound before each.
#[tokio::test]
async fn indexedjob_runs_ten_indexes_two_at_a_time_with_its_python_hook() -> anyhow::Result<()> {
    let env = TestEnv::get("mc-indexedjob").await?;
    let _served = serve(&env, "indexedjob", Lang::Python, true).await?;
    let jobs = indexedjob_api(&env);
    let example = docs("indexedjob", "example.yaml")?.remove(0);
    jobs.create(&PostParams::default(), &serde_json::from_value(example)?)
        .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    let done = eventually("10 successful completions", WAIT, || async {
        let unfinished = complete_one(&pods).await?;
        assert!(
            unfinished <= 2,
            "{unfinished} Pods run at once; parallelism is 2"
        );
        let job = jobs.get("print-index").await?;
        Ok((job.data["status"]["succeeded"] == 10).then_some(job))
    })
    .await?;
    assert_eq!(done.data["status"]["conditions"][0]["type"], "Complete");
    let nine = pods.get("print-index-9").await?;
    let env9 = nine
        .spec
        .map(|s| s.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    let index = env9
        .iter()
        .find(|e| e.name == "JOB_INDEX")
        .and_then(|e| e.value.clone());
    assert_eq!(index.as_deref(), Some("9"), "print-index-9 prints 9");
    let names: std::collections::BTreeSet<String> = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let expected: std::collections::BTreeSet<String> =
        (0..10).map(|i| format!("print-index-{i}")).collect();
    assert_eq!(names, expected, "exactly one Pod per index");
    env.passed()
}

fn catset_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "ctl.enisoc.com".into(),
        version: "v1".into(),
        api_version: "ctl.enisoc.com/v1".into(),
        kind: "CatSet".into(),
        plural: "catsets".into(),
    };
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

/// Four PersistentVolumes pre-bound to the claims `www-nginx-backend-0..3` of the test's
/// namespace: the local control plane has no volume provisioner (catset's steps.md).
async fn catset_volumes(env: &TestEnv) -> anyhow::Result<()> {
    let ns = env.namespace.as_str();
    let api: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(env.client.clone());
    for i in 0..4 {
        let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("{ns}-www-{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                "hostPath": {"path": format!("/tmp/{ns}-www-{i}")},
                "claimRef": {"namespace": ns, "name": format!("www-nginx-backend-{i}")}}
        }))?;
        api.patch(
            &format!("{ns}-www-{i}"),
            &apply_params(),
            &Patch::Apply(&pv),
        )
        .await?;
    }
    Ok(())
}

/// Waits until the CatSet's `status.<field>` is `value`.
async fn catset_status(env: &TestEnv, field: &str, value: i64) -> anyhow::Result<()> {
    let catsets = catset_api(env);
    eventually(
        &format!("CatSet status.{field} = {value}"),
        WAIT,
        || async {
            let cs = catsets.get("nginx-backend").await?;
            Ok((cs.data["status"][field] == value).then_some(()))
        },
    )
    .await
}

/// The names of the Pods of the CatSet.
async fn catset_pods(env: &TestEnv) -> anyhow::Result<Vec<String>> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    let params = kube::api::ListParams::default().labels("app=nginx,component=backend");
    let mut names: Vec<String> = pods
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Metacontroller's examples/catset/test.sh: a CatSet (a StatefulSet written as a hook) scales
/// 3 -> 4 -> 2 one ordinal at a time, and when deleted its finalize hook scales it to 0 before
/// wasmop releases it; the hook is the fission-style JavaScript function of
/// examples/metacontroller/catset, unchanged.
#[tokio::test]
async fn catset_scales_in_order_and_finalizes_to_zero_with_its_javascript_hook()
-> anyhow::Result<()> {
    let env = TestEnv::get("mc-catset").await?;
    let _served = serve(&env, "catset", Lang::Js, true).await?;
    catset_volumes(&env).await?;
    let catsets = catset_api(&env);
    for mut doc in docs("catset", "example.yaml")? {
        doc["metadata"]["namespace"] = json!(env.namespace);
        apply_dynamic(&env.client, doc).await?;
    }
    catset_status(&env, "readyReplicas", 3).await?;
    let scale = |n: i64| Patch::Merge(json!({"spec": {"replicas": n}}));
    catsets
        .patch("nginx-backend", &Default::default(), &scale(4))
        .await?;
    catset_status(&env, "readyReplicas", 4).await?;
    catsets
        .patch("nginx-backend", &Default::default(), &scale(2))
        .await?;
    catset_status(&env, "readyReplicas", 2).await?;
    catset_status(&env, "replicas", 2).await?;
    eventually("Pods 2 and 3 removed", WAIT, || async {
        let pods = catset_pods(&env).await?;
        Ok((pods == ["nginx-backend-0", "nginx-backend-1"]).then_some(()))
    })
    .await?;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = env.api();
    for i in 2..4 {
        assert!(
            claims
                .get_opt(&format!("www-nginx-backend-{i}"))
                .await?
                .is_some(),
            "the claim of ordinal {i} is kept after the scale-down"
        );
    }

    // Upstream's JSON patch appends to the finalizers: it fails unless wasmop put its own on.
    let finalizer = "metacontroller.io/catset-test";
    let append = json!([{"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}]);
    catsets
        .patch(
            "nginx-backend",
            &Default::default(),
            &Patch::Json::<()>(serde_json::from_value(append)?),
        )
        .await?;
    catsets.delete("nginx-backend", &Default::default()).await?;
    catset_status(&env, "replicas", 0).await?;
    eventually("only the test's finalizer left", WAIT, || async {
        let cs = catsets.get("nginx-backend").await?;
        Ok((cs.metadata.finalizers == Some(vec![finalizer.to_string()])).then_some(()))
    })
    .await?;
    assert!(catset_pods(&env).await?.is_empty(), "no Pod is left");
    catsets
        .patch(
            "nginx-backend",
            &Default::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": []}})),
        )
        .await?;
    eventually("the CatSet gone", WAIT, || async {
        Ok(catsets
            .get_opt("nginx-backend")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    env.passed()
}

/// Metacontroller's examples/configmappropagation/test.sh: a cluster-scoped ConfigMapPropagation
/// labelled `version: v1` copies its source ConfigMap into three namespaces, with the number of
/// copies in its status; the hook's customize hook names the source as a related object; a
/// second propagation labelled `version: v2` is outside the controller's
/// `parentResource.labelSelector` and copies nothing. The hook is the `http.server` handler of
/// examples/metacontroller/configmappropagation, unchanged. Namespaces and parents are
/// suffixed with the test's namespace (all cluster-scoped).
#[tokio::test]
async fn configmappropagation_copies_into_the_selected_parents_namespaces_with_its_python_hook()
-> anyhow::Result<()> {
    let env = TestEnv::get("mc-cmp").await?;
    let ns = env.namespace.clone();
    let _served = serve(&env, "configmappropagation", Lang::Python, false).await?;
    let suffixed = |n: &str| format!("{ns}-{n}");
    for mut doc in docs("configmappropagation", "example.yaml")? {
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match doc["kind"].as_str().unwrap_or_default() {
            "Namespace" | "ConfigMapPropagation" => {
                doc["metadata"]["name"] = json!(suffixed(&name))
            }
            _ => {}
        }
        if let Some(source) = doc["metadata"]["namespace"].as_str().map(str::to_string) {
            doc["metadata"]["namespace"] = json!(suffixed(&source));
        }
        if doc["kind"] == "ConfigMapPropagation" {
            let source = doc["spec"]["sourceNamespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            doc["spec"]["sourceNamespace"] = json!(suffixed(&source));
            let targets: Vec<String> = doc["spec"]["targetNamespaces"]
                .as_array()
                .map(|t| t.iter().filter_map(Value::as_str).map(suffixed).collect())
                .unwrap_or_default();
            doc["spec"]["targetNamespaces"] = json!(targets);
        }
        apply_dynamic(&env.client, doc).await?;
    }
    for target in ["one", "two", "three"] {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(env.client.clone(), &suffixed(target));
        let copy = eventually(&format!("settings copied into {target}"), WAIT, || async {
            Ok(cms.get_opt("settings").await?)
        })
        .await?;
        let data = copy.data.unwrap_or_default();
        assert_eq!(
            data.get("some").map(String::as_str),
            Some("value"),
            "the copy holds the source's data"
        );
    }
    let resource = ApiResource {
        group: "examples.metacontroller.io".into(),
        version: "v1alpha1".into(),
        api_version: "examples.metacontroller.io/v1alpha1".into(),
        kind: "ConfigMapPropagation".into(),
        plural: "configmappropagations".into(),
    };
    let parents: Api<DynamicObject> = Api::all_with(env.client.clone(), &resource);
    let managed = suffixed("settings-propagation");
    eventually("status.actual_copies = 3", WAIT, || async {
        let p = parents.get(&managed).await?;
        Ok(
            (p.data["status"]["actual_copies"] == 3 && p.data["status"]["expected_copies"] == 3)
                .then_some(()),
        )
    })
    .await?;
    // Upstream's negative check (without its sleep): nothing was copied for the v2 parent, and
    // wasmop wrote nothing on it.
    for target in ["four", "five"] {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(env.client.clone(), &suffixed(target));
        assert!(
            cms.get_opt("settings").await?.is_none(),
            "nothing copied into {target}"
        );
    }
    let unmanaged = parents
        .get(&suffixed("settings-propagation-unmanaged"))
        .await?;
    assert!(
        unmanaged
            .data
            .get("status")
            .is_none_or(|s| s.is_null() || s == &json!({})),
        "the v2 parent has no status: {:?}",
        unmanaged.data.get("status")
    );
    env.passed()
}

fn daemonjob_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "ctl.example.com".into(),
        version: "v1".into(),
        api_version: "ctl.example.com/v1".into(),
        kind: "DaemonJob".into(),
        plural: "daemonjobs".into(),
    };
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

/// The calls of `reconciler`'s hook module (its `reconcile`, in this process's metrics).
fn hook_calls(reconciler: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    let labels = format!("reconciler=\"{reconciler}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("wasmop_module_call_duration_seconds_count{"))
        .filter(|l| l.contains(&labels) && l.contains("function=\"reconcile\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Metacontroller's examples/daemonjob/test.sh (steps.md): a DaemonJob runs its Pod once on
/// every node through a DaemonSet, is marked Complete, and its DaemonSet is deleted; the hook is
/// the `http.server` handler of examples/metacontroller/daemonjob, unchanged. The deletion needs
/// a sync after the host's own status write (the hook deletes the DaemonSet only once the
/// DaemonJob's stored status says complete): the status change of the parent triggers it, as
/// under Metacontroller. Then the host is quiet: the sync after its status write answered the
/// same status, which is not written again.
#[tokio::test]
async fn daemonjob_runs_once_on_every_node_then_deletes_its_daemonset_with_its_python_hook()
-> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{ListParams, WatchEvent, WatchParams};

    let env = TestEnv::get("mc-daemonjob").await?;
    let _served = serve(&env, "daemonjob", Lang::Python, true).await?;
    let jobs = daemonjob_api(&env);
    let daemonsets: Api<DaemonSet> = env.api();
    // kwok completes the job at once: the DaemonSet may come and go between two polls, so
    // what it was is watched from a resourceVersion taken before it can exist.
    let from = daemonsets
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events =
        futures::StreamExt::boxed(daemonsets.watch(&WatchParams::default(), &from).await?);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<DaemonSet>::new()));
    let watching = tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Some(event) = futures::StreamExt::next(&mut events).await {
                if let (Ok(WatchEvent::Added(ds) | WatchEvent::Modified(ds)), Ok(mut seen)) =
                    (event, seen.lock())
                {
                    seen.push(ds);
                }
            }
        }
    });

    // 1. `kubectl apply -f my-daemonjob.yaml`
    let example = docs("daemonjob", "example.yaml")?.remove(0);
    let created = jobs
        .create(&PostParams::default(), &serde_json::from_value(example)?)
        .await?;
    // 2. "Wait for successful completion": `{.status.conditions[0].status}` == "True".
    let done = eventually("DaemonJob hello-world Complete", WAIT, || async {
        let dj = jobs.get("hello-world").await?;
        Ok((dj.data["status"]["conditions"][0]["status"] == "True").then_some(dj))
    })
    .await?;
    let status = &done.data["status"];
    assert_eq!(status["conditions"][0]["type"], "Complete", "{status}");
    // Not in upstream: one Pod on each of the two kwok nodes, all Ready (0 scheduled is not
    // "all Ready").
    assert_eq!(status["desiredNumberScheduled"], 2, "{status}");
    assert_eq!(status["numberReady"], 2, "{status}");
    // 3. "Check that DaemonSet gets cleaned up after finishing": `kubectl get daemonset
    //    hello-world-dj` says NotFound.
    eventually("DaemonSet hello-world-dj gone", WAIT, || async {
        Ok(daemonsets
            .get_opt("hello-world-dj")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;

    // Not in upstream: the DaemonSet the hook made, owned by the DaemonJob, with the job's
    // container as an init container and the pause container (its creation reaches the watch
    // after its deletion reached the reads above, or not yet: waited for).
    let first = eventually(
        "the DaemonSet hello-world-dj seen by the watch",
        WAIT,
        || async {
            Ok(seen
                .lock()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .iter()
                .find(|d| d.metadata.name.as_deref() == Some("hello-world-dj"))
                .cloned())
        },
    )
    .await?;
    watching.abort();
    let owner = first
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind, o.name, o.uid));
    assert_eq!(
        owner,
        Some((
            "DaemonJob".to_string(),
            "hello-world".to_string(),
            created.metadata.uid.clone().unwrap_or_default()
        ))
    );
    let pod_spec = first
        .spec
        .template
        .spec
        .ok_or_else(|| anyhow::anyhow!("the DaemonSet has no Pod template"))?;
    let names = |cs: Option<Vec<k8s_openapi::api::core::v1::Container>>| -> Vec<String> {
        cs.unwrap_or_default().into_iter().map(|c| c.name).collect()
    };
    assert_eq!(names(pod_spec.init_containers), ["hello-world"]);
    assert_eq!(names(Some(pod_spec.containers)), ["pause"]);

    // Not in upstream: the DaemonJob stays Complete, and the DaemonSet's Pods go with it.
    let pods: Api<Pod> = env.api();
    eventually("the Pods of hello-world gone", WAIT, || async {
        let params = kube::api::ListParams::default().labels("app=hello-world");
        Ok(pods.list(&params).await?.items.is_empty().then_some(()))
    })
    .await?;

    // The loop guard: once the hook has seen its own status and the DaemonSet is gone, nothing
    // calls it again (the sync after a status write answers the same status, which is not
    // written, so no status change follows). A first quiet window lets the events of the
    // DaemonSet's deletion be served; then neither the hook nor the DaemonJob moves.
    let reconciler = wasmop::metacontroller::spec::reconciler_name(&format!(
        "{}-daemonjob-controller",
        env.namespace
    ));
    let quiet = Duration::from_secs(5);
    eventually("the hook quiet for 5 s", WAIT, || async {
        let before = hook_calls(&reconciler)?;
        tokio::time::sleep(quiet).await;
        Ok((hook_calls(&reconciler)? == before).then_some(()))
    })
    .await?;
    let (calls, dj) = (hook_calls(&reconciler)?, jobs.get("hello-world").await?);
    assert!(calls >= 2.0, "{calls} calls of the hook");
    tokio::time::sleep(quiet * 2).await;
    let later = jobs.get("hello-world").await?;
    assert_eq!(
        hook_calls(&reconciler)?,
        calls,
        "the hook is not called again"
    );
    assert_eq!(
        later.metadata.resource_version, dj.metadata.resource_version,
        "the DaemonJob is not written again: {}",
        later.data["status"]
    );
    let conditions = later.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let kept: Vec<(Value, Value)> = conditions
        .iter()
        .map(|c| (c["type"].clone(), c["status"].clone()))
        .collect();
    assert_eq!(kept, [(json!("Complete"), json!("True"))], "{conditions:?}");
    env.passed()
}

/// `name`'s Services in the test's namespace: whether it exists and, if so, its `pod-name`
/// selector.
async fn service_selector(
    services: &Api<k8s_openapi::api::core::v1::Service>,
    name: &str,
) -> anyhow::Result<Option<Option<String>>> {
    Ok(services.get_opt(name).await?.map(|s| {
        s.spec
            .and_then(|s| s.selector)
            .and_then(|m| m.get("pod-name").cloned())
    }))
}

/// Waits until StatefulSet nginx no longer holds `finalizer`.
async fn finalizer_gone(
    sets: &Api<k8s_openapi::api::apps::v1::StatefulSet>,
    finalizer: &str,
) -> anyhow::Result<()> {
    eventually(&format!("{finalizer} removed"), WAIT, || async {
        let held = sets
            .get_opt("nginx")
            .await?
            .and_then(|s| s.metadata.finalizers)
            .unwrap_or_default();
        Ok((!held.iter().any(|f| f == finalizer)).then_some(()))
    })
    .await
}

/// Metacontroller's examples/service-per-pod/test.sh (steps.md), its two DecoratorControllers
/// served from one Python module: a Service per Pod of an annotated StatefulSet, each Pod
/// labelled with its name; the Services are cleaned up by the finalize hook when the StatefulSet
/// opts out (an annotation removed), come back when it opts in, and are cleaned up again before
/// the StatefulSet goes. Stricter than upstream: every Service's ports, annotation and owner;
/// a Service the StatefulSet controls that is not the decorator's is never touched; the
/// finalizer is exactly wasmop's.
#[tokio::test]
async fn service_per_pod_decorates_a_statefulset_and_cleans_up_on_opt_out_and_delete()
-> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Pod, Service};

    let env = TestEnv::get("mc-spp").await?;
    let ns = env.namespace.clone();
    let _served = serve(&env, "service-per-pod", Lang::Python, true).await?;
    for mut doc in docs("service-per-pod", "example.yaml")? {
        doc["metadata"]["namespace"] = json!(ns);
        apply_dynamic(&env.client, doc).await?;
    }
    let (services, pods, sets): (Api<Service>, Api<Pod>, Api<StatefulSet>) =
        (env.api(), env.api(), env.api());
    let uid = sets.get("nginx").await?.metadata.uid.unwrap_or_default();
    // Controlled by the StatefulSet, but not the decorator's (no annotation): never touched.
    let foreign = json!({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "nginx-extra", "namespace": ns, "ownerReferences": [{"apiVersion": "apps/v1",
        "kind": "StatefulSet", "name": "nginx", "uid": uid, "controller": true}]},
        "spec": {"ports": [{"port": 81}]}});
    apply_dynamic(&env.client, foreign).await?;
    let decorator = format!("{ns}-service-per-pod");
    let check_all = || async {
        for i in 0..3 {
            let name = format!("nginx-{i}");
            eventually(
                &format!("Service {name} selecting its Pod"),
                WAIT,
                || async {
                    Ok(service_selector(&services, &name)
                        .await?
                        .flatten()
                        .filter(|s| *s == name))
                },
            )
            .await?;
            let svc = services.get(&name).await?;
            let ports: Vec<(i32, String)> = svc
                .spec
                .and_then(|s| s.ports)
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.port, format!("{:?}", p.target_port)))
                .collect();
            assert_eq!(ports.len(), 2, "ports 80 and 8080: {ports:?}");
            let annotations = svc.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get("metacontroller.k8s.io/decorator-controller"),
                Some(&decorator),
                "the decorator's own attachment"
            );
            let owner = svc.metadata.owner_references.unwrap_or_default();
            assert!(
                owner
                    .iter()
                    .any(|o| o.uid == uid && o.controller == Some(true)),
                "controlled by the StatefulSet: {owner:?}"
            );
        }
        anyhow::Ok(())
    };
    check_all().await?;
    eventually("Pod nginx-2 labelled pod-name=nginx-2", WAIT, || async {
        let labels = pods
            .get_opt("nginx-2")
            .await?
            .and_then(|p| p.metadata.labels)
            .unwrap_or_default();
        Ok((labels.get("pod-name").map(String::as_str) == Some("nginx-2")).then_some(()))
    })
    .await?;
    let finalizer = wasmop::crd::finalizer_for(&reconciler_of("DecoratorController", &decorator));
    let held = sets
        .get("nginx")
        .await?
        .metadata
        .finalizers
        .unwrap_or_default();
    assert!(
        held.contains(&finalizer),
        "{finalizer} on the StatefulSet: {held:?}"
    );

    // Opt out without deleting the StatefulSet.
    let annotate = |value: Value| {
        Patch::Merge(json!({"metadata": {"annotations": {"service-per-pod-label": value}}}))
    };
    sets.patch("nginx", &Default::default(), &annotate(Value::Null))
        .await?;
    for i in 0..3 {
        let name = format!("nginx-{i}");
        eventually(&format!("Service {name} cleaned up"), WAIT, || async {
            Ok(service_selector(&services, &name)
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
    }
    finalizer_gone(&sets, &finalizer).await?;

    // Opt in again.
    sets.patch("nginx", &Default::default(), &annotate(json!("pod-name")))
        .await?;
    check_all().await?;

    // Deletion: our own finalizer keeps the StatefulSet while the decorator cleans up.
    let ours = "metacontroller.io/service-per-pod-test";
    let add = json!([{"op": "add", "path": "/metadata/finalizers/-", "value": ours}]);
    sets.patch(
        "nginx",
        &Default::default(),
        &Patch::Json::<()>(serde_json::from_value(add)?),
    )
    .await?;
    sets.delete("nginx", &Default::default()).await?;
    for i in 0..3 {
        let name = format!("nginx-{i}");
        eventually(
            &format!("Service {name} cleaned up on delete"),
            WAIT,
            || async {
                Ok(service_selector(&services, &name)
                    .await?
                    .is_none()
                    .then_some(()))
            },
        )
        .await?;
    }
    finalizer_gone(&sets, &finalizer).await?;
    assert!(
        services.get_opt("nginx-extra").await?.is_some(),
        "the Service that is not the decorator's is left alone"
    );
    let release = json!({"metadata": {"finalizers": null}});
    sets.patch("nginx", &Default::default(), &Patch::Merge(release))
        .await?;
    env.passed()
}

/// A WasmReconciler of the name wasmop gives a CompositeController, made by hand and not owned
/// by it, is never overwritten: the controller is `Ready=False`, `NameTaken`, and the hand-made
/// WasmReconciler keeps its spec, labels and (absent) ownerReferences, written by its own
/// manager only (host/src/metacontroller/compose.rs). It carries no test label, so no host serves
/// it, and its module is never loaded.
#[tokio::test]
async fn a_composite_controller_whose_reconciler_name_is_taken_is_name_taken_and_overwrites_nothing()
-> anyhow::Result<()> {
    use wasmop::crd::WasmReconciler;

    let env = TestEnv::get("mc-taken").await?;
    let ns = env.namespace.clone();
    install_controller_crds(&env).await?;
    let cc_name = format!("{ns}-taken");
    let wr_name = reconciler_of("CompositeController", &cc_name);
    let module = json!({"configMap": {"namespace": ns, "name": "absent"}});
    let spec = json!({
        "module": module,
        "primary": {"apiVersion": "v1", "kind": "ConfigMap"},
        "namespaces": [ns],
        "serviceAccount": {"namespace": ns, "name": "by-hand"},
    });
    let labels = json!({"made-by": "hand"});
    let handmade = json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
        "metadata": {"name": wr_name, "labels": labels},
        "spec": spec,
    });
    apply_reconciler(&env.client, &handmade).await?;
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    let before = wrs.get(&wr_name).await?;

    let cc = json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
        "metadata": {"name": cc_name, "labels": {"wasmop.dev/test": ns}},
        "spec": {
            "parentResource": {"apiVersion": "v1", "resource": "configmaps"},
            "hooks": {"sync": {"webhook": {"url": "http://taken.invalid/sync"}}},
            "wasmop": {"module": module, "namespaces": [ns],
                "serviceAccount": {"namespace": ns, "name": "by-hand"}},
        },
    });
    controllers(&env.client, "CompositeController")
        .patch(&cc_name, &apply_params(), &Patch::Apply(&cc))
        .await?;
    let _host = start_host_with(&env, |_| {}).await?;

    let ready = eventually(
        &format!("CompositeController {cc_name} NameTaken"),
        WAIT,
        || async {
            Ok(
                controller_ready(&env.client, "CompositeController", &cc_name)
                    .await?
                    .filter(|(status, _, _)| status == "False"),
            )
        },
    )
    .await?;
    assert_eq!(ready.1, "NameTaken", "{ready:?}");
    assert!(
        ready.2.contains(&wr_name),
        "the message names {wr_name}: {ready:?}"
    );

    let after = wrs.get(&wr_name).await?;
    assert_eq!(
        serde_json::to_value(&after.spec)?,
        serde_json::to_value(&before.spec)?,
        "the spec as made by hand"
    );
    assert_eq!(
        serde_json::to_value(after.metadata.labels.unwrap_or_default())?,
        labels,
        "the labels as made by hand: no test label, no controller label"
    );
    assert_eq!(
        after.metadata.owner_references.unwrap_or_default(),
        vec![],
        "no owner: the controller did not adopt it"
    );
    assert_eq!(
        after.metadata.generation,
        Some(1),
        "the spec never written again"
    );
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["wasmop-e2e"], "written by its own manager only");
    env.passed()
}
