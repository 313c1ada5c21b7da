//! The install path, end to end: `kubectl apply -k deploy/` on the real control plane, then the
//! image-updater example installed from its own `k8s/` manifests, reconciled by a host that runs
//! with the deploy's ServiceAccount token (kwok pods run nothing, so the host runs as a process
//! here). This proves the manifests apply and that their least-privilege RBAC is enough.
//!
//! And the image: `make image`'s script (scripts/image.sh, image-test profile) builds the host
//! as a static musl binary and pushes the image with crane to a real registry (TLS, basic auth);
//! the test pulls it back by digest, checks that it runs as 65532 with one static entrypoint,
//! extracts that entrypoint and, with it, pushes and signs the example's module to the registry
//! and runs the host against the cluster with a token of deploy/'s ServiceAccount until a
//! WasmReconciler and an App converge through that process; kustomize's `images:` retargets
//! deploy/'s Deployment to the image. Then the same image and module through the Helm chart, on
//! a fresh plane (`chart::install_upgrade_uninstall`): install, a module reconciling, upgrade,
//! uninstall.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::*;
use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use wasmop::crd::WasmReconciler;
use wasmop::host::{Host, HostOptions};
use wasmop_testenv::{Plane, TestEnv, Turn, eventually};

fn kubectl(env: &TestEnv, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(&env.cp.assets().kubectl)
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
        .args(args)
        .current_dir(repo())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A kubeconfig for ServiceAccount `ns/name`, with a token from the TokenRequest API.
pub(crate) async fn service_account_kubeconfig(
    env: &TestEnv,
    ns: &str,
    name: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), ns);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }))?;
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("the TokenRequest for {ns}/{name} returned no token"))?;
    let mut config = kube::config::Kubeconfig::read_from(env.kubeconfig())?;
    for auth in &mut config.auth_infos {
        if let Some(info) = auth.auth_info.as_mut() {
            info.client_certificate_data = None;
            info.client_key_data = None;
            info.client_certificate = None;
            info.client_key = None;
            info.token = Some(token.clone().into());
        }
    }
    std::fs::write(path, serde_json::to_vec(&config)?)?;
    Ok(())
}

/// The sources `policy` admits to the port named `name` (number `number`): CIDRs, labelled
/// namespaces or pods, or `every source` (a rule without `from`, or a peer matching all).
fn admitted(policy: &NetworkPolicySpec, name: &str, number: i32) -> Vec<String> {
    let covers = |rule: &NetworkPolicyIngressRule| match rule.ports.as_deref() {
        None | Some([]) => true,
        Some(ports) => ports.iter().any(|p| match &p.port {
            None => true,
            Some(IntOrString::String(n)) => n == name,
            Some(IntOrString::Int(n)) => *n == number,
        }),
    };
    let labels = |s: &Option<LabelSelector>| {
        s.as_ref().map(|s| {
            let labels = s.match_labels.clone().unwrap_or_default();
            let exprs = s.match_expressions.clone().unwrap_or_default();
            if labels.is_empty() && exprs.is_empty() {
                return "every source".to_string();
            }
            let mut text: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            text.extend(exprs.iter().map(|e| format!("{e:?}")));
            text.join(",")
        })
    };
    let mut sources = Vec::new();
    for rule in policy.ingress.iter().flatten().filter(|r| covers(r)) {
        let peers = rule.from.clone().unwrap_or_default();
        if peers.is_empty() {
            sources.push("every source".to_string());
        }
        for peer in peers {
            match (
                &peer.ip_block,
                labels(&peer.namespace_selector),
                labels(&peer.pod_selector),
            ) {
                (Some(b), _, _) => sources.push(match b.except.as_deref() {
                    None | Some([]) => b.cidr.clone(),
                    Some(except) => format!("{} except {}", b.cidr, except.join(",")),
                }),
                (None, Some(ns), Some(pods)) => {
                    sources.push(format!("pods {pods} in namespaces {ns}"))
                }
                (None, Some(ns), None) => sources.push(format!("namespaces {ns}")),
                (None, None, Some(pods)) => sources.push(format!("pods {pods} in wasmop-system")),
                (None, None, None) => sources.push("every source".to_string()),
            }
        }
    }
    sources
}

/// Runs the tests of this suite one at a time: each runs a host serving every WasmReconciler
/// and installs the same example (on the suite's own control plane, `Plane::Own("deploy")`:
/// a host serving every WasmReconciler would serve the other suites' ones too).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

#[tokio::test]
async fn deploy_applies_and_its_rbac_is_enough_to_run_an_example() -> anyhow::Result<()> {
    let _serial = serial().await;
    let env = TestEnv::with("deploy", Plane::Own("deploy"), Turn::Shared).await?;
    // Twice: applying the install again must be a no-op, not an error.
    kubectl(&env, &["apply", "-k", "deploy/"])?;
    let again = kubectl(&env, &["apply", "-k", "deploy/"])?;
    assert!(again.lines().all(|l| l.ends_with("unchanged")), "{again}");

    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "wasmop-system");
    let host = deployments.get("wasmop").await?;
    let spec = host
        .spec
        .template
        .spec
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the host Deployment has no pod spec"))?;
    let container = &spec.containers[0];
    let security = container.security_context.clone().unwrap_or_default();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        spec.security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert!(container.liveness_probe.is_some() && container.readiness_probe.is_some());
    // The Deployment's arguments are ones this `wasmop` accepts.
    let args = container.args.clone().unwrap_or_default();
    let parsed = <wasmop::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("wasmop".to_string()).chain(args.iter().cloned()),
    );
    assert!(
        matches!(&parsed, Ok(cli) if matches!(cli.command, wasmop::cli::Command::Run(_))),
        "the host Deployment's args {args:?} do not parse: {:?}",
        parsed.err().map(|e| e.to_string())
    );
    // What the policy admits, port by port: the webhook port to nobody until the API server's
    // addresses are set (docs/operating.md, "Network policy"), the metrics port to scrapers.
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), "wasmop-system");
    let policy = policies.get("wasmop").await?.spec.unwrap_or_default();
    assert_eq!(policy.policy_types, Some(vec!["Ingress".to_string()]));
    assert_eq!(
        admitted(&policy, "webhook", 9443),
        Vec::<String>::new(),
        "the shipped policy admits these sources to the webhook port"
    );
    assert_eq!(
        admitted(&policy, "metrics", 8080),
        ["namespaces wasmop.dev/scrape-metrics=true"]
    );
    // The documented `apiServerCIDR` patch (kustomization.yaml's comment, uncommented) admits
    // exactly its CIDR to the webhook port and changes nothing else.
    let overlay = tempfile::tempdir()?;
    let patch = api_server_cidr_patch()?;
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources:\n- {}\n{patch}",
            relative_to(overlay.path(), &repo().join("deploy"))?
        ),
    )?;
    let dir = overlay.path().display().to_string();
    let rendered = kubectl(
        &env,
        &["apply", "-k", &dir, "--dry-run=server", "-o", "json"],
    )?;
    let rendered: serde_json::Value = serde_json::from_str(&rendered)?;
    let set = rendered["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == "NetworkPolicy")
        .ok_or_else(|| anyhow::anyhow!("no NetworkPolicy in the overlay"))?;
    let set: NetworkPolicy = serde_json::from_value(set.clone())?;
    let set = set.spec.unwrap_or_default();
    assert_eq!(admitted(&set, "webhook", 9443), ["10.0.0.0/24"]);
    assert_eq!(
        admitted(&set, "metrics", 8080),
        ["namespaces wasmop.dev/scrape-metrics=true"]
    );
    // The shared serving certificate the replicas mount (cert-manager's job in production).
    kubectl(
        &env,
        &[
            "-n",
            "wasmop-system",
            "create",
            "secret",
            "generic",
            "wasmop-webhook-tls",
            "--from-literal=tls.crt=test",
            "--from-literal=tls.key=test",
            "--from-literal=ca.crt=test",
        ],
    )?;
    // The restricted Pod Security level of wasmop-system admits the host's pods (kwok runs them).
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "wasmop-system");
    eventually("two host pods Running", WAIT, || async {
        let running = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=host"))
            .await?
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        Ok((running == 2).then_some(()))
    })
    .await?;

    // The example, installed the way its README says.
    for file in ["crd.yaml", "rbac.yaml", "wasmreconciler.yaml"] {
        kubectl(
            &env,
            &["apply", "-f", &format!("examples/image-updater/k8s/{file}")],
        )?;
    }
    push_module(
        &env.client,
        "demo",
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
    )
    .await?;
    let kubeconfig = std::env::temp_dir().join(format!(
        "wasmop-e2e-deploy-{}.kubeconfig",
        std::process::id()
    ));
    service_account_kubeconfig(&env, "wasmop-system", "wasmop", &kubeconfig).await?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let host = Host::start(HostOptions {
        kubeconfig: Some(kubeconfig.clone()),
        instance: "e2e-deploy".into(),
        ..HostOptions::default()
    })
    .await?;
    kubectl(
        &env,
        &["apply", "-f", "examples/image-updater/k8s/app.yaml"],
    )?;
    let app_name = "web";
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "demo");
    let services: Api<Service> = Api::namespaced(env.client.clone(), "demo");
    eventually("the App's Deployment and Service", WAIT, || async {
        Ok(
            match (
                deployments.get_opt(app_name).await?,
                services.get_opt(app_name).await?,
            ) {
                (Some(d), Some(_)) => Some(d),
                _ => None,
            },
        )
    })
    .await?;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.wasmop.dev", "v1", "App"),
        "apps",
    );
    let apps: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), "demo", &ar);
    eventually("the App Available", WAIT, || async {
        let app = apps.get(app_name).await?;
        Ok(available(&app).then_some(()))
    })
    .await?;
    // The writes were the module's: the host's own identity may not write Deployments at all.
    let can_i = Command::new(&env.cp.assets().kubectl)
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
        .args(["auth", "can-i", "create", "deployments", "-n", "demo"])
        .args(["--as", "system:serviceaccount:wasmop-system:wasmop"])
        .output()?;
    assert_eq!(String::from_utf8_lossy(&can_i.stdout).trim(), "no");
    // What the leader writes for admission (no test here serves webhooks from a pod, so no
    // write proves it): the validating webhooks, and the finalizer policy or webhook.
    for resource in [
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
    ] {
        for verb in ["create", "patch", "delete"] {
            let can_i = Command::new(&env.cp.assets().kubectl)
                .arg("--kubeconfig")
                .arg(env.kubeconfig())
                .args([
                    "auth",
                    "can-i",
                    verb,
                    &format!("{resource}.admissionregistration.k8s.io"),
                ])
                .args(["--as", "system:serviceaccount:wasmop-system:wasmop"])
                .output()?;
            assert_eq!(
                String::from_utf8_lossy(&can_i.stdout).trim(),
                "yes",
                "deploy/ lets the host {verb} {resource}"
            );
        }
    }
    host.shutdown().await?;
    let _ = std::fs::remove_file(&kubeconfig);
    env.passed()
}

/// Where the deploy test's static musl build of the host goes: a target directory of its own
/// in the cache of the control-plane binaries (`~/.cache/wasmop/image-target`), not the
/// workspace's. A full musl build of the host (wasmtime, Cranelift, aws-lc for the musl target)
/// takes many minutes on 2 cores; kept there, it survives `cargo clean` and fresh clones (CI
/// clones afresh for every run), and cargo's own fingerprints decide what is stale: the
/// dependencies by their version and features, the workspace's crates by their sources (on a
/// fresh clone only those rebuild). The test still runs `make image`'s script, which still
/// builds the binary it pushes.
fn image_target_dir() -> std::path::PathBuf {
    wasmop_testenv::assets::cache_dir().join("image-target")
}

/// `make image`'s script with the image-test profile, pushing to `reference` with crane's
/// credentials (`docker_config`) and trust (`ca`); returns the reference by digest it printed.
/// Its progress (the musl build takes minutes the first time) goes to this test's stderr.
fn make_image(
    reference: &str,
    crane: &Path,
    docker_config: &Path,
    ca: &Path,
) -> anyhow::Result<String> {
    let mut cmd = Command::new("bash");
    cmd.arg("scripts/image.sh")
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", image_target_dir())
        .env("IMAGE_PROFILE", "image-test")
        .env("IMAGE_PUSH", reference)
        .env("CRANE", crane)
        .env("DOCKER_CONFIG", docker_config)
        .env("SSL_CERT_FILE", ca)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    // The script runs cargo: without this test's package variables, which would rebuild ring.
    for name in wasmop_testenv::cargo::per_package_variables() {
        cmd.env_remove(name);
    }
    // Nor `make test`'s clippy wrapper (scripts/test-run.sh): the musl build is `make image`'s,
    // with plain rustc, in a target directory kept across runs and clones.
    cmd.env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS");
    let out = cmd.output().context("running scripts/image.sh")?;
    anyhow::ensure!(
        out.status.success(),
        "make image (scripts/image.sh) failed ({}); its output is above",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("make image printed no reference"))
}

/// Runs crane with `env`; returns its stdout.
fn crane(bin: &Path, env: &[(&str, &Path)], args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "crane {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Fails unless `path` is a statically linked x86-64 ELF executable: program headers but no
/// program interpreter, and no shared libraries (readelf, from binutils).
fn ensure_static(path: &Path) -> anyhow::Result<()> {
    let readelf = |flag: &str| -> anyhow::Result<String> {
        let out = Command::new("readelf")
            .arg(flag)
            .arg(path)
            .output()
            .context("running readelf (binutils)")?;
        anyhow::ensure!(
            out.status.success(),
            "readelf {flag} {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let header = readelf("-hW")?;
    anyhow::ensure!(
        header.contains("Advanced Micro Devices X86-64"),
        "{} is not an x86-64 executable:\n{header}",
        path.display()
    );
    let program = readelf("-lW")?;
    anyhow::ensure!(
        program.contains("LOAD") && !program.contains("Requesting program interpreter"),
        "{} is not static (it names a program interpreter):\n{program}",
        path.display()
    );
    let dynamic = readelf("-dW")?;
    anyhow::ensure!(
        !dynamic.contains("(NEEDED)"),
        "{} needs shared libraries:\n{dynamic}",
        path.display()
    );
    Ok(())
}

/// The image's file system, flattened (`crane export`) and extracted into `root`.
fn extract(
    crane_bin: &Path,
    env: &[(&str, &Path)],
    pinned: &str,
    root: &Path,
) -> anyhow::Result<()> {
    let fs = root.with_extension("tar");
    crane(
        crane_bin,
        env,
        &["export", pinned, &fs.display().to_string()],
    )?;
    std::fs::create_dir_all(root)?;
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&fs)
        .arg("-C")
        .arg(root)
        .output()
        .context("running tar")?;
    anyhow::ensure!(
        untar.status.success(),
        "extracting the image's file system: {}",
        String::from_utf8_lossy(&untar.stderr)
    );
    Ok(())
}

/// `wasmop push MODULE --oci REFERENCE --sign KEY` with the image's own binary `wasmop`: a
/// component compiled, TLS to the registry, a cosign signature made (aws-lc-rs) in the static
/// build. Returns the reference by digest it printed.
fn push_signed_module(
    wasmop: &Path,
    registry: &wasmop_testenv::Registry,
    reference: &str,
    ca: &Path,
    key: &Path,
    cache: &Path,
) -> anyhow::Result<String> {
    let out = Command::new(wasmop)
        .args([
            "push",
            wasmop_test_modules::IMAGE_UPDATER,
            "--oci",
            reference,
        ])
        .args(["--registry-username", &registry.username])
        .args(["--registry-password", &registry.password])
        .arg("--ca-bundle")
        .arg(ca)
        .arg("--sign")
        .arg(key)
        .env("WASMOP_CACHE", cache)
        .env_remove("COSIGN_PASSWORD")
        .output()
        .with_context(|| format!("running {} push", wasmop.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "the image's wasmop push --oci --sign failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("wasmop push printed no reference"))
}

#[tokio::test]
async fn the_image_from_the_registry_runs_with_the_deploy_service_account_and_the_helm_chart()
-> anyhow::Result<()> {
    let _serial = serial().await;
    let registry = wasmop_testenv::Registry::start().await?;
    let crane_bin = tokio::task::spawn_blocking(wasmop_testenv::assets::crane_binary).await??;
    let work = tempfile::tempdir()?;
    // crane's credentials (a Docker config) and trust (SSL_CERT_FILE) for the test registry.
    let docker_config = work.path().join("docker");
    std::fs::create_dir_all(&docker_config)?;
    std::fs::write(
        docker_config.join("config.json"),
        registry.docker_config_json(&registry.password),
    )?;
    let ca = work.path().join("registry-ca.pem");
    std::fs::write(&ca, &registry.ca_pem)?;
    let crane_env = [
        ("DOCKER_CONFIG", docker_config.as_path()),
        ("SSL_CERT_FILE", ca.as_path()),
    ];

    // Built by `make image`'s script and pushed to the registry.
    let repository = format!("{}/wasmop/host", registry.host);
    let pinned = {
        let reference = format!("{repository}:e2e");
        let (crane_bin, docker_config, ca) = (crane_bin.clone(), docker_config.clone(), ca.clone());
        tokio::task::spawn_blocking(move || make_image(&reference, &crane_bin, &docker_config, &ca))
            .await??
    };
    let digest = pinned
        .strip_prefix(&format!("{repository}@"))
        .filter(|d| d.starts_with("sha256:"))
        .ok_or_else(|| {
            anyhow::anyhow!("make image printed {pinned:?}, not {repository}@sha256:...")
        })?;

    // Pulled back by digest: one layer on an empty base, non-root, the host as entrypoint.
    let config: serde_json::Value =
        serde_json::from_slice(&crane(&crane_bin, &crane_env, &["config", &pinned])?)?;
    assert_eq!(config["config"]["User"], "65532:65532", "{config}");
    assert_eq!(config["os"], "linux", "{config}");
    assert_eq!(config["architecture"], "amd64", "{config}");
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().map(Vec::len),
        Some(1),
        "{config}"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&crane(&crane_bin, &crane_env, &["manifest", &pinned])?)?;
    eprintln!(
        "the host image: {pinned}, layer {} bytes compressed",
        manifest["layers"][0]["size"]
    );
    let root = work.path().join("root");
    extract(&crane_bin, &crane_env, &pinned, &root)?;
    let entrypoint = match config["config"]["Entrypoint"].as_array().map(Vec::as_slice) {
        Some([serde_json::Value::String(path)]) => path.clone(),
        _ => anyhow::bail!("the image's entrypoint is not one absolute path: {config}"),
    };
    let wasmop = root.join(entrypoint.strip_prefix('/').ok_or_else(|| {
        anyhow::anyhow!("the image's entrypoint {entrypoint:?} is not an absolute path")
    })?);
    anyhow::ensure!(
        wasmop.is_file(),
        "the image has no {entrypoint} (its entrypoint)"
    );
    ensure_static(&wasmop)?;
    let passwd = std::fs::read_to_string(root.join("etc/passwd"))?;
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt"))?;
    assert!(bundle.contains("-----BEGIN CERTIFICATE-----"));

    // kustomize's images: retargets deploy/'s Deployment to the image just built.
    let overlay = work.path().join("overlay");
    std::fs::create_dir_all(&overlay)?;
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources:\n- {}\nimages:\n- name: ghcr.io/wasmop/wasmop\n  newName: {repository}\n  digest: {digest}\n",
            relative_to(&overlay, &repo().join("deploy"))?
        ),
    )?;
    let env = TestEnv::with("deploy-image", Plane::Own("deploy"), Turn::Shared).await?;
    let rendered = kubectl(&env, &["kustomize", &overlay.display().to_string()])?;
    assert!(
        rendered.contains(&format!("image: {pinned}\n")),
        "the Deployment names the built image:\n{rendered}"
    );

    // The install and the example, its module pushed and signed by the image's binary.
    kubectl(&env, &["apply", "-k", "deploy/"])?;
    for file in ["crd.yaml", "rbac.yaml"] {
        kubectl(
            &env,
            &["apply", "-f", &format!("examples/image-updater/k8s/{file}")],
        )?;
    }
    let key = rcgen::KeyPair::generate()?;
    let key_file = work.path().join("cosign.key");
    std::fs::write(&key_file, key.serialize_pem())?;
    let module = push_signed_module(
        &wasmop,
        &registry,
        &format!("{}/wasmop/image-updater:e2e", registry.host),
        &ca,
        &key_file,
        &work.path().join("push-cache"),
    )?;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "e2e-registry", "namespace": "wasmop-system"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": registry.docker_config_json(&registry.password)},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), "wasmop-system")
        .patch(
            "e2e-registry",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    let mut wr = example("image-updater", "wasmreconciler.yaml")?.remove(0);
    wr["spec"]["module"] = json!({"oci": {
        "reference": module,
        "pullSecret": "e2e-registry",
        "caBundle": registry.ca_pem,
        "verify": {"key": key.public_key_pem()},
    }});
    let wr_file = work.path().join("wasmreconciler.json");
    std::fs::write(&wr_file, serde_json::to_vec(&wr)?)?;
    kubectl(&env, &["apply", "-f", &wr_file.display().to_string()])?;

    // The image's entrypoint, run with a token of deploy/'s ServiceAccount.
    let kubeconfig = work.path().join("host.kubeconfig");
    service_account_kubeconfig(&env, "wasmop-system", "wasmop", &kubeconfig).await?;
    let args: Vec<String> = [
        "--log-format",
        "json",
        "run",
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "off",
        "--namespace",
        "wasmop-system",
    ]
    .into_iter()
    .map(String::from)
    .chain([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cache-dir={}", work.path().join("cache").display()),
    ])
    .collect();
    let mut host =
        wasmop_testenv::HostProcess::start(&wasmop, args, "info", &env.log_dir("host")?).await?;
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": "from-image", "namespace": "demo"},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps(&env.client, "demo")
        .create(&PostParams::default(), &app)
        .await?;
    let converged = converge(&env, &module, "from-image").await;
    if let Err(e) = converged {
        anyhow::bail!("{e}\nthe image's host logged:\n{}", host.log_text());
    }
    let reconciles = host
        .sample(r#"wasmop_reconcile_total{reconciler="image-updater",result="ok"}"#)
        .await?;
    assert!(
        reconciles.is_some_and(|n| n >= 1.0),
        "the image's host counted no reconcile: {reconciles:?}"
    );
    let status = host.terminate(std::time::Duration::from_secs(40)).await?;
    assert!(status.success(), "the image's host exited with {status}");
    env.passed()?;

    // The same image and module, installed with the Helm chart on a control plane of its own.
    crate::chart::install_upgrade_uninstall(&crate::chart::Built {
        repository: &repository,
        digest,
        wasmop: &wasmop,
        reconciler: &wr,
        module: &module,
        pull_secret: &secret,
        work: work.path(),
    })
    .await
}

/// Waits until WasmReconciler image-updater is Ready with the OCI module `module` active
/// (verified against the key, pulled) and App demo/`app` is Available with its Deployment.
pub(crate) async fn converge(env: &TestEnv, module: &str, app: &str) -> anyhow::Result<()> {
    let reconcilers: Api<WasmReconciler> = Api::all(env.client.clone());
    eventually(
        "image-updater Ready with the signed OCI module",
        WAIT,
        || async {
            let Some(status) = reconcilers.get("image-updater").await?.status else {
                return Ok(None);
            };
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let origin = status.active_module.and_then(|a| a.origin);
            Ok(
                (ready && origin.as_deref() == Some(format!("oci {module}").as_str()))
                    .then_some(()),
            )
        },
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "demo");
    eventually(&format!("App {app}'s Deployment"), WAIT, || async {
        Ok(deployments.get_opt(app).await?)
    })
    .await?;
    eventually(&format!("App {app} Available"), WAIT, || async {
        let app = apps(&env.client, "demo").get(app).await?;
        Ok(available(&app).then_some(()))
    })
    .await
}

/// Whether an App's status says `Available=True`.
fn available(app: &DynamicObject) -> bool {
    app.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Available" && c["status"] == "True")
        })
}
