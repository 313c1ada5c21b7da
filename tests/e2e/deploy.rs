//! The install path, end to end: `kubectl apply -k deploy/` on the real control plane, then the
//! image-updater example installed from its own `k8s/` manifests, reconciled by a host that runs
//! with the deploy's ServiceAccount token (kwok pods run nothing, so the host runs as a process
//! here). This proves the manifests apply and that their least-privilege RBAC is enough.
//!
//! And the image: `make image` (scripts/image.sh, lean profile) builds the host as a static
//! binary and pushes it with crane to a real registry; the test pulls it back, checks it runs as
//! non-root, extracts its entrypoint from the layer and runs it against the cluster with the
//! deploy's ServiceAccount; kustomize's `images:` retargets the Deployment to it.

mod support;

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;
use support::*;
use wasmop::host::{Host, HostOptions};
use wasmop_testenv::{TestEnv, eventually};

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
async fn service_account_kubeconfig(
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

/// Runs the tests of this binary one at a time: each runs a host serving every WasmReconciler
/// and installs the same example.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

#[tokio::test]
async fn deploy_applies_and_its_rbac_is_enough_to_run_an_example() -> anyhow::Result<()> {
    let _serial = serial().await;
    let env = TestEnv::get("deploy").await?;
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
    // Only the webhook and metrics ports are open, each to its own clients.
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), "wasmop-system");
    let policy = policies.get("wasmop").await?.spec.unwrap_or_default();
    assert_eq!(policy.policy_types, Some(vec!["Ingress".to_string()]));
    let ports: Vec<String> = policy
        .ingress
        .unwrap_or_default()
        .iter()
        .flat_map(|r| r.ports.clone().unwrap_or_default())
        .filter_map(|p| match p.port {
            Some(IntOrString::String(name)) => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(ports, ["webhook", "metrics"]);
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
        let available = app.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
            });
        Ok(available.then_some(()))
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
    host.shutdown().await?;
    let _ = std::fs::remove_file(&kubeconfig);
    Ok(())
}

/// `make image` with the image-test profile, pushed to `reference`; returns the reference by
/// digest it printed. The nested cargo reuses the workspace's target directory (cached after the
/// first run) and gets none of this test's cargo environment.
fn make_image(
    reference: &str,
    crane: &Path,
    docker_config: &Path,
    ca: &Path,
) -> anyhow::Result<String> {
    let mut cmd = Command::new("bash");
    cmd.arg("scripts/image.sh")
        .current_dir(repo())
        .env("IMAGE_PROFILE", "image-test")
        .env("IMAGE_PUSH", reference)
        .env("CRANE", crane)
        .env("DOCKER_CONFIG", docker_config)
        .env("SSL_CERT_FILE", ca);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_string();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" || key == "RUSTFLAGS" {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    anyhow::ensure!(
        out.status.success(),
        "make image (scripts/image.sh) failed:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("make image printed no reference"))
}

fn crane(bin: &Path, env: &[(&str, &Path)], args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "crane {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

#[tokio::test]
async fn the_image_from_the_registry_runs_with_the_deploy_service_account() -> anyhow::Result<()> {
    let _serial = serial().await;
    let env = TestEnv::get("deploy-image").await?;
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

    let reference = format!("{}/wasmop/host:e2e", registry.host);
    let pinned = {
        let (reference, crane_bin) = (reference.clone(), crane_bin.clone());
        let (docker_config, ca) = (docker_config.clone(), ca.clone());
        tokio::task::spawn_blocking(move || make_image(&reference, &crane_bin, &docker_config, &ca))
            .await??
    };
    let (repository, digest) = pinned.split_once('@').ok_or_else(|| {
        anyhow::anyhow!("make image printed {pinned:?}, not a reference by digest")
    })?;
    assert_eq!(repository, format!("{}/wasmop/host", registry.host));

    // Pulled back: an empty base plus one layer, non-root, the host as entrypoint.
    let config: serde_json::Value =
        serde_json::from_slice(&crane(&crane_bin, &crane_env, &["config", &pinned])?)?;
    assert_eq!(config["config"]["User"], "65532:65532", "{config}");
    assert_eq!(
        config["config"]["Entrypoint"],
        json!(["/wasmop"]),
        "{config}"
    );
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().map(Vec::len),
        Some(1)
    );
    let fs = work.path().join("fs.tar");
    crane(
        &crane_bin,
        &crane_env,
        &["export", &pinned, &fs.display().to_string()],
    )?;
    let root = work.path().join("root");
    std::fs::create_dir_all(&root)?;
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&fs)
        .arg("-C")
        .arg(&root)
        .output()?;
    anyhow::ensure!(
        untar.status.success(),
        "extracting /wasmop from the image: {}",
        String::from_utf8_lossy(&untar.stderr)
    );
    let entrypoint = root.join("wasmop");
    anyhow::ensure!(
        entrypoint.is_file(),
        "the image has no /wasmop (its entrypoint)"
    );

    // kustomize's images: retargets the Deployment to the image just built.
    let overlay = work.path().join("overlay");
    std::fs::create_dir_all(&overlay)?;
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources:\n- {}\nimages:\n- name: ghcr.io/wasmop/wasmop\n  newName: {repository}\n  digest: {digest}\n",
            repo().join("deploy").display()
        ),
    )?;
    let rendered = kubectl(&env, &["kustomize", &overlay.display().to_string()])?;
    assert!(
        rendered.contains(&format!("image: {pinned}")),
        "the Deployment names the built image:\n{rendered}"
    );

    // The extracted entrypoint runs the example with the deploy's ServiceAccount.
    kubectl(&env, &["apply", "-k", "deploy/"])?;
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
        wasmop_testenv::HostProcess::start(&entrypoint, args, "info", &work.path().join("logs"))
            .await?;
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": "from-image", "namespace": "demo"},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps(&env.client, "demo")
        .create(&PostParams::default(), &app)
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "demo");
    eventually("the image's host reconciles the App", WAIT, || async {
        Ok(deployments.get_opt("from-image").await?)
    })
    .await?;
    host.kill().await?;
    Ok(())
}
