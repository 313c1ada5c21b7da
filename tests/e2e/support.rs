//! What the host's end-to-end tests share: CRDs, module ConfigMaps, ServiceAccounts with
//! exactly the rights a test grants, WasmReconcilers, and an in-process host per test.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use wasmop::crd::WasmReconciler;
use wasmop::host::{Host, HostOptions, WebhookOptions};
use wasmop::operations::leader::LeaderConfig;
use wasmop_testenv::{TestEnv, eventually};

/// How long the e2e tests wait for the cluster to converge.
pub const WAIT: Duration = Duration::from_secs(180);

pub fn apply_params() -> PatchParams {
    PatchParams::apply("wasmop-e2e").force()
}

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Reads one or more YAML documents.
pub fn yaml_docs(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

/// A CRD for the misbehave test guest's `Widget` kind.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.wasmop.dev"},
        "spec": {
            "group": "test.wasmop.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

/// Installs (idempotently) the WasmReconciler, App and Widget CRDs and waits until they serve.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let mut all: Vec<Value> = vec![serde_json::to_value(WasmReconciler::crd())?, widget_crd()];
    all.extend(yaml_docs(
        &repo().join("examples/image-updater/k8s/crd.yaml"),
    )?);
    apply_crds(client, all).await
}

/// Applies CRDs (idempotently) and waits until each one serves.
pub async fn apply_crds(client: &Client, all: Vec<Value>) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in all {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        crds.patch(&name, &apply_params(), &Patch::Apply(&crd))
            .await?;
        eventually(&format!("CRD {name} Established"), WAIT, || {
            let (crds, name) = (crds.clone(), name.clone());
            async move {
                let crd = crds.get(&name).await?;
                Ok(crd
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
                    .then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

/// Puts `module` into ConfigMap `ns/name`, as `wasmop push` does.
pub async fn push_module(
    client: &Client,
    ns: &str,
    name: &str,
    module: &str,
) -> anyhow::Result<String> {
    let bytes = wasmop_test_modules::bytes(module);
    let sha = wasmop::engine::sha256_hex(&bytes);
    let cm = wasmop::modules::source::to_config_map(name, ns, &bytes, "test", "0", &sha)?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    api.patch(name, &apply_params(), &Patch::Apply(&cm)).await?;
    Ok(sha)
}

/// Creates ServiceAccount `ns/name` bound to a Role with exactly `rules`.
pub async fn service_account(
    client: &Client,
    ns: &str,
    name: &str,
    rules: Value,
) -> anyhow::Result<()> {
    let sa: ServiceAccount = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}),
    )?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch(name, &apply_params(), &Patch::Apply(&sa))
        .await?;
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": ns}, "rules": rules
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .patch(name, &apply_params(), &Patch::Apply(&role))
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .patch(name, &apply_params(), &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// The rules image-updater needs (its example Role).
pub fn image_updater_rules(services: bool) -> Value {
    let mut rules = vec![
        json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}),
        json!({"apiGroups": ["example.wasmop.dev"], "resources": ["apps"], "verbs": ["get", "list", "watch", "update", "patch"]}),
        json!({"apiGroups": ["example.wasmop.dev"], "resources": ["apps/status", "apps/finalizers"], "verbs": ["get", "update", "patch"]}),
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}),
    ];
    if services {
        rules.push(json!({"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}));
    } else {
        // Reading an owned kind is required (the host checks it at set-up); writing is not.
        rules.push(json!({"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]}));
    }
    Value::Array(rules)
}

/// The rules the misbehave guest needs.
pub fn widget_rules() -> Value {
    json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["test.wasmop.dev"], "resources": ["widgets", "widgets/status"], "verbs": ["get", "list", "watch", "update", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
    ])
}

/// A WasmReconciler for a test: scoped to the test's namespace, labelled for the test's host.
pub fn reconciler(
    env: &TestEnv,
    name: &str,
    module_cm: &str,
    primary: (&str, &str),
    owns: &[(&str, &str)],
    sa: &str,
    extra: Value,
) -> Value {
    let mut spec = json!({
        "module": {"configMap": {"namespace": env.namespace, "name": module_cm}},
        "primary": {"apiVersion": primary.0, "kind": primary.1},
        "owns": owns.iter().map(|(v, k)| json!({"apiVersion": v, "kind": k})).collect::<Vec<_>>(),
        "namespaces": [env.namespace],
        "serviceAccount": {"namespace": env.namespace, "name": sa},
        "limits": {"deadline": "500ms", "memory": "64Mi", "concurrency": 4},
        "resyncPeriod": "5m",
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
        "metadata": {"name": name, "labels": {"wasmop.dev/test": env.namespace}},
        "spec": spec,
    })
}

/// Applies a WasmReconciler.
pub async fn apply_reconciler(client: &Client, wr: &Value) -> anyhow::Result<()> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    let name = wr["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(name, &apply_params(), &Patch::Apply(wr)).await?;
    Ok(())
}

/// Starts a host in this process serving only this test's WasmReconcilers.
pub async fn start_host(env: &TestEnv, cache: Option<&Path>) -> anyhow::Result<Host> {
    // `RUST_LOG=wasmop=debug cargo test ...` shows the host's logs with a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    Ok(Host::start(HostOptions {
        kubeconfig: Some(env.kubeconfig().to_path_buf()),
        cache_dir: cache.map(Path::to_path_buf),
        selector: Some(format!("wasmop.dev/test={}", env.namespace)),
        instance: format!("e2e-{}", env.namespace),
        ..HostOptions::default()
    })
    .await?)
}

/// The sum of metric `name`'s samples labelled `reconciler` in the in-process hosts' registry.
pub fn reconciler_metric(name: &str, reconciler: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    let label = format!("reconciler=\"{reconciler}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Waits until no Event of `reconciler`'s module waits to be published by an in-process host:
/// the lane publishes them after the reconciles that asked for them, so Events or requests
/// counted before could miss them.
pub async fn events_published(reconciler: &str) -> anyhow::Result<()> {
    eventually("the module's Events published", WAIT, || async {
        let queued = reconciler_metric("wasmop_module_events_queued", reconciler)?;
        Ok((queued == 0.0).then_some(()))
    })
    .await
}

/// Events in the test's namespace with this reason (events.k8s.io/v1).
pub async fn events(client: &Client, ns: &str, reason: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

/// The Events of a cluster-scoped object (recorded in `default`).
pub async fn cluster_events(client: &Client, name: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect())
}

/// Waits for an Event with `reason` on WasmReconciler `name`. The host writes the status first
/// and the Event after it, so a test that saw the status change waits for the Event rather than
/// reading the Events once.
pub async fn wr_event(client: &Client, name: &str, reason: &str) -> anyhow::Result<Event> {
    eventually(&format!("a {reason} Event on {name}"), WAIT, || async {
        Ok(cluster_events(client, name)
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason)))
    })
    .await
}

/// Waits for an Event in namespace `ns` with `reason` that `wanted` accepts (Events are written
/// after the change they tell of: waited for, not read once).
pub async fn ns_event(
    client: &Client,
    ns: &str,
    reason: &str,
    wanted: impl Fn(&Event) -> bool,
) -> anyhow::Result<Event> {
    let wanted = &wanted;
    eventually(&format!("a {reason} Event in {ns}"), WAIT, || async move {
        Ok(events(client, ns, reason).await?.into_iter().find(wanted))
    })
    .await
}

/// A condition of a WasmReconciler: (status, reason, message).
pub async fn wr_condition(
    client: &Client,
    name: &str,
    type_: &str,
) -> anyhow::Result<Option<(String, String, String)>> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    let wr = api.get(name).await?;
    Ok(wr
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
        .map(|c| (c.status, c.reason, c.message)))
}

/// Apps (the image-updater example's kind) in namespace `ns`.
pub fn apps(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.wasmop.dev", "v1", "App"),
        "apps",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// The stdout and stderr of a command that ran as `what`, or an error with them when it failed.
pub fn output_of(out: &std::process::Output, what: &str) -> anyhow::Result<String> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    Ok(text)
}

/// The documented patch of deploy/kustomization.yaml that admits the API server's address range
/// to the webhook port (its comment from `# patches:` on, uncommented).
pub fn api_server_cidr_patch() -> anyhow::Result<String> {
    let base = std::fs::read_to_string(repo().join("deploy/kustomization.yaml"))?;
    let patch: String = base
        .lines()
        .skip_while(|l| *l != "# patches:")
        .take_while(|l| l.starts_with('#'))
        .map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or("")))
        .collect();
    anyhow::ensure!(patch.contains("cidr: 10.0.0.0/24"), "{patch}");
    Ok(patch)
}

/// App `name` of `replicas` replicas of `image` on port 8080.
pub fn new_app(name: &str, image: &str, replicas: i64) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": image, "replicas": replicas, "port": 8080}
    }))
    .unwrap_or_else(|e| panic!("app literal: {e}"))
}

/// Widgets (the misbehave guest's kind) in namespace `ns`.
pub fn widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// Registers `module` as an image-updater reconciler `<namespace>-<name>` for the test: the
/// CRDs, the module in ConfigMap `name`, ServiceAccount `name` (allowed to write Services when
/// `services`), and the WasmReconciler with `extra` spec fields. Returns the reconciler's name
/// and the module's sha256.
pub async fn image_updater(
    env: &TestEnv,
    name: &str,
    module: &str,
    services: bool,
    extra: Value,
) -> anyhow::Result<(String, String)> {
    register(
        env,
        name,
        module,
        ("example.wasmop.dev/v1", "App"),
        &[("apps/v1", "Deployment"), ("v1", "Service")],
        image_updater_rules(services),
        extra,
    )
    .await
}

/// The image-updater example as reconciler `<namespace>-<name>`, allowed to write Services, with
/// no extra spec fields (see [`image_updater`]).
pub async fn updater(env: &TestEnv, name: &str) -> anyhow::Result<(String, String)> {
    image_updater(
        env,
        name,
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        serde_json::json!({}),
    )
    .await
}

/// Registers `module` (a build of the misbehave guest) as a Widget reconciler
/// `<namespace>-<name>`, as [`image_updater`] does.
pub async fn widget_reconciler(
    env: &TestEnv,
    name: &str,
    module: &str,
    extra: Value,
) -> anyhow::Result<(String, String)> {
    register(
        env,
        name,
        module,
        ("test.wasmop.dev/v1", "Widget"),
        &[("v1", "ConfigMap")],
        widget_rules(),
        extra,
    )
    .await
}

async fn register(
    env: &TestEnv,
    name: &str,
    module: &str,
    primary: (&str, &str),
    owns: &[(&str, &str)],
    rules: Value,
    extra: Value,
) -> anyhow::Result<(String, String)> {
    install_crds(&env.client).await?;
    let sha = push_module(&env.client, &env.namespace, name, module).await?;
    service_account(&env.client, &env.namespace, name, rules).await?;
    let wr = format!("{}-{name}", env.namespace);
    apply_reconciler(
        &env.client,
        &reconciler(env, &wr, name, primary, owns, name, extra),
    )
    .await?;
    Ok((wr, sha))
}

/// Starts a host in this process as [`start_host`] does, with `configure` applied to its
/// options (servers, limits).
pub async fn start_host_with(
    env: &TestEnv,
    configure: impl FnOnce(&mut HostOptions),
) -> anyhow::Result<Host> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut options = HostOptions {
        kubeconfig: Some(env.kubeconfig().to_path_buf()),
        selector: Some(format!("wasmop.dev/test={}", env.namespace)),
        instance: format!("e2e-{}", env.namespace),
        ..HostOptions::default()
    };
    configure(&mut options);
    Ok(Host::start(options).await?)
}

/// The YAML documents of an example's `k8s/<file>`.
pub fn example(name: &str, file: &str) -> anyhow::Result<Vec<Value>> {
    yaml_docs(&repo().join("examples").join(name).join("k8s").join(file))
}

/// Applies an example's rbac.yaml for a test: namespaced objects move to the test's namespace
/// (except those in `default`, where cluster-scoped objects' Events go), and cluster-scoped
/// objects and objects in `default` get the namespace as a suffix so parallel tests do not share
/// them. Returns the ServiceAccount's name.
pub async fn apply_rbac(env: &TestEnv, example_name: &str) -> anyhow::Result<String> {
    let ns = env.namespace.as_str();
    let mut sa_name = None;
    for mut doc in example(example_name, "rbac.yaml")? {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let in_default = doc["metadata"]["namespace"] == "default";
        let renamed = if kind.starts_with("Cluster") || in_default {
            format!("{name}-{ns}")
        } else {
            name.clone()
        };
        doc["metadata"]["name"] = json!(renamed);
        if !in_default && doc["metadata"].get("namespace").is_some() {
            doc["metadata"]["namespace"] = json!(ns);
        }
        // (`get_mut`: indexing a Value mutably would insert the missing key.)
        if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
            for s in subjects {
                s["namespace"] = json!(ns);
            }
        }
        if doc.get("roleRef").is_some() {
            let r = doc["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if doc["roleRef"]["kind"] == "ClusterRole" || in_default {
                doc["roleRef"]["name"] = json!(format!("{r}-{ns}"));
            }
        }
        let target_ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let c = env.client.clone();
        match kind.as_str() {
            "Namespace" => continue,
            "ServiceAccount" => {
                sa_name = Some(renamed.clone());
                Api::<ServiceAccount>::namespaced(c, &target_ns)
                    .patch(&renamed, &apply_params(), &Patch::Apply(&doc))
                    .await?;
            }
            "Role" => {
                Api::<Role>::namespaced(c, &target_ns)
                    .patch(&renamed, &apply_params(), &Patch::Apply(&doc))
                    .await?;
            }
            "RoleBinding" => {
                Api::<RoleBinding>::namespaced(c, &target_ns)
                    .patch(&renamed, &apply_params(), &Patch::Apply(&doc))
                    .await?;
            }
            "ClusterRole" => {
                Api::<ClusterRole>::all(c)
                    .patch(&renamed, &apply_params(), &Patch::Apply(&doc))
                    .await?;
            }
            "ClusterRoleBinding" => {
                Api::<ClusterRoleBinding>::all(c)
                    .patch(&renamed, &apply_params(), &Patch::Apply(&doc))
                    .await?;
            }
            other => anyhow::bail!("unexpected {other} in {example_name}/k8s/rbac.yaml"),
        }
    }
    sa_name.ok_or_else(|| anyhow::anyhow!("{example_name}/k8s/rbac.yaml has no ServiceAccount"))
}

/// Waits (up to [`WAIT`]) until WasmReconciler `wr` reports `Ready=True`.
pub async fn wait_wr_ready(client: &Client, wr: &str) -> anyhow::Result<()> {
    eventually(&format!("{wr} Ready"), WAIT, || async {
        Ok(wr_condition(client, wr, "Ready")
            .await?
            .filter(|(status, _, _)| status == "True")
            .map(|_| ()))
    })
    .await
}

/// A build of the tenant example (Python), see [`tenant_module`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantBuild {
    /// examples/tenant as it is.
    First,
    /// The same with a default memory request of 256Mi instead of 128Mi: a second version whose
    /// reconciles differ visibly (the LimitRange), for hot swaps.
    Second,
}

/// The tenant example built into a component with the pinned componentize-py
/// (scripts/python-module.sh, which installs the tools once and skips a build whose inputs did
/// not change), under `<target>/tmp/python/`. Returns the component's path.
///
/// # Errors
/// The script's own message when Python, the tools or the build fail: never a skip.
pub async fn tenant_module(build: TenantBuild) -> anyhow::Result<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python");
    let example = repo().join("examples/tenant");
    let (app_dir, app, out) = match build {
        TenantBuild::First => (example.clone(), "tenant", dir.join("tenant.wasm")),
        TenantBuild::Second => {
            // The example's files plus a module that imports it and changes one default.
            let app_dir = dir.join("tenant-second");
            std::fs::create_dir_all(&app_dir)?;
            for file in ["tenant.py", "quantity.py"] {
                std::fs::copy(example.join(file), app_dir.join(file))?;
            }
            std::fs::write(
                app_dir.join("tenant_second.py"),
                "\"\"\"The tenant example with a default memory request of 256Mi: a second version.\"\"\"\n\
                 import tenant\n\
                 tenant.DEFAULT_REQUESTS[\"memory\"] = \"256Mi\"\n\
                 from tenant import Guest  # noqa: E402,F401\n",
            )?;
            (app_dir, "tenant_second", dir.join("tenant-second.wasm"))
        }
    };
    let output = tokio::process::Command::new("bash")
        .arg(repo().join("scripts/python-module.sh"))
        .arg("build")
        .arg(&app_dir)
        .arg(app)
        .arg(&out)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "building the tenant component ({build:?}) with scripts/python-module.sh failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(out)
}

/// Pushes `bytes` to the test registry as `repository:tag`, as `wasmop push --oci` does;
/// returns the manifest digest.
pub async fn oci_push(
    registry: &wasmop_testenv::Registry,
    repo_tag: &str,
    bytes: Vec<u8>,
) -> anyhow::Result<String> {
    let access = wasmop::modules::oci::Access {
        auth: Some((registry.username.clone(), registry.password.clone())),
        ca_pem: Some(registry.ca_pem.clone()),
    };
    let reference = format!("{}/{repo_tag}", registry.host);
    Ok(wasmop::modules::oci::push(
        &reference,
        bytes,
        std::collections::BTreeMap::new(),
        &access,
    )
    .await?)
}

/// Creates the `kubernetes.io/dockerconfigjson` Secret `name` in the test's namespace with the
/// registry's credentials.
pub async fn oci_pull_secret(
    env: &TestEnv,
    registry: &wasmop_testenv::Registry,
    name: &str,
) -> anyhow::Result<()> {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": env.namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": registry.docker_config_json(&registry.password)},
    }))?;
    let api: Api<k8s_openapi::api::core::v1::Secret> = env.api();
    api.patch(name, &apply_params(), &Patch::Apply(&secret))
        .await?;
    Ok(())
}

/// The `spec.module` naming `reference` (pinned by digest) in the test registry, with the pull
/// Secret `secret` and the registry's CA.
pub fn oci_module(registry: &wasmop_testenv::Registry, reference: &str, secret: &str) -> Value {
    json!({"oci": {"reference": reference, "pullSecret": secret, "caBundle": registry.ca_pem}})
}

/// Registers the tenant example (cluster-scoped Tenants, Python) with its own k8s/ files
/// rewritten for the test: CRD, RBAC (ServiceAccount in the test's namespace), and its
/// wasmreconciler.yaml named `<namespace>-tenant`, labelled for the test's host, with `module`
/// as `spec.module`. Returns the WasmReconciler's name.
pub async fn register_tenant(env: &TestEnv, module: Value) -> anyhow::Result<String> {
    let ns = env.namespace.as_str();
    install_crds(&env.client).await?;
    apply_crds(&env.client, example("tenant", "crd.yaml")?).await?;
    let sa = apply_rbac(env, "tenant").await?;
    let mut wr = example("tenant", "wasmreconciler.yaml")?.remove(0);
    let name = format!("{ns}-tenant");
    wr["metadata"] = json!({"name": name, "labels": {"wasmop.dev/test": ns}});
    wr["spec"]["module"] = module;
    wr["spec"]["serviceAccount"] = json!({"namespace": ns, "name": sa});
    apply_reconciler(&env.client, &wr).await?;
    Ok(name)
}

/// Tenants (the tenant example's cluster-scoped kind).
pub fn tenants(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.wasmop.dev", "v1", "Tenant"),
        "tenants",
    );
    Api::all_with(client.clone(), &ar)
}

/// `to` as a path relative to directory `from` (kustomize takes no absolute resource paths).
pub fn relative_to(from: &Path, to: &Path) -> anyhow::Result<String> {
    let (from, to) = (from.canonicalize()?, to.canonicalize()?);
    let up = from.components().count().saturating_sub(1);
    let down = to
        .strip_prefix("/")
        .map_err(|_| anyhow::anyhow!("{} is not absolute", to.display()))?;
    Ok(format!("{}{}", "../".repeat(up), down.display()))
}

/// The `wasmop` binary in the test binary's target directory, built once per test process (a
/// no-op when it is fresh), for tests that run the host as a child process.
pub async fn wasmop_binary() -> anyhow::Result<&'static Path> {
    static BIN: tokio::sync::OnceCell<std::path::PathBuf> = tokio::sync::OnceCell::const_new();
    let path = BIN
        .get_or_try_init(|| async {
            // <target>/debug/deps/<test>-<hash> -> <target>
            let exe = std::env::current_exe()?;
            let target = exe
                .ancestors()
                .nth(3)
                .ok_or_else(|| anyhow::anyhow!("unexpected test binary path {}", exe.display()))?
                .to_path_buf();
            let status = wasmop_testenv::cargo::command()
                .args(["build", "-p", "wasmop", "--bin", "wasmop", "--target-dir"])
                .arg(&target)
                .current_dir(repo())
                .status()
                .await?;
            anyhow::ensure!(status.success(), "cargo build -p wasmop failed: {status}");
            Ok::<_, anyhow::Error>(target.join("debug").join("wasmop"))
        })
        .await?;
    Ok(path.as_path())
}

/// Serialises the tests that register a configmap-propagator on the shared control plane
/// (examples, startup): its primary kind is cluster-scoped, so two such WasmReconcilers at once
/// conflict (the later is refused, `Ready=False` reason `Conflict`), as they would in a real
/// cluster. Each such test [`retire`]s its WasmReconciler before it ends.
pub async fn propagator_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static PROPAGATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    PROPAGATOR.lock().await
}

/// Removes a test's WasmReconciler for good once its host has stopped: deleted, its finalizers
/// cleared by the admin (no host runs to release them), and gone, so the next test's
/// propagator does not conflict with it.
pub async fn retire(env: &TestEnv, wr: &str) -> anyhow::Result<()> {
    let api: Api<WasmReconciler> = Api::all(env.client.clone());
    api.delete(wr, &DeleteParams::default()).await?;
    let clear = json!({"metadata": {"finalizers": null}});
    if let Err(e) = api
        .patch(wr, &PatchParams::default(), &Patch::Merge(&clear))
        .await
    {
        anyhow::ensure!(
            matches!(&e, kube::Error::Api(s) if s.code == 404),
            "clearing the finalizers of WasmReconciler {wr}: {e}"
        );
    }
    eventually(&format!("WasmReconciler {wr} gone"), WAIT, || async {
        Ok(api.get_opt(wr).await?.is_none().then_some(()))
    })
    .await
}

/// The Widgets of the rollback scenarios: the self-check samples the first primaries by name
/// ("a-..."), which the misbehave guest's fragile build handles; the "z-..." ones (labelled
/// `test.wasmop.dev/fragile`) make it panic.
pub const FRAGILE_SET: [&str; 6] = ["a-1", "a-2", "a-3", "z-1", "z-2", "z-3"];

/// A rollback scenario's start: the misbehave guest registered as `<namespace>-widgets` with a
/// rollout watching 6 reconciles at a 50 % failure threshold, a host, and the Widgets of
/// [`FRAGILE_SET`] each reconciled (its ConfigMap `<name>-out` written). Returns the
/// reconciler's name, the good module's sha256 and the host.
pub async fn rollback_setup(env: &TestEnv) -> anyhow::Result<(String, String, Host)> {
    let (wr, good) = widget_reconciler(
        env,
        "widgets",
        wasmop_test_modules::MISBEHAVE,
        json!({"rollout": {"watchReconciles": 6, "failureThresholdPercent": 50}}),
    )
    .await?;
    let host = start_host(env, None).await?;
    let widgets = widgets(&env.client, &env.namespace);
    for name in FRAGILE_SET {
        let mut labels = json!({});
        if name.starts_with('z') {
            labels["test.wasmop.dev/fragile"] = json!("true");
        }
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": name, "labels": labels}, "spec": {"mode": "good"}
        }))?;
        widgets.create(&PostParams::default(), &w).await?;
    }
    let cms: Api<ConfigMap> = env.api();
    eventually("all six widgets reconciled", WAIT, || async {
        let mut n = 0;
        for w in FRAGILE_SET {
            if cms.get_opt(&format!("{w}-out")).await?.is_some() {
                n += 1;
            }
        }
        Ok((n == FRAGILE_SET.len()).then_some(()))
    })
    .await?;
    Ok((wr, good, host))
}

/// Sends an AdmissionReview for creating `app` to the webhook at `addr`; returns its response.
pub async fn review(
    addr: SocketAddr,
    wr: &str,
    ns: &str,
    app: &DynamicObject,
) -> anyhow::Result<Value> {
    let mut config = kube::Config::new(format!("https://{addr}").parse()?);
    config.accept_invalid_certs = true;
    let client = Client::try_from(config)?;
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-1",
            "kind": {"group": "example.wasmop.dev", "version": "v1", "kind": "App"},
            "resource": {"group": "example.wasmop.dev", "version": "v1", "resource": "apps"},
            "name": app.name_any(), "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": app,
        }
    });
    let request = http::Request::post(format!("/validate/{wr}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body)?)?;
    Ok(serde_json::from_str(&client.request_text(request).await?)?)
}

/// A follower's answer to a review of `app`, once it has one with its module: a follower just
/// started answers 503 until its caches listed, and a review that came before its read of the
/// module finished is answered by the failure policy ("still being read", within the review's
/// budget) while the read goes on. Both are waited for.
pub async fn follower_review(
    addr: SocketAddr,
    wr: &str,
    ns: &str,
    app: &DynamicObject,
) -> anyhow::Result<Value> {
    eventually("the follower answers with its module", WAIT, || async {
        let answer = review(addr, wr, ns, app).await.ok();
        Ok(answer.filter(|a| {
            let message = a["response"]["status"]["message"].as_str().unwrap_or("");
            !message.contains("still being read")
        }))
    })
    .await
}

/// Starts a host in this process that never leads (someone else holds its Lease `held` for an
/// hour) and serves the admission webhook on a free port, with `configure` applied to its
/// options.
pub async fn follower(
    env: &TestEnv,
    configure: impl FnOnce(&mut HostOptions),
) -> anyhow::Result<Host> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("held".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("someone-else".into()),
            lease_duration_seconds: Some(3600),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    };
    let leases: Api<Lease> = env.api();
    leases
        .patch(
            "held",
            &PatchParams::apply("wasmop-e2e").force(),
            &Patch::Apply(&lease),
        )
        .await?;
    let mut elect = LeaderConfig::new(Some(env.namespace.clone()), Some("held".into()));
    elect.identity = format!("follower-{}", env.namespace);
    start_host_with(env, |o| {
        o.instance = format!("e2e-follower-{}", env.namespace);
        o.webhook = Some(WebhookOptions::new(SocketAddr::from(([127, 0, 0, 1], 0))));
        o.leader = Some(elect);
        configure(o);
    })
    .await
}
