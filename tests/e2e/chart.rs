//! The Helm chart (deploy/helm/wasmop) against the kustomize install (deploy/): one source of
//! truth, checked object by object. `helm lint`, the values schema refusing bad values, and
//! (called from `deploy`'s image test, which builds the image once) `helm install`, `upgrade`
//! and `uninstall` of the image from the test registry on a real control plane.
//!
//! Helm is built from its Go module and cached like the other tools
//! (`wasmop_testenv::assets::helm_binary`); kustomize is kubectl's (`kubectl kustomize`).
//!
//! # What the comparison allows
//! - The Namespace: `kubectl apply -k deploy/` creates `wasmop-system`; Helm does not own its
//!   release namespace (`kubectl apply -f deploy/namespace.yaml` first, docs/operating.md).
//! - Helm's own labels (`app.kubernetes.io/instance`, `managed-by`, `version`, `helm.sh/chart`)
//!   on the chart's objects.
//! - The CRD's kustomize labels: the chart's crds/ are not templated (Helm's CRD convention);
//!   host/tests/crds.rs holds both copies to the Rust types.
//! - Numbers: `30.0` and `30` are the same number (kustomize re-encodes the CRD's).
//! - kustomize's `namespace:` on the admission policy and its binding: kustomize does not know
//!   they are cluster-scoped; the API server and kubectl ignore it there.
//! - `helm.sh/resource-policy: keep` on the chart's templated CRDs (Metacontroller mode's
//!   Composite- and DecoratorController CRDs), which `helm uninstall` must not delete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use anyhow::Context;
use serde_json::Value;

/// The labels only Helm puts on an object.
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];
/// The annotations only Helm puts on an object.
const HELM_ANNOTATIONS: &[&str] = &["helm.sh/resource-policy"];
/// The cluster-scoped kinds kustomize's `namespace:` does not know to leave alone.
const UNKNOWN_TO_KUSTOMIZE: &[&str] = &[
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];
/// The labels deploy/kustomization.yaml puts on every object (so on the CRD too).
const KUSTOMIZE_LABELS: &[&str] = &["app.kubernetes.io/name", "app.kubernetes.io/part-of"];

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/wasmop")
}

/// The helm binary (built from its Go module on first use).
pub async fn helm_binary() -> anyhow::Result<PathBuf> {
    Ok(tokio::task::spawn_blocking(wasmop_testenv::assets::helm_binary).await??)
}

/// A helm command whose configuration, cache and data live in `home` (never the user's).
pub fn helm_command(helm: &Path, home: &Path) -> Command {
    let mut cmd = Command::new(helm);
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .current_dir(repo());
    cmd
}

/// Runs `cmd`; its stdout, or an error with its output.
pub fn run(mut cmd: Command) -> anyhow::Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The objects of a multi-document YAML stream.
fn documents(yaml: &str) -> anyhow::Result<Vec<Value>> {
    Ok(serde_saphyr::from_str_multiple::<Value, Vec<Value>>(yaml)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

/// `helm template wasmop` of the chart into wasmop-system, CRDs included, with `set` values.
fn helm_template(helm: &Path, home: &Path, set: &[&str]) -> anyhow::Result<Vec<Value>> {
    let mut cmd = helm_command(helm, home);
    cmd.args(["template", "wasmop"]).arg(chart_dir()).args([
        "--namespace",
        "wasmop-system",
        "--include-crds",
    ]);
    for value in set {
        cmd.args(["--set", value]);
    }
    documents(&run(cmd)?)
}

/// `kubectl kustomize` of deploy/ with `components` (names under deploy/components/) and extra
/// kustomization lines, through an overlay in `work`.
fn kustomize(
    kubectl: &Path,
    work: &Path,
    components: &[&str],
    extra: &str,
) -> anyhow::Result<Vec<Value>> {
    let overlay = tempfile::tempdir_in(work)?;
    let deploy = relative_to(overlay.path(), &repo().join("deploy"))?;
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {deploy}\n"
    );
    if !components.is_empty() {
        text.push_str("components:\n");
        for c in components {
            text.push_str(&format!("- {deploy}/components/{c}\n"));
        }
    }
    text.push_str(extra);
    std::fs::write(overlay.path().join("kustomization.yaml"), text)?;
    let mut cmd = Command::new(kubectl);
    cmd.arg("kustomize").arg(overlay.path());
    documents(&run(cmd)?)
}

/// Removes the labels in `strip` from `doc` (and its `labels` map when that leaves it empty).
fn strip_labels(doc: &mut Value, strip: &[&str]) {
    let Some(metadata) = doc["metadata"].as_object_mut() else {
        return;
    };
    if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
        labels.retain(|k, _| !strip.contains(&k.as_str()));
        if labels.is_empty() {
            metadata.remove("labels");
        }
    }
}

/// Removes the annotations in `strip` from `doc` (and its `annotations` map when that leaves
/// it empty).
fn strip_annotations(doc: &mut Value, strip: &[&str]) {
    let Some(metadata) = doc["metadata"].as_object_mut() else {
        return;
    };
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.retain(|k, _| !strip.contains(&k.as_str()));
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
}

/// `doc` with every whole floating-point number as an integer: the CRD generator writes
/// `maximum: 30.0`, kustomize re-encodes it as `30`, and both mean the same to the API server.
fn whole_numbers(doc: &mut Value) {
    match doc {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                && n.is_f64()
            {
                *doc = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// Objects by `kind namespace/name`, with the labels in `strip` removed (and an emptied
/// `labels` map with them).
fn by_identity(docs: Vec<Value>, strip: &[&str]) -> BTreeMap<String, Value> {
    docs.into_iter()
        .map(|mut doc| {
            strip_labels(&mut doc, strip);
            whole_numbers(&mut doc);
            let key = format!(
                "{} {}/{}",
                doc["kind"].as_str().unwrap_or("?"),
                doc["metadata"]["namespace"].as_str().unwrap_or(""),
                doc["metadata"]["name"].as_str().unwrap_or("?")
            );
            (key, doc)
        })
        .collect()
}

/// Fails with every difference between the chart rendered with `set` and kustomize with
/// `components` and `extra` (see the module docs for what may differ).
fn same_objects(
    tools: &Tools,
    set: &[&str],
    components: &[&str],
    extra: &str,
) -> anyhow::Result<usize> {
    let mut rendered = helm_template(&tools.helm, tools.home(), set)?;
    for doc in &mut rendered {
        if doc["kind"] == "CustomResourceDefinition" {
            strip_annotations(doc, HELM_ANNOTATIONS);
        }
    }
    let chart = by_identity(rendered, HELM_LABELS);
    let mut kustomized = kustomize(&tools.kubectl, tools.home(), components, extra)?;
    let namespaces = kustomized
        .iter()
        .filter(|d| d["kind"] == "Namespace")
        .count();
    anyhow::ensure!(
        namespaces == 1,
        "kustomize rendered {namespaces} Namespaces"
    );
    kustomized.retain(|d| d["kind"] != "Namespace");
    for doc in &mut kustomized {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        if UNKNOWN_TO_KUSTOMIZE.contains(&kind.as_str())
            && let Some(metadata) = doc["metadata"].as_object_mut()
        {
            metadata.remove("namespace");
        }
        if kind == "CustomResourceDefinition" {
            strip_labels(doc, KUSTOMIZE_LABELS);
        }
    }
    let kustomized = by_identity(kustomized, &[]);
    let mut problems = Vec::new();
    for (key, object) in &kustomized {
        match chart.get(key) {
            None => problems.push(format!("only kustomize renders {key}")),
            Some(rendered) if rendered != object => problems.push(format!(
                "{key} differs:\n  kustomize: {object}\n  chart:     {rendered}"
            )),
            Some(_) => {}
        }
    }
    for key in chart.keys().filter(|k| !kustomized.contains_key(*k)) {
        problems.push(format!("only the chart renders {key}"));
    }
    anyhow::ensure!(
        problems.is_empty(),
        "the chart (--set {set:?}) and kustomize (components {components:?}) drifted:\n{}",
        problems.join("\n")
    );
    Ok(chart.len())
}

/// helm and kubectl, and a directory for Helm's state and overlays.
struct Tools {
    helm: PathBuf,
    kubectl: PathBuf,
    home: tempfile::TempDir,
}

impl Tools {
    async fn get() -> anyhow::Result<Self> {
        let helm = helm_binary().await?;
        let assets = tokio::task::spawn_blocking(wasmop_testenv::Assets::provide).await??;
        Ok(Tools {
            helm,
            kubectl: assets.kubectl,
            home: tempfile::tempdir()?,
        })
    }

    fn home(&self) -> &Path {
        self.home.path()
    }
}

#[tokio::test]
async fn the_chart_renders_what_kustomize_installs() -> anyhow::Result<()> {
    let tools = Tools::get().await?;
    let count = same_objects(&tools, &[], &[], "")?;
    // Everything but the Namespace: the CRD, RBAC (9), Deployment, Service, NetworkPolicy, the
    // admission policy and its binding.
    assert_eq!(count, 15, "the default chart renders {count} objects");
    // The optional parts, each against its kustomize equivalent.
    same_objects(&tools, &["sharding.enabled=true"], &["sharding"], "")?;
    same_objects(
        &tools,
        &["webhook.clientAuth.enabled=true"],
        &["webhook-client-auth"],
        "",
    )?;
    // Metacontroller mode: the objects of deploy/components/metacontroller (its CRD, RBAC and
    // admission policy), so a change of the component that the chart lacks fails here.
    same_objects(
        &tools,
        &["metacontroller.enabled=true"],
        &["metacontroller"],
        "",
    )?;
    // The API server's range: the documented patch of deploy/kustomization.yaml, uncommented.
    let patch = api_server_cidr_patch()?;
    same_objects(
        &tools,
        &["networkPolicy.apiServerCIDRs={10.0.0.0/24}"],
        &[],
        &patch,
    )?;
    // And the chart's CRDs are deploy/'s, byte for byte (host/tests/crds.rs ties deploy/'s to
    // the Rust types).
    assert_eq!(
        std::fs::read_to_string(chart_dir().join("crds/wasmreconciler.yaml"))?,
        std::fs::read_to_string(repo().join("deploy/crds/wasmreconciler.yaml"))?,
        "deploy/helm/wasmop/crds/ differs from deploy/crds/ (make crds writes both)"
    );
    Ok(())
}

#[tokio::test]
async fn the_chart_ships_the_alerts_and_dashboard_of_deploy_monitoring() -> anyhow::Result<()> {
    let tools = Tools::get().await?;
    // The chart's files are deploy/monitoring/'s, byte for byte.
    for (file, copy) in [
        ("alerts.yaml", "files/alerts.yaml"),
        ("dashboard.json", "files/dashboard.json"),
    ] {
        assert_eq!(
            std::fs::read_to_string(chart_dir().join(copy))?,
            std::fs::read_to_string(repo().join("deploy/monitoring").join(file))?,
            "deploy/helm/wasmop/{copy} differs from deploy/monitoring/{file}"
        );
    }
    // Off by default; on, the same objects as `kubectl apply -k deploy/monitoring/`.
    let off = helm_template(&tools.helm, tools.home(), &[])?;
    assert!(
        !off.iter()
            .any(|d| d["kind"] == "PrometheusRule" || d["metadata"]["name"] == "wasmop-dashboard"),
        "monitoring objects render by default"
    );
    let chart: Vec<Value> = helm_template(
        &tools.helm,
        tools.home(),
        &[
            "monitoring.prometheusRule.enabled=true",
            "monitoring.dashboard.enabled=true",
        ],
    )?
    .into_iter()
    .filter(|d| d["kind"] == "PrometheusRule" || d["metadata"]["name"] == "wasmop-dashboard")
    .collect();
    let chart = by_identity(chart, HELM_LABELS);
    let mut cmd = Command::new(&tools.kubectl);
    cmd.arg("kustomize").arg(repo().join("deploy/monitoring"));
    let kustomized = by_identity(documents(&run(cmd)?)?, &[]);
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        kustomized.keys().collect::<Vec<_>>()
    );
    for (key, object) in &kustomized {
        assert_eq!(
            &chart[key], object,
            "{key} differs between the chart and deploy/monitoring"
        );
    }
    Ok(())
}

#[tokio::test]
async fn helm_lint_passes_with_each_optional_part() -> anyhow::Result<()> {
    let tools = Tools::get().await?;
    for set in [
        vec![],
        vec!["sharding.enabled=true"],
        vec!["metacontroller.enabled=true"],
        vec![
            "webhook.tls.generate=true",
            "networkPolicy.apiServerCIDRs={10.0.0.0/24,fd00::/64}",
        ],
        vec![
            "webhook.tls.certManager.enabled=true",
            "webhook.clientAuth.enabled=true",
            "webhook.clientAuth.names={kube-apiserver}",
        ],
        vec![
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "tracing.otlpEndpoint=http://collector.observability:4318",
            "cache.maxBytes=512Mi",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.dashboard.enabled=true",
        ],
    ] {
        let mut cmd = helm_command(&tools.helm, tools.home());
        cmd.args(["lint", "--strict", "--namespace", "wasmop-system"])
            .arg(chart_dir());
        for value in &set {
            cmd.args(["--set", value]);
        }
        let out = run(cmd)?;
        assert!(
            out.contains("0 chart(s) failed"),
            "helm lint {set:?}:\n{out}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_values_schema_refuses_bad_values() -> anyhow::Result<()> {
    let tools = Tools::get().await?;
    // Each bad value, and a word of the error that names it.
    let bad: &[(&[&str], &str)] = &[
        (&["replicas=-1"], "replicas"),
        (&["--set-string", "replicas=two"], "replicas"),
        (&["replica=3"], "replica"),
        (&["image.digest=latest"], "digest"),
        (&["image.repository="], "repository"),
        (
            &["networkPolicy.apiServerCIDRs={0.0.0.0/0}"],
            "apiServerCIDRs",
        ),
        (
            &["networkPolicy.apiServerCIDRs={10.0.0.1}"],
            "apiServerCIDRs",
        ),
        (&["logFormat=xml"], "logFormat"),
        (&["tracing.protocol=udp"], "protocol"),
        (&["tracing.otlpEndpoint=collector:4317"], "otlpEndpoint"),
        (&["metrics.port=70000"], "port"),
        (&["cache.sizeLimit=lots"], "sizeLimit"),
        (&["shutdownGrace=30"], "shutdownGrace"),
        (&["extraArgs={run}"], "extraArgs"),
        (&["sharding.enabled=yes-please"], "enabled"),
        (&["metacontroller.enable=true"], "enable"),
    ];
    for (args, word) in bad {
        let mut cmd = helm_command(&tools.helm, tools.home());
        cmd.args(["template", "wasmop"])
            .arg(chart_dir())
            .args(["--namespace", "wasmop-system"]);
        match args {
            ["--set-string", value] => cmd.args(["--set-string", value]),
            [value] => cmd.args(["--set", value]),
            _ => anyhow::bail!("a bad-value case is one value: {args:?}"),
        };
        let out = cmd.output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "the schema admitted {args:?}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(word),
            "{args:?} failed, but not on the schema's word {word:?}:\n{stderr}"
        );
    }
    // Both TLS sources at once: a template error, not a silent pick.
    let mut cmd = helm_command(&tools.helm, tools.home());
    cmd.args(["template", "wasmop"]).arg(chart_dir()).args([
        "--set",
        "webhook.tls.generate=true",
        "--set",
        "webhook.tls.certManager.enabled=true",
    ]);
    let out = cmd.output()?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("choose certManager.enabled or generate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// What `deploy`'s image test built and pushed, for the chart's install.
pub struct Built<'a> {
    /// The image's repository in the test registry.
    pub repository: &'a str,
    /// The image's digest (`sha256:...`).
    pub digest: &'a str,
    /// The image's entrypoint, extracted (kwok runs no container: the test runs it).
    pub wasmop: &'a Path,
    /// The example's WasmReconciler, whose module is the signed OCI module `module`.
    pub reconciler: &'a Value,
    /// The module's reference by digest.
    pub module: &'a str,
    /// The registry's pull Secret for the host's namespace.
    pub pull_secret: &'a k8s_openapi::api::core::v1::Secret,
    /// A directory for this part's files.
    pub work: &'a Path,
}

/// The arguments of the installed Deployment that the host process here replaces: where it
/// listens, caches, and finds the webhook's certificate (a pod's, not this machine's).
const PER_POD_ARGS: &[&str] = &[
    "--cache-dir=",
    "--metrics-addr=",
    "--webhook-addr=",
    "--webhook-service=",
    "--webhook-cert-dir=",
    "--log-format=",
];

/// The chart's life on a fresh control plane: `helm install` of the image from the test
/// registry (a module reconciling through the image's binary run with the chart's
/// ServiceAccount and the chart's Deployment arguments), `helm upgrade` to sharding (the
/// Deployment's arguments and replicas change, the generated webhook certificate stays), and
/// `helm uninstall` (nothing of the release stays; the CRD, the WasmReconcilers and the host's
/// runtime records in the namespace do, as docs/operating.md says).
pub async fn install_upgrade_uninstall(built: &Built<'_>) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use wasmop_testenv::{Plane, TestEnv, Turn, eventually};

    let started = std::time::Instant::now();
    let env = TestEnv::with("helm", Plane::Fresh, Turn::Shared).await?;
    let helm = helm_binary().await?;
    let home = built.work.join("helm-home");
    let kubeconfig = env.kubeconfig().to_path_buf();
    let helm_run = |args: &[&str]| {
        let mut cmd = helm_command(&helm, &home);
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
        run(cmd)
    };
    let kubectl_bin = env.cp.assets().kubectl.clone();
    let kubectl = |args: &[&str]| {
        let mut cmd = Command::new(&kubectl_bin);
        cmd.arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .current_dir(repo());
        run(cmd)
    };
    const NS: &str = "wasmop-system";

    // Install: the namespace first (Helm does not own it), then the chart.
    kubectl(&["apply", "-f", "deploy/namespace.yaml"])?;
    helm_run(&[
        "install",
        "wasmop",
        "deploy/helm/wasmop",
        "--namespace",
        NS,
        "--set",
        &format!("image.repository={}", built.repository),
        "--set",
        &format!("image.digest={}", built.digest),
        "--set",
        "webhook.tls.generate=true",
    ])?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    let host = deployments.get("wasmop").await?;
    let container = host
        .spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers[0].clone())
        .ok_or_else(|| anyhow::anyhow!("the chart's Deployment has no container"))?;
    let pinned = format!("{}@{}", built.repository, built.digest);
    assert_eq!(container.image.as_deref(), Some(pinned.as_str()));
    let args = container.args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    // The webhook's certificate Helm generated: a TLS Secret with its CA.
    let tls = secrets.get("wasmop-webhook-tls").await?;
    assert_eq!(tls.type_.as_deref(), Some("kubernetes.io/tls"));
    let cert = |s: &Secret, key: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default()
    };
    let serving = cert(&tls, "tls.crt");
    for key in ["tls.crt", "ca.crt"] {
        assert!(cert(&tls, key).contains("BEGIN CERTIFICATE"), "{key}");
    }
    assert!(cert(&tls, "tls.key").contains("PRIVATE KEY"));
    let running = |count: usize, arg: &'static str| {
        let pods = pods.clone();
        async move {
            eventually(
                &format!("{count} host pods Running with {arg}"),
                WAIT,
                || async {
                    let listed = pods
                        .list(&ListParams::default().labels("app.kubernetes.io/component=host"))
                        .await?
                        .items;
                    let with_arg = listed.iter().filter(|p| {
                        let running =
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                        let args = p
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers[0].args.clone())
                            .unwrap_or_default();
                        running
                            && p.metadata.deletion_timestamp.is_none()
                            && args.iter().any(|a| a == arg)
                    });
                    Ok((with_arg.count() == count && listed.len() == count).then_some(()))
                },
            )
            .await
        }
    };
    running(2, "--leader-elect").await?;

    // A module reconciling: the example's WasmReconciler with the signed OCI module, served by
    // the image's binary with a token of the chart's ServiceAccount and the chart's arguments.
    for file in ["crd.yaml", "rbac.yaml"] {
        kubectl(&["apply", "-f", &format!("examples/image-updater/k8s/{file}")])?;
    }
    secrets
        .patch(
            "e2e-registry",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(built.pull_secret),
        )
        .await?;
    let wr_file = built.work.join("helm-wasmreconciler.json");
    std::fs::write(&wr_file, serde_json::to_vec(built.reconciler)?)?;
    kubectl(&["apply", "-f", &wr_file.display().to_string()])?;
    let token = built.work.join("helm-host.kubeconfig");
    crate::deploy::service_account_kubeconfig(&env, NS, "wasmop", &token).await?;
    let mut host_args = vec!["--log-format".to_string(), "json".to_string()];
    host_args.extend(
        args.iter()
            .filter(|a| !PER_POD_ARGS.iter().any(|p| a.starts_with(p)))
            .cloned(),
    );
    host_args.extend([
        format!("--kubeconfig={}", token.display()),
        format!("--cache-dir={}", built.work.join("helm-cache").display()),
        "--metrics-addr=127.0.0.1:0".into(),
        "--webhook-addr=off".into(),
        format!("--namespace={NS}"),
    ]);
    let mut process =
        wasmop_testenv::HostProcess::start(built.wasmop, host_args, "info", &env.log_dir("host")?)
            .await?;
    let app: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": "from-helm", "namespace": "demo"},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps(&env.client, "demo")
        .create(&PostParams::default(), &app)
        .await?;
    if let Err(e) = crate::deploy::converge(&env, built.module, "from-helm").await {
        anyhow::bail!("{e}\nthe chart's host logged:\n{}", process.log_text());
    }
    // The host's copy of the module, which the uninstall below must leave, is written after the
    // module serves: recorded in the status once it is.
    let reconcilers = kube::Api::<wasmop::crd::WasmReconciler>::all(env.client.clone());
    let name = built.reconciler["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the WasmReconciler has no name"))?;
    eventually("the host's module copy recorded", WAIT, || async {
        let wr = reconcilers.get(name).await?;
        Ok(wr.status.and_then(|s| s.module_copy))
    })
    .await?;
    let status = process
        .terminate(std::time::Duration::from_secs(40))
        .await?;
    assert!(status.success(), "the chart's host exited with {status}");

    // Upgrade: sharding on; the rest of the values kept.
    let generation = |d: &Deployment| d.metadata.generation.unwrap_or_default();
    let before = generation(&deployments.get("wasmop").await?);
    helm_run(&[
        "upgrade",
        "wasmop",
        "deploy/helm/wasmop",
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "sharding.enabled=true",
    ])?;
    let upgraded = deployments.get("wasmop").await?;
    assert!(
        generation(&upgraded) > before,
        "the upgrade left the Deployment as it was"
    );
    assert_eq!(upgraded.spec.replicas, Some(3));
    running(3, "--shards=auto").await?;
    assert_eq!(
        cert(&secrets.get("wasmop-webhook-tls").await?, "tls.crt"),
        serving,
        "the upgrade generated a new webhook certificate"
    );

    // Uninstall: every object of the release goes; what docs/operating.md says stays, stays.
    let manifest = built.work.join("helm-manifest.yaml");
    std::fs::write(
        &manifest,
        helm_run(&["get", "manifest", "wasmop", "--namespace", NS])?,
    )?;
    helm_run(&["uninstall", "wasmop", "--namespace", NS, "--wait"])?;
    let left = kubectl(&[
        "get",
        "-f",
        &manifest.display().to_string(),
        "--ignore-not-found",
        "-o",
        "name",
    ])?;
    assert_eq!(left.trim(), "", "objects of the release left behind");
    let kinds = kubectl(&["api-resources", "--verbs=list", "-o", "name"])?;
    let kinds = kinds.lines().collect::<Vec<_>>().join(",");
    let labelled = kubectl(&[
        "get",
        &kinds,
        "--all-namespaces",
        "-l",
        "app.kubernetes.io/instance=wasmop",
        "-o",
        "name",
    ])?;
    assert_eq!(
        labelled.trim(),
        "",
        "objects labelled with the release left behind"
    );
    eventually("no host pods", WAIT, || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    // What stays: the CRD and its WasmReconcilers, the Namespace, and the host's runtime records
    // in it (the module copy; the Leases); no Secret of the release, Helm's records included.
    kubectl(&["get", "crd", "wasmreconcilers.wasmop.dev"])?;
    kubectl(&["get", "wasmreconciler", "image-updater"])?;
    let names = |list: Vec<String>| list.into_iter().collect::<std::collections::BTreeSet<_>>();
    let configmaps = Api::<ConfigMap>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name);
    assert_eq!(
        names(configmaps.collect()),
        names(vec![
            "kube-root-ca.crt".into(),
            "wasmop-module.image-updater".into()
        ])
    );
    let secret_names = secrets
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name);
    assert_eq!(
        names(secret_names.collect()),
        names(vec!["e2e-registry".into()])
    );
    eprintln!(
        "the chart's install, upgrade and uninstall took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    env.passed()
}
