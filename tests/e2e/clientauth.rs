//! The webhook authenticates the API server, on the real local control plane: with
//! `--webhook-client-ca`, a `wasmop run` process judges the reviews the API server sends (its
//! admission configuration presents the test PKI's webhook client certificate, see
//! `wasmop_testenv::controlplane`), while a client that connects to the webhook port directly
//! without a certificate, or with the cluster admin's (signed by the cluster's CA, not the
//! webhook client CA), fails the TLS handshake and gets no verdict; the host stays healthy and
//! ready, and counts the refused handshakes.
//!
//! And deploy/'s `webhook-client-auth` Component: rendered over deploy/, the host's arguments
//! parse and name the CA file inside the ConfigMap it mounts.
//!
//! Runs on the shared control plane: its API server presents the certificate only to webhooks
//! that ask for one, so the other tests' hosts see no difference.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::support::*;
use anyhow::Context;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DynamicObject, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wasmop_testenv::pki::WEBHOOK_CLIENT_NAME;
use wasmop_testenv::{HostProcess, TestEnv, eventually};

/// What the module's `validate` says of an image with a space.
const BAD_IMAGE: &str = "spec.image must be a container image reference";

fn app(name: &str, image: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": image, "replicas": 1, "port": 8080}
    }))?)
}

/// A host process serving `env`'s WasmReconcilers, its webhook on loopback accepting only the
/// API server's webhook client certificate.
async fn host(env: &TestEnv) -> anyhow::Result<HostProcess> {
    let bin = wasmop_binary().await?;
    let cache = env.log_dir("cache")?;
    let pki = env.cp.pki();
    let args = [
        "--log-format",
        "json",
        "run",
        "--kubeconfig",
        &env.kubeconfig().display().to_string(),
        "--cache-dir",
        &cache.display().to_string(),
        "--selector",
        &format!("wasmop.dev/test={}", env.namespace),
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "127.0.0.1:0",
        "--webhook-client-ca",
        &pki.webhook_client_ca.display().to_string(),
        "--webhook-client-name",
        WEBHOOK_CLIENT_NAME,
    ]
    .map(str::to_string)
    .to_vec();
    HostProcess::start(bin, args, "info", &env.log_dir("hosts")?).await
}

/// A client certificate and key, read from PEM files.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn identity(cert: &Path, key: &Path) -> anyhow::Result<Identity> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()?;
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    Ok((chain, key))
}

/// POSTs a CREATE review of `app` for reconciler `wr` straight to the webhook at `addr`,
/// trusting `ca_bundle` and presenting `client` (or no certificate): the AdmissionReview
/// answered, or the error that kept it from being answered.
async fn review_directly(
    addr: SocketAddr,
    ca_bundle: &[u8],
    client: Option<Identity>,
    wr: &str,
    app: &DynamicObject,
) -> anyhow::Result<Value> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_bundle) {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let config = match client {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-direct",
            "kind": {"group": "example.wasmop.dev", "version": "v1", "kind": "App"},
            "resource": {"group": "example.wasmop.dev", "version": "v1", "resource": "apps"},
            "name": app.metadata.name, "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": app,
        }
    }))?;
    let exchange = async {
        let tcp = TcpStream::connect(addr).await?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let mut tls = connector
            .connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp)
            .await
            .context("TLS handshake")?;
        let head = format!(
            "POST /validate/{wr} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(&body).await?;
        tls.flush().await?;
        let mut response = Vec::new();
        tls.read_to_end(&mut response)
            .await
            .context("reading the answer")?;
        Ok::<_, anyhow::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(WAIT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {WAIT:?}"))??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer: {response:?}"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "answered {head:?}");
    Ok(serde_json::from_str(body)?)
}

fn handshakes_refused() -> String {
    "wasmop_server_rejected_total{server=\"admission\",reason=\"handshake\"}".to_string()
}

#[tokio::test]
async fn with_a_client_ca_only_the_api_server_gets_verdicts() -> anyhow::Result<()> {
    let began = Instant::now();
    let env = TestEnv::get("clientauth").await?;
    let (wr, _) = image_updater(
        &env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"admission": {"timeoutSeconds": 5, "failurePolicy": "Fail"}}),
    )
    .await?;
    let host = host(&env).await?;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let config = eventually("the ValidatingWebhookConfiguration", WAIT, || async {
        Ok(vwcs.get_opt(&format!("wasmop-{wr}")).await?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    let client_config = config
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .map(|w| w.client_config)
        .ok_or_else(|| anyhow::anyhow!("the configuration has no webhook"))?;
    let url: http::Uri = client_config.url.unwrap_or_default().parse()?;
    let addr: SocketAddr = url
        .authority()
        .ok_or_else(|| anyhow::anyhow!("the webhook URL {url} has no host"))?
        .as_str()
        .parse()?;
    let ca_bundle = client_config
        .ca_bundle
        .ok_or_else(|| anyhow::anyhow!("the webhook has no caBundle"))?
        .0;

    // (a) The API server's reviews are judged by the module: a bad create is denied with the
    // module's message (a dry run, until the API server uses the new configuration), a good one
    // admitted. Under `failurePolicy: Fail`, a refused handshake would deny every create with
    // the API server's own "failed calling webhook" instead.
    let apps = apps(&env.client, &env.namespace);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let refusal = eventually("a create with a bad image refused", WAIT, || async {
        Ok(match apps.create(&dry, &app("bad", "nginx 1.27")?).await {
            Ok(_) => None,
            Err(kube::Error::Api(s)) => Some(s),
            Err(e) => return Err(e.into()),
        })
    })
    .await?;
    assert!(
        refusal.message.contains(BAD_IMAGE),
        "the module's verdict, through the API server's authenticated call: {refusal:?}\nhost log:\n{}",
        host.log_text()
    );
    apps.create(&PostParams::default(), &app("web", "nginx:1.27")?)
        .await
        .context("a good create is admitted")?;

    // (b) Direct clients. The same request with the API server's own certificate is judged (so
    // the client below can get a verdict); without a certificate, or with the cluster admin's,
    // it gets none.
    let pki = env.cp.pki();
    let refused_before = host.sample(&handshakes_refused()).await?.unwrap_or(0.0);
    let bad = app("direct", "nginx 1.27")?;
    let apiserver = identity(&pki.webhook_client_cert, &pki.webhook_client_key)?;
    let verdict = review_directly(addr, &ca_bundle, Some(apiserver), &wr, &bad).await?;
    assert_eq!(verdict["response"]["allowed"], false, "{verdict}");
    assert!(
        verdict["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(BAD_IMAGE)),
        "{verdict}"
    );
    let admin = identity(&pki.admin_cert, &pki.admin_key)?;
    for (who, client) in [("no certificate", None), ("the admin's", Some(admin))] {
        let answer = review_directly(addr, &ca_bundle, client, &wr, &bad).await;
        match answer {
            Err(e) => println!("a client with {who} gets no verdict: {e:#}"),
            Ok(verdict) => panic!("a client with {who} got a verdict: {verdict}"),
        }
    }
    eventually("the refused handshakes counted", WAIT, || async {
        let refused = host.sample(&handshakes_refused()).await?.unwrap_or(0.0);
        Ok((refused >= refused_before + 2.0).then_some(()))
    })
    .await?;

    // (c) The host stays healthy and ready, and keeps judging the API server's reviews.
    assert_eq!(host.readyz().await?.0, 200);
    let (status, _) =
        wasmop_testenv::host_process::http_get(host.metrics_addr(), "/healthz").await?;
    assert_eq!(status, 200);
    match apps.create(&dry, &app("bad", "nginx 1.27")?).await {
        Err(kube::Error::Api(s)) if s.message.contains(BAD_IMAGE) => {}
        other => anyhow::bail!("the module judges after the refused clients: {other:?}"),
    }
    println!(
        "the client-certificate test took {:.1}s",
        began.elapsed().as_secs_f64()
    );
    env.passed()
}

/// The rendered objects of deploy/ with the `webhook-client-auth` Component.
fn render_with_component(env: &TestEnv) -> anyhow::Result<Vec<Value>> {
    let overlay = tempfile::tempdir()?;
    let deploy = repo().join("deploy");
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources:\n- {}\ncomponents:\n- {}\n",
            relative_to(overlay.path(), &deploy)?,
            relative_to(
                overlay.path(),
                &deploy.join("components/webhook-client-auth")
            )?
        ),
    )?;
    let out = std::process::Command::new(&env.cp.assets().kubectl)
        .arg("kustomize")
        .arg(overlay.path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, text)?;
    yaml_docs(&file)
}

#[tokio::test]
async fn the_deploy_component_requires_the_api_servers_certificate() -> anyhow::Result<()> {
    let env = TestEnv::get("clientauth-deploy").await?;
    let objects = render_with_component(&env)?;
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .ok_or_else(|| anyhow::anyhow!("no Deployment rendered"))?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<String> = serde_json::from_value(container["args"].clone())?;
    // The arguments are `wasmop run`'s, flags and all.
    let argv = std::iter::once("wasmop".to_string()).chain(args.iter().cloned());
    <wasmop::cli::Cli as clap::Parser>::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("the rendered args do not parse: {e}\n{args:?}"))?;
    let ca = args
        .iter()
        .find_map(|a| a.strip_prefix("--webhook-client-ca="))
        .ok_or_else(|| anyhow::anyhow!("no --webhook-client-ca in {args:?}"))?;
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == "webhook-client-ca")
        .ok_or_else(|| anyhow::anyhow!("no webhook-client-ca mount"))?;
    let mount_path = mount["mountPath"].as_str().unwrap_or_default();
    let key = Path::new(ca)
        .strip_prefix(mount_path)
        .map_err(|_| anyhow::anyhow!("{ca} is not under the mount {mount_path}"))?;
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "webhook-client-ca")
        .ok_or_else(|| anyhow::anyhow!("no webhook-client-ca volume"))?;
    assert_eq!(volume["configMap"]["name"], "wasmop-webhook-client-ca");
    assert_eq!(key, Path::new("ca.crt"));
    env.passed()
}
