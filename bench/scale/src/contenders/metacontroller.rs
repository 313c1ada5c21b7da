//! wasmop-metacontroller: the image-updater logic as a Metacontroller sync hook
//! (bench/scale/hooks/image-updater.js, fission-style JavaScript), built unchanged into a hook
//! module with `scripts/js-module.sh hook` and served through a CompositeController with
//! `spec.wasmop` (bench/scale/hooks/image-updater.yaml) by the same `wasmop run`, with the same
//! flags, as the `wasmop` row: what Metacontroller compatibility costs against the native module.
//!
//! As a user moving a controller from Metacontroller does (docs/operating.md, "Coming from
//! Metacontroller"): the WasmReconciler and CompositeController CRDs, the hook's identity (the
//! `wasmop` row's ServiceAccount and Role, examples/image-updater/k8s/rbac.yaml), `wasmop push
//! --oci` of the hook (~12 MB, more than a ConfigMap holds) to a registry of the run's own
//! (wasmop-testenv's, TLS and basic auth, as tests/e2e/metacontroller.rs uses it), its pull
//! Secret in the host's namespace, and the CompositeController naming the hook by digest.
//!
//! # Guarantees
//! - [`start`] returns once the host's `/readyz` answers 200, the WasmReconciler
//!   `compositecontroller-image-updater` the host made for the controller is `Ready`, and the
//!   hook module's optimized build serves (as for the `wasmop` row).
//! - The registry lives as long as the returned [`Running`] (it is stopped with the host).
//!
//! # Errors
//! [`Error::Controller`] when a step fails (the hook build, the push, the host), with the
//! host's log when it started.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use wasmop_testenv::Registry;

use super::{Binaries, Running, Tuning, wasmop};
use crate::cluster::{Cluster, NAMESPACE, repo, yaml_docs};
use crate::{Error, Result};

/// The contender's name in errors.
const CONTENDER: &str = "wasmop-metacontroller";
/// The CompositeController's name (bench/scale/hooks/image-updater.yaml).
pub const CONTROLLER: &str = "image-updater";
/// The WasmReconciler the host makes for it.
pub const RECONCILER: &str = "compositecontroller-image-updater";
/// The pull Secret of the run's registry.
const PULL_SECRET: &str = "bench-registry";
/// How long the hook module may take to load (pull, check, compile on a busy machine).
const LOAD: Duration = Duration::from_secs(300);

fn failed(detail: String) -> Error {
    Error::Controller {
        contender: CONTENDER.into(),
        detail,
    }
}

/// The hook's source.
pub fn hook_source() -> PathBuf {
    repo().join("bench/scale/hooks/image-updater.js")
}

/// Builds the hook into `<dir>/hooks/image-updater.wasm` with `scripts/js-module.sh hook`
/// (skipped by the script when its inputs did not change) and returns the module's path.
///
/// # Errors
/// See the module docs (node, or the pinned JavaScript tools, missing; the build failing).
pub async fn build_hook(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("hooks").join("image-updater.wasm");
    let script = repo().join("scripts/js-module.sh");
    eprintln!(
        "[bench] building the image-updater hook ({} -> {})",
        hook_source().display(),
        out.display()
    );
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .arg("hook")
        .arg(hook_source())
        .arg(&out)
        .output()
        .await
        .map_err(Error::io("running", &script))?;
    if !output.status.success() {
        return Err(failed(format!(
            "scripts/js-module.sh hook failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(out)
}

/// The namespace the host reads pull Secrets from when run as the bench runs it (no
/// `--namespace`): `POD_NAMESPACE`, else a pod's ServiceAccount namespace, else `default`
/// (host/src/modules/oci.rs `OciOptions::namespace`).
fn host_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// `wasmop push --oci` of the hook to the run's registry; returns the reference by digest.
async fn push(binaries: &Binaries, registry: &Registry, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    let ca = dir.join("registry-ca.pem");
    std::fs::write(&ca, &registry.ca_pem).map_err(Error::io("writing", &ca))?;
    let target = format!("{}/hooks/image-updater:bench", registry.host);
    let push = tokio::process::Command::new(&binaries.wasmop)
        .arg("push")
        .arg(&binaries.hook)
        .args(["--oci", &target, "--ca-bundle"])
        .arg(&ca)
        .env("WASMOP_REGISTRY_USERNAME", &registry.username)
        .env("WASMOP_REGISTRY_PASSWORD", &registry.password)
        .output()
        .await
        .map_err(Error::io("running", &binaries.wasmop))?;
    let stdout = String::from_utf8_lossy(&push.stdout);
    let pinned = stdout.lines().last().map(str::trim).unwrap_or_default();
    if !push.status.success() || !pinned.contains("@sha256:") {
        return Err(failed(format!(
            "wasmop push --oci {target} failed ({}): {stdout}{}",
            push.status,
            String::from_utf8_lossy(&push.stderr)
        )));
    }
    Ok(pinned.to_string())
}

/// The CompositeController of bench/scale/hooks/image-updater.yaml with the run's settings and
/// the hook's reference.
fn controller(tuning: Tuning, reference: &str, ca_pem: &str) -> Result<Value> {
    let path = repo().join("bench/scale/hooks/image-updater.yaml");
    let mut docs = yaml_docs(&path)?;
    let mut cc = docs
        .pop()
        .filter(|d| d["kind"] == "CompositeController")
        .ok_or_else(|| failed(format!("{} has no CompositeController", path.display())))?;
    cc["spec"]["resyncPeriodSeconds"] = json!(tuning.resync.as_secs().max(1));
    cc["spec"]["wasmop"]["limits"]["concurrency"] = json!(tuning.concurrency);
    cc["spec"]["wasmop"]["module"] = json!({"oci": {
        "reference": reference, "pullSecret": PULL_SECRET, "caBundle": ca_pem
    }});
    Ok(cc)
}

/// Whether the WasmReconciler serving the controller is `Ready`; its conditions as text.
async fn reconciler_ready(api: &Api<DynamicObject>) -> (bool, String) {
    match api.get_opt(RECONCILER).await {
        Ok(Some(wr)) => {
            let conditions = &wr.data["status"]["conditions"];
            let ready = conditions.as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            (ready, conditions.to_string())
        }
        Ok(None) => (false, format!("no WasmReconciler {RECONCILER} yet")),
        Err(e) => (false, e.to_string()),
    }
}

/// Sets up the hook and its controller and starts the host.
///
/// # Errors
/// See the module docs.
pub async fn start(
    cluster: &Cluster,
    binaries: &Binaries,
    tuning: Tuning,
    dir: &Path,
) -> Result<Running> {
    cluster
        .apply_yaml(&repo().join("deploy/crds/wasmreconciler.yaml"))
        .await?;
    cluster
        .apply_yaml(&repo().join("deploy/components/metacontroller/crds.yaml"))
        .await?;
    cluster
        .apply_yaml(&repo().join("examples/image-updater/k8s/rbac.yaml"))
        .await?;
    let registry = Registry::start()
        .await
        .map_err(|e| failed(format!("the registry: {e}")))?;
    let reference = push(binaries, &registry, dir).await?;
    eprintln!("[bench] {CONTENDER}: hook pushed as {reference}");
    let secrets = host_namespace();
    cluster.namespaces(std::slice::from_ref(&secrets)).await?;
    cluster
        .apply(vec![json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": PULL_SECRET, "namespace": secrets},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": registry.docker_config_json(&registry.password)},
        })])
        .await?;
    cluster
        .apply(vec![controller(tuning, &reference, &registry.ca_pem)?])
        .await?;
    let host = wasmop::serve(
        &binaries.wasmop,
        wasmop::host_args(cluster, dir, wasmop::WEBHOOK, &[]),
        dir,
    )
    .await?;
    // `/readyz` may have answered before the host made the WasmReconciler: wait for it to be
    // Ready (its module loaded, caches synced), then for `/readyz` again.
    let reconcilers: Api<DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("wasmop.dev", "v1alpha1", "WasmReconciler"),
            "wasmreconcilers",
        ),
    );
    let began = Instant::now();
    loop {
        let (ready, conditions) = reconciler_ready(&reconcilers).await;
        if ready && matches!(host.readyz().await, Ok((200, _))) {
            break;
        }
        if began.elapsed() > LOAD {
            return Err(failed(format!(
                "WasmReconciler {RECONCILER} not Ready within {LOAD:?} ({conditions}); log:\n{}",
                host.log_text()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "[bench] {CONTENDER}: CompositeController {CONTROLLER} served by WasmReconciler {RECONCILER} for namespace {NAMESPACE}"
    );
    Ok(Running::Hook {
        host: Box::new(host),
        registry: Box::new(registry),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use k8s_openapi::api::apps::v1::Deployment;

    use super::*;
    use crate::native;

    fn app(spec: Value) -> Value {
        json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App",
            "metadata": {"name": "web", "namespace": "demo", "uid": "u-1", "generation": 2},
            "spec": spec,
        })
    }

    fn deployment(image: &str, status: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "demo", "generation": 4},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "web"}},
                "template": {"spec": {"containers": [{"name": "app", "image": image}]}},
            },
            "status": status,
        })
    }

    /// The hook's answers to sync requests for `(app, deployment)`, from `node`.
    fn hook_answers(cases: &[(Value, Option<Value>)]) -> Vec<Value> {
        let requests: Vec<Value> = cases
            .iter()
            .map(|(app, d)| {
                let deployments = match d {
                    Some(d) => json!({"web": d}),
                    None => json!({}),
                };
                json!({"parent": app, "children": {"Deployment.apps/v1": deployments, "Service.v1": {}},
                    "related": {}, "finalizing": false})
            })
            .collect();
        let script = r#"
            const hook = require(process.argv[1]);
            let input = '';
            process.stdin.on('data', (d) => { input += d; });
            process.stdin.on('end', async () => {
              const out = [];
              for (const body of JSON.parse(input)) {
                const answer = await hook({request: {body}});
                if (answer.status !== 200) throw new Error(answer.body);
                out.push(answer.body);
              }
              process.stdout.write(JSON.stringify(out));
            });
        "#;
        let mut child = Command::new("node")
            .args(["-e", script])
            .arg(hook_source())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("node (Node.js 20+) is needed: {e}"));
        child
            .stdin
            .take()
            .map(|mut s| s.write_all(Value::Array(requests).to_string().as_bytes()))
            .unwrap_or_else(|| panic!("no stdin"))
            .unwrap_or_else(|e| panic!("{e}"));
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "node failed: {}", out.status);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A native child as the module returned it: without what the bench's native runner adds
    /// as the host does (namespace, reconciler label, ownerReference).
    fn as_returned(mut child: Value) -> Value {
        if let Some(meta) = child["metadata"].as_object_mut() {
            meta.remove("namespace");
            meta.remove("ownerReferences");
        }
        if let Some(labels) = child["metadata"]["labels"].as_object_mut() {
            labels.remove(native::RECONCILER_LABEL);
        }
        child
    }

    /// The hook written for the `wasmop-metacontroller` row answers exactly as the native
    /// module: the same children, status fields, conditions, and a 5 s resync exactly when the
    /// native module asks for its 5 s requeue; over new Apps, rollouts, finished and unavailable
    /// rollouts, and non-default specs.
    #[test]
    fn the_hook_answers_as_the_native_module() {
        let ready = |n: i64, available: &str| {
            json!({"observedGeneration": 4, "replicas": n, "readyReplicas": n, "updatedReplicas": n,
                "conditions": [{"type": "Available", "status": available}]})
        };
        let spec = json!({"image": "nginx:1.28", "replicas": 3, "port": 8080, "track": "stable"});
        let cases: Vec<(Value, Option<Value>)> = vec![
            (app(spec.clone()), None),
            (
                app(json!({"image": "nginx:1.28"})),
                Some(deployment("nginx:1.28", ready(1, "True"))),
            ),
            (
                app(spec.clone()),
                Some(deployment("nginx:1.27", ready(3, "True"))),
            ),
            (
                app(spec.clone()),
                Some(deployment("nginx:1.28", ready(3, "True"))),
            ),
            (
                app(spec.clone()),
                Some(deployment("nginx:1.28", ready(2, "False"))),
            ),
            (
                app(spec.clone()),
                Some(deployment("nginx:1.28", json!({"observedGeneration": 3}))),
            ),
            (
                app(json!({"image": "busybox", "replicas": 0, "port": 9000, "track": "canary"})),
                Some(deployment("busybox", json!({}))),
            ),
        ];
        let answers = hook_answers(&cases);
        assert_eq!(answers.len(), cases.len());
        for ((app, observed), answer) in cases.iter().zip(&answers) {
            let observed: Option<Deployment> = observed
                .clone()
                .map(|d| serde_json::from_value(d).unwrap_or_else(|e| panic!("{e}")));
            let native =
                native::reconcile(app, observed.as_ref()).unwrap_or_else(|e| panic!("{e}"));
            let children: Vec<Value> = native.children.into_iter().map(as_returned).collect();
            assert_eq!(answer["children"], json!(children), "children of {app}");
            let status = native.status.unwrap_or_else(|| panic!("no native status"));
            let mut fields = answer["status"].clone();
            let conditions = fields
                .as_object_mut()
                .and_then(|f| f.remove("conditions"))
                .unwrap_or_default();
            assert_eq!(fields, status.fields, "status of {app}");
            let native_conditions: Vec<Value> = status
                .conditions
                .iter()
                .map(|c| {
                    json!({"type": c.type_, "status": format!("{:?}", c.status),
                        "reason": c.reason, "message": c.message})
                })
                .collect();
            assert_eq!(conditions, json!(native_conditions), "conditions of {app}");
            assert_eq!(
                answer.get("resyncAfterSeconds").and_then(Value::as_f64),
                native.requeue.map(|d| d.as_secs_f64()),
                "requeue of {app}"
            );
        }
    }
}
